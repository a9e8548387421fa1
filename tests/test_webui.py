"""The web UI as a user drives it: a real headless Chromium against ``locust -f locustfiles/continuous.py``.

No ``--host`` on the command line: every run is started from the form (Host, one of the servers allowed
with ``--allow-host``, and the suite's options typed in), watched in the Tail latency tab, stopped
mid-stage or left to finish, and started again.
Each run must leave its own complete folder: one record per request sent, stage summaries (the
stopped stage's marked partial), ``run.json`` with the form's values and the final status, nothing
of the run still running, and the HTML report built in the background and linked from the tab.

``TAILGATE_WEBUI_SCREENSHOT=path.png`` keeps the tab's screenshot (README's docs/webui-tail-tab.png).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browserkit import headless_chromium
from conftest import LOCUST, ROOT, write_trace
from runkit import LocustProcess, assert_no_traceback, summaries
from test_kill import processes_mentioning

from tailgate.records import lost_in_flight, read_records, read_sent
from tailgate.verify.groundtruth import ServerProcess, start_server_process

TTFT_MS, GAP_MS = 20.0, 10.0  # the seeded mix's 100/300/600-token answers take 1/3/6 s: several in flight
TAB_TITLE = "Planned / sent / recorded"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(what: str, condition: Callable[[], Any], timeout: float, proc: LocustProcess) -> Any:
    """Poll until ``condition()`` is truthy; fail early, with Locust's log, if Locust exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:  # the page is re-rendering, the file is being replaced: look again
            value = None
        if value:
            return value
        if proc.proc.poll() is not None:
            raise AssertionError(f"locust exited ({proc.proc.returncode}) before {what}:\n{proc.stderr[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{proc.stderr[-2000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server_process(ttft_ms=TTFT_MS, gap_ms=GAP_MS) as s:
        yield s


def start_web_locust(tmp_path: Path, *args: str, allow: tuple[str, ...] = ()) -> tuple[LocustProcess, str]:
    """``locust`` with its web UI on a free port and no ``--host``; the form may load the ``allow`` servers
    (``--allow-host``). Returns once the page answers. It runs in ``tmp_path``, where the default results folder
    (``results/webui``, relative to where the web UI starts) goes when ``args`` name none."""
    port = free_port()
    out, err = tmp_path / "locust.stdout", tmp_path / "locust.stderr"
    allowed = [arg for url in allow for arg in ("--allow-host", url)]
    cmd = [*LOCUST, "-f", str(ROOT / "locustfiles" / "continuous.py"), "--web-host", "127.0.0.1",
           "--web-port", str(port), *allowed, *args]  # fmt: skip
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    locust = LocustProcess(proc, out, err)
    url = f"http://127.0.0.1:{port}"
    wait_for("the web UI", lambda: urllib.request.urlopen(url + "/", timeout=2).status == 200, 60, locust)
    return locust, url


def stop_locust(locust: LocustProcess) -> int:
    if locust.proc.poll() is None:
        locust.proc.send_signal(signal.SIGTERM)
    return locust.wait(60)


# ------------------------------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium("--window-size=1400,1000") as driver:
        yield driver


class Page:
    """The Locust page, used the way a person would: fields by name, buttons by their label."""

    def __init__(self, driver: Any, locust: LocustProcess) -> None:
        from selenium.webdriver.common.by import By

        self.d = driver
        self.by = By
        self.locust = locust

    def button(self, label: str) -> Any:
        label = label.lower()
        for b in self.d.find_elements(self.by.TAG_NAME, "button"):
            if b.is_displayed() and b.text.strip().lower() == label:
                return b
        return None

    def click(self, label: str) -> None:
        wait_for(f"the {label!r} button", lambda: self.button(label), 30, self.locust).click()

    def fill(self, values: dict[str, str]) -> None:
        """Open the form's Custom parameters if needed, then type every value over what is there."""
        wait_for("the start form", lambda: self.d.find_elements(self.by.NAME, "host"), 30, self.locust)
        if not self.d.find_element(self.by.NAME, "rates").is_displayed():
            self.click("Custom parameters")
            wait_for("the custom parameters", lambda: self.d.find_element(self.by.NAME, "rates").is_displayed(), 10,
                     self.locust)  # fmt: skip
        for name, value in values.items():
            field = self.d.find_element(self.by.NAME, name)
            field.send_keys("\ue009a")  # Ctrl+A: replace, whatever the field held before
            field.send_keys("\ue017")  # Delete
            field.send_keys(value)
            assert field.get_attribute("value") == value, name

    def submit(self) -> None:
        form_button = [b for b in self.d.find_elements(self.by.CSS_SELECTOR, "button[type=submit]") if b.is_displayed()]
        form_button[0].click()

    def open_tab(self) -> None:
        self.click("Tail latency")
        wait_for("the tail table", lambda: self.table(), 30, self.locust)

    def table(self) -> dict[str, dict[str, str]]:
        """The tab's stage table as {stage: {column title: cell}}, read from the page."""
        return self._fresh(self._table)

    def _fresh(self, read: Any) -> Any:
        """Read again when the page re-rendered under the read (the tab refreshes every few seconds)."""
        from selenium.common.exceptions import StaleElementReferenceException

        for _ in range(10):
            try:
                return read()
            except StaleElementReferenceException:
                time.sleep(0.2)
        return read()

    def _table(self) -> dict[str, dict[str, str]]:
        heads = [th for th in self.d.find_elements(self.by.TAG_NAME, "th") if th.text.strip()]
        titles = [th.text.replace("\n", " ").strip() for th in heads]
        if TAB_TITLE not in titles:
            return {}
        table = heads[titles.index(TAB_TITLE)].find_element(self.by.XPATH, "./ancestor::table")
        out = {}
        for tr in table.find_elements(self.by.CSS_SELECTOR, "tbody tr"):
            cells = [td.text.replace("\n", " ").strip() for td in tr.find_elements(self.by.TAG_NAME, "td")]
            row = dict(zip(titles, cells, strict=False))
            out[row["Stage"]] = row
        return out

    def panel(self) -> str:
        def read() -> str:
            found = self.d.find_elements(self.by.ID, "tailgate-panel")
            return found[0].text if found else ""

        return self._fresh(read)


def recorded(row: dict[str, str]) -> int:
    return int(row[TAB_TITLE].split("/")[2])


# --------------------------------------------------------------------------------------- the checks


def check_run(folder: Path, *, status: str, host: str, options: dict[str, Any]) -> dict[str, Any]:
    """A finished run folder: run.json, one record per request sent, summaries that match the records."""
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == status, meta["status"]
    assert meta["host"] == host and meta["options"]["host"] == host
    for key, value in options.items():
        assert meta["options"][key] == value, (key, meta["options"][key], value)
    assert meta["ended"] is not None
    scan = read_records(folder)
    assert scan.partial_lines == 0
    records = scan.records
    keys = [(r.stage, r.trace_id) for r in records]
    assert len(keys) == len(set(keys)) and set(keys) == read_sent(folder), "sent and recorded differ"
    assert lost_in_flight(folder).lost == 0
    assert {r.run_id for r in records} <= {meta["run_id"]}
    by_label = summaries(folder)
    assert sorted(by_label) == sorted(meta["stages"])
    for label, s in by_label.items():
        stage = [r for r in records if r.stage_label == label]
        assert s["run_id"] == meta["run_id"] and s["sent"] == len(stage)
        assert s["errors_by_class"] == dict(Counter(r.error_class for r in stage if r.error_class))
        assert s["partial"] is (label in meta["partial_stages"])
    # nothing of the run is left running: its /metrics sampler mentions the folder on its command line
    assert not processes_mentioning(str(folder / "server-metrics.jsonl")), "the run's sampler outlived it"
    return {"meta": meta, "records": records, "summaries": by_label}


def run_folders(parent: Path) -> list[Path]:
    return sorted(p for p in parent.glob("continuous-*") if p.is_dir())


def test_web_ui_start_watch_stop_restart(server: ServerProcess, browser: Any, tmp_path: Path) -> None:
    from test_bad_input import _json_reply, _OddServer

    # the servers the form will name, allowed at launch (a host outside the list is refused: test_webui_access.py)
    dead = f"http://127.0.0.1:{free_port()}"
    ssh, null = _OddServer(b"SSH-2.0-OpenSSH_9.6\r\n"), _OddServer(_json_reply(b'{"data": null}'))
    odd = (f"http://127.0.0.1:{ssh.port}", f"http://127.0.0.1:{null.port}")
    locust, url = start_web_locust(tmp_path, "--rates", "9", "--n", "500",  # the form overrides both
                                   allow=(server.base_url, dead, *odd))  # fmt: skip
    page = Page(browser, locust)
    try:
        browser.get(url + "/")

        # a bad value is refused with the command line's one line, shown by the form; nothing starts
        page.fill({"host": server.base_url, "rates": "2,abc"})
        shown = [f.get_attribute("name") for f in browser.find_elements(page.by.CSS_SELECTOR, "input")
                 if f.is_displayed()]  # fmt: skip
        assert "userCount" not in shown and "spawnRate" not in shown and "host" in shown, shown  # the shape drives
        page.submit()
        wait_for("the error line", lambda: "tailgate: error: --rates: 'abc' is not a number" in
                 browser.find_element(page.by.TAG_NAME, "body").text, 30, locust)  # fmt: skip
        # so is a server that does not answer, checked at Start (the command line only filled the form)
        page.fill({"host": dead, "rates": "4,6"})
        page.submit()
        wait_for("the unreachable-host line", lambda: f"tailgate: error: --host: cannot reach {dead}" in
                 browser.find_element(page.by.TAG_NAME, "body").text, 30, locust)  # fmt: skip
        # hosts that are not an OpenAI server, a broken URL, a repeated rate: each its one line, no folder
        for host, rates, line in (
            (odd[0], "4,6", "does not speak HTTP"),
            ("http://[::1", "4,6", "is not a valid URL"),
            (odd[1], "4,6", "did not list models"),
            (server.base_url, "6,6", "--rates: 6 req/s appears twice"),
        ):
            page.fill({"host": host, "rates": rates, "resultsDir": str(tmp_path / "ui-a")})
            page.submit()
            wait_for(line, lambda line=line: line in browser.find_element(page.by.TAG_NAME, "body").text, 30, locust)
            assert "unknown error" not in browser.find_element(page.by.TAG_NAME, "body").text.lower()
        ssh.sock.close()
        null.sock.close()
        page.fill({"host": server.base_url, "rates": "2,6"})
        assert not (tmp_path / "ui-a").exists() or not run_folders(tmp_path / "ui-a")

        # run 1: form values, no --host; watch the tab update, then Stop mid-stage
        first = tmp_path / "ui-a"
        page.fill({"n": "20", "warmup": "2", "settle": "0.5", "resultsDir": str(first)})
        page.submit()
        page.open_tab()
        seen = wait_for("a first record in the tab", lambda: recorded(page.table().get("cont_r2", {TAB_TITLE: "0/0/0"}))
                        or None, 60, locust)  # fmt: skip
        later = wait_for("the tab to update", lambda: (n := recorded(page.table()["cont_r2"])) > seen and n, 60, locust)
        assert "running cont_r2" in page.panel()
        assert browser.find_elements(page.by.CSS_SELECTOR, "#tailgate-panel svg"), "no server chart"

        def in_flight() -> dict[str, Any] | None:
            run = get_json(url + "/tailgate/live")["run"]
            stage = run["stages"][0]
            mid_stage = stage["sent"] < stage["planned"]
            return run if mid_stage and stage["sent"] - stage["recorded"] >= 3 else None

        live = wait_for("requests in flight", in_flight, 60, locust)
        assert live["stages"][0]["state"] == "running" and later >= 2
        page.click("Stop")
        states = {"cont_r2": "partial", "cont_r6": "not run"}
        wait_for("the stopped run in the tab", lambda: {k: v["State"] for k, v in page.table().items()} == states, 60,
                 locust)  # fmt: skip
        (folder_1,) = run_folders(first)
        run1 = check_run(folder_1, status="stopped", host=server.base_url,
                         options={"rates": [2.0, 6.0], "n": 20, "warmup": 2, "settle": 0.5})  # fmt: skip
        assert run1["meta"]["stages"] == ["cont_r2"] and run1["meta"]["partial_stages"] == ["cont_r2"]
        s1 = run1["summaries"]["cont_r2"]
        assert s1["partial"] and s1["planned"] == 22 and s1["sent"] < 22
        # every request sent is a record; one still streaming when the Stop landed is 'cancelled' (on a busy
        # machine the Stop can land after the streams in flight at the click have ended: then there is none)
        assert s1["recorded"] == s1["sent"], s1
        assert set(s1["errors_by_class"]) <= {"cancelled"}, s1["errors_by_class"]
        # the tab reads the journal as the analysis does: its sent is the summary's, the rest never sent
        row1 = page.table()["cont_r2"]
        assert row1[TAB_TITLE] == f"22 / {s1['sent']} / {s1['recorded']}", row1
        # dropped is the summary's (arrivals the in-flight cap refused); one a stop took back is never sent
        dropped, never, _ = row1["Dropped / never sent / merged"].split(" / ")
        assert (dropped, never) == (str(s1["dropped_arrivals"]), str(s1["never_sent"])), row1
        # a stream cancelled by Stop is no Locust failure
        failures = [s["num_failures"] for s in get_json(url + "/stats/requests")["stats"] if s["name"] == "cont_r2"]
        assert failures in ([], [0]), failures
        live = get_json(url + "/tailgate/live")["run"]
        assert live["run_id"] == run1["meta"]["run_id"] and not live["coordinator_alive"] and not live["sampler_alive"]
        wait_for("run 1's report", lambda: (folder_1 / "report" / "report.html").exists(), 120, locust)

        # run 2: other values in another folder, left to finish; the tab's figures are the summary's
        second = tmp_path / "ui-b"
        page.click("New")
        page.fill({"rates": "3,5", "n": "8", "warmup": "1", "resultsDir": str(second)})
        page.submit()
        page.open_tab()
        done = {"cont_r3": "done", "cont_r5": "done"}
        wait_for("run 2 to complete", lambda: {k: v["State"] for k, v in page.table().items()} == done, 180, locust)
        wait_for("the report link", lambda: browser.find_elements(page.by.ID, "tailgate-report-link"), 120,
                        locust)  # fmt: skip
        (folder_2,) = run_folders(second)
        run2 = check_run(folder_2, status="completed", host=server.base_url,
                         options={"rates": [3.0, 5.0], "n": 8, "warmup": 1, "settle": 0.5})  # fmt: skip
        table = page.table()
        for label, s2 in run2["summaries"].items():
            assert not s2["partial"] and s2["sent"] == s2["planned"] == 9 and s2["errors"] == 0 and s2["n"] == 8
            row = table[label]
            assert row[TAB_TITLE] == "9 / 9 / 9" and row["Errors"] == "0"
            p50, _, p99, _ = (float(x) for x in row["TTFT p50 / p90 / p99 / max (ms)"].split("/"))
            assert (p50, p99) == (s2["ttft_p50"], s2["ttft_p99"])
            g50, _, g99, _ = (float(x) for x in row["Worst gap p50 / p90 / p99 / max (ms)"].split("/"))
            assert (g50, g99) == (s2["gap_p50"], s2["gap_p99"])
        # Locust's own statistics: one request event per stream, so its count (and RPS) is the real one
        stats = get_json(url + "/stats/requests")
        rows = [s for s in stats["stats"] if s["name"] != "Aggregated"]
        streams = sorted((s["method"], s["name"], s["num_requests"]) for s in rows)
        assert streams == [("STREAM", "cont_r3", 9), ("STREAM", "cont_r5", 9)]
        # the run's files from the tab, and its requests' TTFT and worst gap over time
        href = page._fresh(lambda: browser.find_element(page.by.ID, "tailgate-report-link").get_attribute("href"))
        points = page._fresh(lambda: browser.find_element(page.by.ID, "tailgate-latency-chart").get_attribute(
            "data-points"))  # fmt: skip
        assert points == str(2 * 2 * 9)  # TTFT and worst gap of every request
        for what, member in (("records", "records-"), ("summaries", "summary-cont_r3.json"), ("report", "report.html")):
            got = page._fresh(lambda what=what: browser.find_element(page.by.ID, f"tailgate-download-{what}")
                              .get_attribute("href"))  # fmt: skip
            with urllib.request.urlopen(got, timeout=30) as resp:
                names = zipfile.ZipFile(io.BytesIO(resp.read())).namelist()
            assert any(member in n for n in names), (what, names)
        with urllib.request.urlopen(href, timeout=10) as resp:
            assert resp.status == 200 and b"<html" in resp.read(2000).lower()
        shot = os.environ.get("TAILGATE_WEBUI_SCREENSHOT") or str(tmp_path / "webui-tail-tab.png")
        browser.save_screenshot(shot)

        # run 3: a third Start after a completed run starts a fresh run too
        page.click("New")
        page.fill({"rates": "4", "n": "5", "warmup": "0"})
        page.submit()
        page.open_tab()
        # from the Start on, the tab switches with Locust's own status: never the previous run shown as the current
        # one while Locust says RUNNING, never the new run's head above the previous run's rows (the rows ride on
        # Locust's own, later, stats poll), nor the other way round
        clicked, old_id, mixed, switched = time.monotonic(), run2["meta"]["run_id"], [], None
        while switched is None or time.monotonic() - switched < 3.0:
            assert time.monotonic() - clicked < 30, "the panel never showed run 3"
            body = page._fresh(lambda: browser.find_element(page.by.TAG_NAME, "body").text)
            status = re.search(r"Status\s*\n\s*([A-Z]+)", body)
            head = (page.panel().splitlines() or [""])[0]
            stages = {k for k, v in page.table().items() if k and v.get("State")}
            if head.startswith("Run ") and not head.startswith(f"Run {old_id}") and switched is None:
                switched = time.monotonic()
            new_head, old_rows = switched is not None, bool(stages & {"cont_r3", "cont_r5"})
            started = status is not None and status.group(1) in ("RUNNING", "SPAWNING")
            if (new_head and old_rows) or (not new_head and ("cont_r4" in stages or started)):
                mixed.append((round(time.monotonic() - clicked, 2), status and status.group(1), head, sorted(stages)))
        assert not mixed, mixed
        print(f"the panel showed run 3 {switched - clicked:.2f} s after the click on Start")
        wait_for("run 3's folder", lambda: len(run_folders(second)) == 2, 60, locust)
        folder_3 = next(p for p in run_folders(second) if p != folder_2)
        page.open_tab()
        wait_for("run 3 to complete", lambda: page.table().get("cont_r4", {}).get("State") == "done", 120, locust)
        run3 = check_run(folder_3, status="completed", host=server.base_url, options={"rates": [4.0], "n": 5})
        assert run3["summaries"]["cont_r4"]["sent"] == 5
        assert len({run1["meta"]["run_id"], run2["meta"]["run_id"], run3["meta"]["run_id"]}) == 3
    finally:
        code = stop_locust(locust)
    assert code == 128 + signal.SIGTERM, locust.stderr[-3000:]  # the rule of tailgate.exitcodes
    assert_no_traceback(locust.stderr)


def test_the_tab_shows_the_new_run_from_the_moment_start_is_answered(server: ServerProcess, tmp_path: Path) -> None:
    """A Start after a finished run: the very first look after Locust answered it (the tab's own poll, and the
    rows riding on Locust's stats poll) is the new run, running, never the previous one shown as completed."""
    results = tmp_path / "results"
    trace = write_trace(tmp_path / "trace.jsonl", [(4, 3)] * 4)
    locust, url = start_web_locust(tmp_path, "--results-dir", str(results), "--trace-file", str(trace),
                                   "--warmup", "0", "--settle", "0.5", allow=(server.base_url,))  # fmt: skip

    def start(rate: str) -> None:
        form = {"host": server.base_url, "user_count": "1", "spawn_rate": "1", "rates": rate}
        data = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in form.items()).encode()
        answer = json.loads(urllib.request.urlopen(url + "/swarm", data=data, timeout=30).read())
        assert answer["success"], answer

    try:
        start("5")
        first = wait_for("the first run to complete", lambda: (r := get_json(url + "/tailgate/live")["run"])
                         and r["status"] == "completed" and r, 120, locust)  # fmt: skip
        wait_for("Locust to see it stopped", lambda: get_json(url + "/stats/requests")["state"] == "stopped", 60,
                 locust)  # fmt: skip
        start("7")
        live = get_json(url + "/tailgate/live")
        rows = get_json(url + "/stats/requests")["extended_stats"][0]["data"]
        wait_for("the second run to complete", lambda: get_json(url + "/tailgate/live")["run"]["status"] ==
                 "completed", 120, locust)  # fmt: skip
    finally:
        stop_locust(locust)
    run = live["run"]
    assert run["run_id"] != first["run_id"] and run["status"] == "running" and not run["ended"], run
    assert [st["label"] for st in run["stages"]] == ["cont_r7"] and live["busy"], live
    assert [(r["stage"], r["state"]) for r in rows] in ([("cont_r7", "waiting")], [("cont_r7", "running")]), rows
    assert [r["run_id"] for r in live["earlier"]] == [first["run_id"]]


def test_a_run_stopped_before_its_plan_ended_exits_incomplete(server: ServerProcess, tmp_path: Path) -> None:
    """Stop mid-stage, then the process ends on its own (``--autostart --autoquit``): the run is stopped, its
    stage partial, and the exit code is the rule's 4 (done, part of the plan unmeasured), not 0."""
    results = tmp_path / "results"
    locust, url = start_web_locust(tmp_path, "--host", server.base_url, "--results-dir", str(results), "--rates",
                                   "3", "--n", "30", "--warmup", "0", "--autostart", "--autoquit", "1")  # fmt: skip
    try:
        folder = wait_for("the run folder", lambda: run_folders(results) and run_folders(results)[0], 60, locust)
        wait_for("requests in flight", lambda: len(read_sent(folder)) >= 3, 60, locust)
        urllib.request.urlopen(url + "/stop", data=b"", timeout=30).read()
        code = locust.wait(90)
    finally:
        if locust.proc.poll() is None:
            locust.proc.kill()
            locust.proc.wait()
    run = json.loads((folder / "run.json").read_text())
    assert run["status"] == "stopped" and run["partial_stages"] == ["cont_r3"], run
    assert code == 4, (code, locust.stderr[-3000:])


@pytest.mark.parametrize("how", ["sigterm-web", "sigint-headless"])
def test_quitting_mid_stage_leaves_a_stopped_run(server: ServerProcess, tmp_path: Path, how: str) -> None:
    """Ctrl-C and SIGTERM finish the run as Stop does: cancelled streams, a partial summary, status stopped."""
    results = tmp_path / "results"
    if how == "sigterm-web":
        locust, url = start_web_locust(tmp_path, "--results-dir", str(results), allow=(server.base_url,))
        form = {"host": server.base_url, "user_count": "1", "spawn_rate": "1", "rates": "3", "n": "30",
                "warmup": "0"}  # fmt: skip
        data = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in form.items()).encode()
        answer = json.loads(urllib.request.urlopen(url + "/swarm", data=data, timeout=30).read())
        assert answer["success"], answer
        folder = wait_for("the run folder", lambda: run_folders(results) and run_folders(results)[0], 30, locust)
        sig = signal.SIGTERM
    else:
        cmd = [
            *LOCUST,
            "-f",
            str(ROOT / "locustfiles" / "continuous.py"),
            "--headless",
            "--only-summary",
            "--host",
            server.base_url,
            "--results-dir",
            str(results),
            "--rates",
            "3",
            "--n",
            "30",
            "--warmup",
            "0",
        ]
        out, err = tmp_path / "locust.stdout", tmp_path / "locust.stderr"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        locust = LocustProcess(proc, out, err)
        folder = results
        sig = signal.SIGINT

    def in_flight() -> bool:
        sent = len(read_sent(folder))
        return sent >= 3 and sent - len(read_records(folder).records) >= 2

    wait_for("requests in flight", in_flight, 60, locust)
    locust.proc.send_signal(sig)
    code = locust.wait(60)
    # the signal's code (tailgate.exitcodes); streams it cancelled are records, not Locust failures
    assert code == 128 + sig, locust.stderr[-2000:]
    run = check_run(folder, status="stopped", host=server.base_url, options={"rates": [3.0]})
    # a headless shape run meets Ctrl-C in Locust's own wait for the shape, which stops the test before quitting
    assert run["meta"]["stop_reason"] == ("quit" if sig == signal.SIGTERM else "stop")
    assert run["meta"]["partial_stages"] == ["cont_r3"]
    s = run["summaries"]["cont_r3"]
    assert s["partial"] and s["errors_by_class"].get("cancelled", 0) >= 1 and s["sent"] < s["planned"] == 30
    assert not (folder / "report").exists(), "no report is built for a process that is quitting"
    assert_no_traceback(locust.stderr)


@pytest.mark.vllm
def test_web_ui_run_against_the_cpu_vllm(vllm_server: Any, tmp_path: Path) -> None:
    """A real engine behind the tab: its running / KV-usage series reach the chart's data, and the tab's
    preemption count and percentiles are the stage summary's. Driven through Locust's HTTP API (the
    browser's part is covered above)."""
    # streams long enough, and samples dense enough, that some sample lands while one runs: at the default
    # 1 s a fast engine can finish every 64-token stream between two samples
    trace = write_trace(tmp_path / "trace.jsonl", [(32, 160)] * 9 + [(400, 160)])
    results = tmp_path / "results"
    locust, url = start_web_locust(tmp_path, "--results-dir", str(results), "--trace-file", str(trace),
                                   "--warmup", "2", "--ignore-eos", "--sample-metrics", "0.2",
                                   allow=(vllm_server.base_url,))  # fmt: skip
    try:
        form = {"host": vllm_server.base_url, "user_count": "1", "spawn_rate": "1", "rates": "2", "settle": "0.5"}
        data = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in form.items()).encode()
        answer = json.loads(urllib.request.urlopen(url + "/swarm", data=data, timeout=60).read())
        assert answer["success"], answer
        live = wait_for("the run to end and its report", lambda: (r := get_json(url + "/tailgate/live")["run"])
                        and r["report"]["state"] in ("ready", "failed") and r, 300, locust)  # fmt: skip
    finally:
        code = stop_locust(locust)
    assert code == 128 + signal.SIGTERM, locust.stderr[-3000:]  # the rule of tailgate.exitcodes
    assert live["status"] == "completed" and live["report"]["state"] == "ready", live["report"]
    (stage,) = live["stages"]
    counts = (stage["state"], stage["planned"], stage["sent"], stage["recorded"], stage["errors"])
    assert counts == ("done", 10, 10, 10, 0)
    series = live["series"]
    assert max(v for v in series["running"] if v is not None) >= 1, series["running"]
    assert any(v is not None for v in series["kv_usage"]) and any(v is not None for v in series["preemptions_total"])
    (folder,) = run_folders(results)
    summary = summaries(folder)["cont_r2"]
    assert stage["preemptions"] == summary["preemptions_delta"] is not None
    assert (stage["ttft"]["p50"], stage["ttft"]["p99"]) == (summary["ttft_p50"], summary["ttft_p99"])
    assert (stage["total"]["p50"], stage["total"]["p99"]) == (summary["total_p50"], summary["total_p99"])
    check_run(folder, status="completed", host=vllm_server.base_url, options={"rates": [2.0], "ignore_eos": True})
