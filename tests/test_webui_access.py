"""The web UI is no open load relay: loopback by default, a login wherever others can reach it, and a start form
that loads only the servers allowed at launch. Driven in a headless Chromium, as a person (or a stranger) would.

Every Locust here listens on a free port; every wait ends when its Locust ends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browserkit import headless_chromium
from conftest import LOCUST, ROOT, write_trace
from runkit import LocustProcess, assert_no_traceback
from test_webui import Page, free_port, get_json, run_folders, stop_locust, wait_for

from tailgate.verify.groundtruth import ServerProcess, start_server_process

CONTINUOUS = str(ROOT / "locustfiles" / "continuous.py")
USER, PASSWORD = "operator", "pw:with-a-colon"


def own_address() -> str | None:
    """An address of this machine other than loopback: the one it would send from to the outside (a UDP
    ``connect`` sends nothing), else the first of ``hostname -I``; None when it has none."""
    candidates: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only a route lookup
            candidates.append(s.getsockname()[0])
        except OSError:
            pass
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
        candidates += out.split()
    except (OSError, subprocess.SubprocessError):
        pass
    for address in candidates:
        if ":" not in address and not address.startswith("127.") and address != "0.0.0.0":
            return address
    return None


def launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[LocustProcess, int]:
    """``locust -f locustfiles/continuous.py`` with its web UI on a free port and only ``args`` (no --web-host
    unless given).

    It runs in ``tmp_path``: a web UI launched without ``--results-dir`` checks (and so creates) its default
    folder, ``results/webui``, relative to where it starts, and a test must not leave that in the checkout."""
    port = free_port()
    out, err = tmp_path / "locust.stdout", tmp_path / "locust.stderr"
    cmd = [*LOCUST, "-f", CONTINUOUS, "--web-port", str(port), *args]
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})  # fmt: skip
    return LocustProcess(proc, out, err), port


def answers(url: str) -> int | None:
    """The HTTP status a GET gets, redirects not followed; None when nothing answers."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_: Any, **__: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def redirect_of(url: str, data: bytes | None = None) -> tuple[int, str]:
    """Status and Location of one request, redirects not followed."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_: Any, **__: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(url, data=data, timeout=10) as resp:
            return int(resp.status), str(resp.headers.get("Location") or "")
    except urllib.error.HTTPError as e:
        return int(e.code), str(e.headers.get("Location") or "")


def refused(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3):
            return False
    except OSError:
        return True


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium("--window-size=1400,1000") as driver:
        yield driver


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server_process(ttft_ms=5.0, gap_ms=2.0) as s:
        yield s


def test_the_web_ui_listens_on_loopback_only_by_default(browser: Any, tmp_path: Path) -> None:
    address = own_address()
    if address is None:
        pytest.skip("this machine has no address other than loopback to try the web UI from")
    locust, port = launch(tmp_path)
    try:
        wait_for("the web UI on loopback", lambda: answers(f"http://127.0.0.1:{port}/") == 200, 60, locust)
        browser.get(f"http://127.0.0.1:{port}/")
        page = Page(browser, locust)
        wait_for("the start form", lambda: browser.find_elements(page.by.NAME, "host"), 30, locust)
        # the same port on the machine's own address: nothing listens there
        assert refused(address, port), f"the web UI answers on {address}:{port}"
        from selenium.common.exceptions import WebDriverException

        with pytest.raises(WebDriverException, match="ERR_CONNECTION_REFUSED"):
            browser.get(f"http://{address}:{port}/")
        assert not browser.find_elements(page.by.NAME, "host"), "the start form loaded from a non-loopback address"
        assert "Starting web interface at http://127.0.0.1:" in locust.stderr
        assert "listens on" not in locust.stderr  # the notice is for a web UI others can reach
    finally:
        stop_locust(locust)
    assert_no_traceback(locust.stderr)


@pytest.mark.parametrize(
    "args, env, fragments",
    [
        (["--web-host", "0.0.0.0"], {}, ["--web-host 0.0.0.0", "--web-login", "LOCUST_WEB_CREDENTIALS"]),
        (["--web-host", "*", "--web-login"], {}, ["--web-host *", "LOCUST_WEB_CREDENTIALS"]),
        (["--web-host", "0.0.0.0"], {"LOCUST_WEB_CREDENTIALS": f"{USER}:{PASSWORD}"}, ["--web-login"]),
        (["--web-login"], {}, ["--web-login", "LOCUST_WEB_CREDENTIALS"]),
        (["--web-host", "0.0.0.0", "--web-login"], {"LOCUST_WEB_CREDENTIALS": "nopassword"}, ["USER:PASSWORD"]),
    ],
    ids=["no-login", "login-without-credentials", "credentials-without-login", "loopback-login", "bad-credentials"],
)
def test_a_web_ui_others_could_reach_without_a_login_does_not_start(
    tmp_path: Path, args: list[str], env: dict[str, str], fragments: list[str]
) -> None:
    locust, port = launch(tmp_path, *args, env=env)
    code = locust.wait(60)
    errors = [line for line in locust.stderr.splitlines() if line.startswith("tailgate: error:")]
    assert code == 2 and len(errors) == 1, (code, locust.stderr[-2000:])
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert_no_traceback(locust.stderr, locust.stdout)
    assert PASSWORD not in locust.stderr + locust.stdout
    assert refused("127.0.0.1", port)


def test_a_web_ui_on_every_interface_asks_for_its_login(browser: Any, tmp_path: Path) -> None:
    address = own_address() or "127.0.0.1"
    locust, port = launch(tmp_path, "--web-host", "0.0.0.0", "--web-login", "--host", "http://127.0.0.1:9",
                          env={"LOCUST_WEB_CREDENTIALS": f"{USER}:{PASSWORD}"})  # fmt: skip
    base = f"http://{address}:{port}"
    try:
        wait_for("the web UI", lambda: answers(base + "/") is not None, 60, locust)
        notices = [line for line in locust.stderr.splitlines() if "the web UI listens on every interface" in line]
        assert len(notices) == 1 and f"port {port}" in notices[0] and USER in notices[0], locust.stderr[-2000:]
        # without a session: every page and the Start are sent to the login, and no Start is looked at
        for path in ("/", "/tailgate/live", "/stats/requests"):
            status, where = redirect_of(base + path)
            assert status == 302 and "/login" in where, (path, status, where)
        form = urllib.parse.urlencode({"host": "http://127.0.0.1:9", "user_count": "1", "spawn_rate": "1"})
        status, where = redirect_of(base + "/swarm", data=form.encode())
        assert status == 302 and "/login" in where, (status, where)
        assert "error: --host" not in locust.stderr  # the unauthenticated Start was never validated

        page = Page(browser, locust)
        browser.get(base + "/")
        wait_for("the login page", lambda: browser.find_elements(page.by.NAME, "password"), 30, locust)
        assert "/login" in browser.current_url and not browser.find_elements(page.by.NAME, "host")

        def log_in(password: str) -> None:
            wait_for("the login form", lambda: browser.find_elements(page.by.NAME, "password"), 30, locust)
            browser.find_element(page.by.NAME, "username").send_keys(USER)
            browser.find_element(page.by.NAME, "password").send_keys(password)
            page._fresh(lambda: next(b for b in browser.find_elements(page.by.CSS_SELECTOR, "button[type=submit]")
                                     if b.is_displayed()).click())  # fmt: skip

        log_in("wrong")
        wait_for("the refusal", lambda: "Wrong user name or password" in browser.find_element(page.by.TAG_NAME,
                 "body").text, 30, locust)  # fmt: skip
        assert not browser.find_elements(page.by.NAME, "host")
        log_in(PASSWORD)
        wait_for("the start form after the login", lambda: browser.find_elements(page.by.NAME, "host"), 30, locust)
    finally:
        stop_locust(locust)
    assert_no_traceback(locust.stderr)
    assert PASSWORD not in locust.stderr + locust.stdout


class Listener:
    """A port that would see any connection the load generator opens to it (the kernel queues them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def connections(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1


def test_a_host_outside_the_allow_list_is_refused_and_gets_no_load(
    browser: Any, server: ServerProcess, tmp_path: Path
) -> None:
    foreign = Listener()
    results = tmp_path / "results"
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 3)] * 4)
    locust, port = launch(tmp_path, "--host", server.base_url, "--results-dir", str(results), "--trace-file",
                          str(trace), "--warmup", "0", "--settle", "0.2", "--rates", "20")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("the web UI", lambda: answers(url + "/") == 200, 60, locust)
        browser.get(url + "/")
        page = Page(browser, locust)
        for host in (foreign.url + "/v1", "http://192.0.2.10:8000"):
            page.fill({"host": host})
            page.submit()
            shown = host.removesuffix("/v1") if host.startswith(foreign.url) else host
            line = f"tailgate: error: --host: {shown} is not one of the servers this web UI may load"
            wait_for(line, lambda line=line: line in browser.find_element(page.by.TAG_NAME, "body").text, 30, locust)
        # nor can a Start smuggle its own allow-list or a metrics URL elsewhere
        for extra in ({"host": foreign.url, "allow_host": foreign.url},
                      {"host": server.base_url, "metrics_url": foreign.url + "/metrics"}):  # fmt: skip
            form = urllib.parse.urlencode({"user_count": "1", "spawn_rate": "1", **extra}).encode()
            answer = json.loads(urllib.request.urlopen(url + "/swarm", data=form, timeout=30).read())
            assert not answer["success"] and "is not one of the servers" in answer["message"], answer
        assert foreign.connections() == 0, "the refused host was contacted"
        assert get_json(url + "/tailgate/live")["run"] is None
        assert get_json(url + "/stats/requests")["state"] == "ready"
        assert not run_folders(results)
        # the allowed server still starts, and runs to its end
        page.fill({"host": server.base_url})
        page.submit()
        wait_for("the allowed run to complete", lambda: (r := get_json(url + "/tailgate/live")["run"]) and
                 r["status"] == "completed", 120, locust)  # fmt: skip
        assert len(run_folders(results)) == 1
        assert foreign.connections() == 0
    finally:
        stop_locust(locust)
        foreign.sock.close()
    assert_no_traceback(locust.stderr)
