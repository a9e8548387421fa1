"""The suite inside Locust's web UI: every Start validated as a fresh run, and a Tail latency tab.

Everything goes through the extension points Locust's web UI offers, nothing of Locust is patched:

- the ``/swarm`` request (Start) is checked by a ``before_request`` hook: the form's values and
  Host are applied to a copy of the options and validated exactly as the command line is; a bad
  value answers ``{"success": false, "message": <the same one line as on the command line>}``, which
  the start form shows, and a good one becomes the settings of the next run. A host (or metrics or
  Prometheus URL) outside the servers allowed at launch (``--host``, ``--allow-host``) is refused the same
  way, before anything is sent to it (``tailgate/load/webaccess.py``); with ``--web-login`` a Start
  without a session is left to Locust's login, unchecked and unanswered here;
- ``extendedTabs`` / ``extendedTables`` in the page's template arguments add the **Tail latency**
  tab and its table, whose rows ride on Locust's own ``/stats/requests`` poll (``extended_stats``);
- a small script (``static/tail.js``, added to the page by an ``after_request`` hook) adds what a
  table cannot hold: the run's header, a live chart of the server's series and the report link,
  from ``/tailgate/live``.
"""

from __future__ import annotations

import gevent

import argparse
import io
import json
import logging
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, Response, abort, jsonify, request, send_file
from flask.typing import ResponseReturnValue

from tailgate.jsontypes import JsonObject
from tailgate.load.preflight import settings_for, usage_line
from tailgate.load.webaccess import AllowList
from tailgate.optiontable import OptionError
from tailgate.resultfiles import RECORDS_GLOB, RECORDS_SUBDIR, REPORT_DIR, RUN_META, SENT_GLOB, SUMMARY_GLOB
from tailgate.webui.live import TABLE_KEY, TABLE_STRUCTURE, LiveViews, table_rows

log = logging.getLogger("tailgate")

WEB_RESULTS = "results/webui"
"""Where the runs started from the web UI go when the form names no results dir (one sub-folder per run)."""
STOPPING_WAIT_S = 20.0
"""A stats poll that arrives while a run is being stopped waits (cooperatively) for the finished run:
Locust polls until it sees the test stopped, and the answer it stops on must hold the final rows."""
STATIC = Path(__file__).resolve().parent / "static"
TAB_TITLE = "Tail latency"
SCRIPT_TAGS = (
    '<link rel="stylesheet" href="./tailgate/static/tail.css"><script src="./tailgate/static/tail.js" defer></script>'
)


def form_options(parsed: Any, form: Any) -> argparse.Namespace:
    """The options as Locust's ``/swarm`` handler is about to set them, on a copy.

    Same conversion as Locust's (keeps each option's type), but a value that does not convert is an
    OptionError naming the option instead of an exception inside the handler."""
    opts = argparse.Namespace(**vars(parsed))
    current = vars(opts)
    for key, raw in form.items():
        if key == "host":
            opts.host = str(raw).replace("<", "").replace(">", "").strip()
            continue
        if key not in current or key in ("user_count", "spawn_rate", "run_time", "profile", "user_classes"):
            continue
        old = current[key]
        flag = "--" + key.replace("_", "-")
        if isinstance(old, bool):
            value: Any = raw == "true"
        elif old is None:
            value = raw
        elif isinstance(old, list):
            value = raw.split(",") if "," in raw else form.getlist(key)
        else:
            try:
                value = type(old)(raw)
            except ValueError:
                kind = "a whole number" if isinstance(old, int) else "a number"
                raise OptionError(f"{flag}: {raw!r} is not {kind}") from None
        setattr(opts, key, value)
    return opts


def _signed_in() -> bool:
    """Whether this request carries a session of ``--web-login``'s user."""
    from flask_login import current_user

    return bool(current_user.is_authenticated)


DOWNLOADS: dict[str, tuple[str, ...]] = {
    "records": (RECORDS_GLOB, SENT_GLOB, f"{RECORDS_SUBDIR}/{RECORDS_GLOB}"),
    "summaries": (SUMMARY_GLOB, RUN_META),
    "report": (f"{REPORT_DIR}/**/*",),
}
"""What each of the tab's download links holds, by glob in the run's folder."""


def install(environment: Any) -> None:
    """Register the Start check, the tab and its routes on the web UI of this (master) process."""
    web_ui = environment.web_ui
    shape = environment.shape_class
    views = LiveViews()
    base = getattr(environment.parsed_options, "web_base_path", None) or None
    bp = Blueprint("tailgate", __name__, static_folder=str(STATIC), static_url_path="/tailgate/static",
                   url_prefix=base)  # fmt: skip
    app: Flask = web_ui.app
    # Locust's login check (unannotated): the view it wraps answers as before, or with an error page
    auth: Callable[[Callable[..., Response]], Callable[..., ResponseReturnValue]] = web_ui.auth_required_if_enabled
    launch = environment.parsed_options
    # fixed now, before any Start: Locust's own Start handler writes the form's values into the parsed options
    allowed = AllowList.at_launch(launch, getattr(launch, "host", None) or environment.host)

    def newest() -> Any:
        return shape.session or shape.latest

    def live_snapshot() -> JsonObject | None:
        run = newest()
        return None if run is None else views.snapshot(run)

    @bp.route("/tailgate/live")
    @auth
    def live() -> Response:
        run = newest()
        snap = live_snapshot()
        earlier = [
            {"run_id": r.run_id, "status": r.status, "folder": str(r.folder), "report": r.report_state()}
            for r in reversed(shape.runs) if r is not run
        ][:5]  # fmt: skip
        return jsonify({"run": snap, "earlier": earlier, "busy": shape.busy()})

    @bp.route("/tailgate/report/<run_id>")
    @auth
    def report(run_id: str) -> Response:
        run = next((r for r in shape.runs if r.run_id == run_id), None)
        if run is None or not run.report_html.is_file():
            abort(404)
        return send_file(run.report_html.resolve(), mimetype="text/html", max_age=0)

    @bp.route("/tailgate/download/<run_id>/<what>")
    @auth
    def download(run_id: str, what: str) -> Response:
        """The run's records and journals, its summaries and run.json, or its report, as one zip (stored, not
        compressed: building it must not hold the event loop that stamps a running stage's chunks)."""
        run = next((r for r in shape.runs if r.run_id == run_id), None)
        if run is None or what not in DOWNLOADS:
            abort(404)
        files = [f for pattern in DOWNLOADS[what] for f in sorted(run.folder.glob(pattern)) if f.is_file()]
        if not files:
            abort(404)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            for i, f in enumerate(files):
                z.write(f, f"{run.folder.name}/{f.relative_to(run.folder)}")
                if i % 20 == 19:
                    gevent.idle()
        buf.seek(0)
        return send_file(buf, mimetype="application/zip", as_attachment=True,
                         download_name=f"{run.folder.name}-{what}.zip", max_age=0)  # fmt: skip

    app.register_blueprint(bp)

    def begin_accepted(response: Response) -> None:
        """A Start Locust accepted opens its run now, before the answer goes out: the shape's first tick, which
        would open it otherwise, comes a second or two later, and the tab would show the previous run as the
        current one meanwhile."""
        if shape.session is not None or shape.pending is None or not response.is_json:
            return
        answer = response.get_json(silent=True) or {}
        if answer.get("success"):
            shape.begin()

    @app.before_request
    def check_start() -> Response | None:
        if request.endpoint != "locust.swarm" or request.method != "POST":
            return None
        if web_ui.web_login and not _signed_in():
            return None  # Locust's login_required turns it away; nothing about it is checked or sent here
        host = request.form.get("host") or environment.host or ""
        if shape.busy():
            message = usage_line(f"run {shape.session.run_id} is still going; stop it before starting another")
            return jsonify({"success": False, "message": message, "host": host})
        try:
            opts = form_options(environment.parsed_options, request.form)
            for option, url in (("--host", opts.host), ("--metrics-url", getattr(opts, "metrics_url", "")),
                                ("--prometheus-url", getattr(opts, "prometheus_url", ""))):  # fmt: skip
                refused = allowed.refusal(option, str(url or ""))
                if refused:
                    raise OptionError(refused)
            opts.results_dir = opts.results_dir or WEB_RESULTS
            settings = settings_for(environment, opts)
        except OptionError as e:
            log.error(usage_line(str(e)))
            return jsonify({"success": False, "message": usage_line(str(e)), "host": host})
        shape.configure(settings)
        return None

    @app.after_request
    def decorate(response: Response) -> Response:
        endpoint = request.endpoint
        if endpoint == "locust.swarm" and request.method == "POST" and response.status_code == 200:
            begin_accepted(response)
        elif endpoint == "locust.index" and response.status_code == 200 and response.mimetype == "text/html":
            page = response.get_data(as_text=True)
            if "tailgate/static/tail.js" not in page:
                response.set_data(page.replace("</body>", SCRIPT_TAGS + "</body>", 1))
        elif endpoint == "locust.request_stats" and response.status_code == 200 and response.is_json:
            run = newest()
            deadline = time.monotonic() + STOPPING_WAIT_S
            while run is not None and run.stopping and not run.ended and time.monotonic() < deadline:
                gevent.sleep(0.05)
            body = json.loads(response.get_data())
            body["extended_stats"] = [{"key": TABLE_KEY, "data": table_rows(live_snapshot())}]
            response.set_data(json.dumps(body))
        return response

    web_ui.template_args["extendedTabs"] = [{"title": TAB_TITLE, "key": TABLE_KEY}]
    web_ui.template_args["extendedTables"] = [{"key": TABLE_KEY, "structure": TABLE_STRUCTURE}]
