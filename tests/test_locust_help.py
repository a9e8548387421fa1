"""``locust -f <a suite locustfile> --help`` lists the suite's options; other locustfiles' help is Locust's own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from tailgate.locusthelp import PTH_LINE, PTH_NAME, locustfile_named, missing_suite_locustfile, wants_suite_help

LOCUST = str(Path(sys.executable).parent / "locust")


def _help(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOCUST, *args, "--help"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_setup_left_the_one_line_that_declares_the_options_at_help_time() -> None:
    import sysconfig

    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    assert pth.read_text() == PTH_LINE, "scripts/setup-base.sh writes it"


@pytest.mark.parametrize("locustfile", ["continuous.py", "gated.py"])
def test_a_suite_locustfiles_help_lists_its_options_once(locustfile: str, tmp_path: Path) -> None:
    done = _help("-f", str(ROOT / "locustfiles" / locustfile), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for option in ("--trace-file", "--rates", "--batch-size", "--record-chunks"):
        assert sum(line.lstrip().startswith(option + " ") for line in lines) == 1, option
    assert "--web-host" in done.stdout  # Locust's own are all still there
    assert "Traceback" not in done.stderr


def test_another_locustfiles_help_is_locusts_own(tmp_path: Path) -> None:
    other = tmp_path / "mine.py"
    other.write_text(
        "from locust import HttpUser, task\n\nclass U(HttpUser):\n    @task\n    def t(self):\n        pass\n"
    )
    done = _help("-f", str(other), cwd=tmp_path)
    assert done.returncode == 0 and "--web-host" in done.stdout
    assert "--trace-file" not in done.stdout


def test_the_locustfile_is_found_in_every_spelling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCUST_LOCUSTFILE", raising=False)
    suite = str(ROOT / "locustfiles" / "continuous.py")
    for argv in (["-f", suite], [f"--locustfile={suite}"], ["--locustfile", suite], [f"-f{suite}"]):
        assert locustfile_named(argv) == suite
        assert wants_suite_help(["locust", *argv, "-h"]) and not wants_suite_help(["locust", *argv])
    assert locustfile_named(["--headless"]) is None
    monkeypatch.setenv("LOCUST_LOCUSTFILE", suite)
    assert wants_suite_help(["locust", "--help"])


def test_a_misspelt_suite_locustfile_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([LOCUST, "-f", "locustfiles/continous.py", "--headless"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no locustfile locustfiles/continous.py" in done.stderr
    assert "continuous.py" in done.stderr and "gated.py" in done.stderr
    # elsewhere a missing locustfile is Locust's to report
    assert missing_suite_locustfile(["locust", "-f", str(tmp_path / "nope.py")]) is None
    assert missing_suite_locustfile(["locust", "-f", f"{ROOT}/locustfiles/gated.py,{ROOT}/locustfiles/x.py"])
