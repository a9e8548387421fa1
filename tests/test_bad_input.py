"""Bad input gets one line naming the option, exit code 2, and no traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_locust


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line_error(done, *fragments: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("tailgate: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--rates", "-1"], ["--rates", "positive"]),
        (["--rates", "0"], ["--rates"]),
        (["--rates", "fast"], ["--rates", "not a number"]),
        (["--n", "0"], ["--n"]),
        (["--n", "10", "--warmup", "25"], ["--n", "warm-up"]),
        (["--request-timeout", "0"], ["--request-timeout"]),
        (["--max-in-flight", "-3"], ["--max-in-flight"]),
        (["--metrics-url", "not a url"], ["--metrics-url"]),
    ],
)
def test_continuous_option_errors(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    done = run_locust("continuous.py", f"http://127.0.0.1:{closed_port()}", tmp_path / "r", *args, timeout=60)
    assert_one_line_error(done, *fragments)


def test_batch_size_zero(tmp_path: Path) -> None:
    done = run_locust("gated.py", "http://127.0.0.1:1", tmp_path / "r", "--batch-size", "0", timeout=60)
    assert_one_line_error(done, "--batch-size")


def test_malformed_host(tmp_path: Path) -> None:
    done = run_locust("continuous.py", "ftp//nowhere", tmp_path / "r", timeout=60)
    assert_one_line_error(done, "--host")


def test_unreachable_server_at_start(tmp_path: Path) -> None:
    done = run_locust("continuous.py", f"http://127.0.0.1:{closed_port()}", tmp_path / "r", timeout=60)
    assert_one_line_error(done, "--host", "cannot reach")


@pytest.mark.parametrize(
    "content, fragment", [(None, "does not exist"), ("{oops\n", "not valid JSON"), ("", "no items")]
)
def test_trace_file_errors(tmp_path: Path, content: str | None, fragment: str) -> None:
    trace = tmp_path / "trace.jsonl"
    if content is not None:
        trace.write_text(content)
    done = run_locust("continuous.py", "http://127.0.0.1:1", tmp_path / "r", "--trace-file", str(trace), timeout=60)
    assert_one_line_error(done, "--trace-file", fragment)


def test_results_dir_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    done = run_locust("continuous.py", "http://127.0.0.1:1", target, timeout=60)
    assert_one_line_error(done, "--results-dir", "not a folder")


def test_unwritable_results_dir(tmp_path: Path) -> None:
    # /proc refuses new folders even to root, unlike a chmod-ed directory
    done = run_locust("continuous.py", "http://127.0.0.1:1", Path("/proc/tailgate-results"), timeout=60)
    assert_one_line_error(done, "--results-dir", "not writable")


def test_repeated_rate_is_refused(tmp_path: Path) -> None:
    """Stages are named by their rate: ``20,20`` would overwrite the first stage's files with the second's."""
    done = run_locust("continuous.py", f"http://127.0.0.1:{closed_port()}", tmp_path / "r", "--rates", "5,20,20",
                      timeout=60)  # fmt: skip
    assert_one_line_error(done, "--rates", "20 req/s appears twice")
    assert not (tmp_path / "r").exists()


class _OddServer:
    """A port that answers with an SSH banner, or /v1/models with JSON that lists no models."""

    def __init__(self, reply: bytes) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if not self.reply.startswith(b"SSH-"):
                    conn.recv(65536)
                conn.sendall(self.reply)


def _json_reply(body: bytes) -> bytes:
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


@pytest.mark.parametrize(
    "reply, fragment",
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "does not speak HTTP"),
        (_json_reply(b"[]"), "did not list models"),
        (_json_reply(b'{"data": null}'), "did not list models"),
    ],
    ids=["ssh-banner", "list", "data-null"],
)
def test_bad_host_is_one_line_and_leaves_no_folder(tmp_path: Path, reply: bytes, fragment: str) -> None:
    server = _OddServer(reply)
    done = run_locust("continuous.py", f"http://127.0.0.1:{server.port}", tmp_path / "r", timeout=60)
    server.sock.close()
    assert_one_line_error(done, "--host", fragment)
    assert not (tmp_path / "r").exists()


def test_unterminated_ipv6_host(tmp_path: Path) -> None:
    done = run_locust("continuous.py", "http://[::1", tmp_path / "r", timeout=60)
    assert_one_line_error(done, "--host", "not a valid URL")
    assert not (tmp_path / "r").exists()


def test_an_abbreviated_option_is_refused_not_taken_for_another(tmp_path: Path) -> None:
    """``--rate 2`` would have run the default ramp's ``--rates``-prefix match; it is refused instead."""
    done = run_locust("continuous.py", f"http://127.0.0.1:{closed_port()}", tmp_path / "r", "--rate", "2",
                      timeout=60)  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "unrecognized arguments: --rate" in errors[0], errors[0]
    assert "Traceback" not in done.stderr and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["suite", "--embedded", "--rate", "2"],
        ["suite", "--embedded", "--prefix", "8"],
        ["trace", "--out", "x.jsonl", "--see", "3"],
        ["report", "results", "--prom", "http://127.0.0.1:9090"],
        ["selfcheck", "--rat", "2"],
    ],
    ids=["suite-rate", "suite-prefix", "trace", "report", "selfcheck"],
)
def test_the_tailgate_commands_refuse_abbreviations(tmp_path: Path, argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "tailgate.cli", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stdout[-1000:], done.stderr[-1000:])
    (line,) = done.stderr.splitlines()
    assert "error:" in line and "unrecognized arguments" in line and argv[-2] in line, line


def test_tailgate_locust_lists_the_suite_options_in_its_help() -> None:
    """Plain ``locust --help`` is printed before the locustfile (and the suite's options) load."""
    done = subprocess.run([sys.executable, "-m", "tailgate.cli", "locust", "-f", "locustfiles/continuous.py",
                           "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for flag in ("--rates", "--batch-size", "--allow-host", "--web-credentials", "--prompts", "--on-worker-loss"):
        assert flag in done.stdout, flag
    assert "Defaults to 127.0.0.1" in " ".join(done.stdout.split())  # --web-host, as the suite's locustfiles set it


@pytest.mark.parametrize("locustfile", ["locustfiles/nonexistent.py", "README.md"])
def test_tailgate_locust_names_a_missing_locustfile_in_one_line(tmp_path: Path, locustfile: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tailgate.cli", "locust", "-f", locustfile, "--headless"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert_one_line_error(done, "-f:", locustfile, "locustfiles/continuous.py")
