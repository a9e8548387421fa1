"""Who may reach the web UI, and which servers its Start form may send load to.

Locust binds its web UI to every interface with no login, and its start form sends load to whatever host
is typed into it: anyone who reaches the port can make this machine load any server (an open relay).
With the suite's locustfiles the web UI is safe by default instead:

- it binds to loopback (``127.0.0.1``) unless ``--web-host`` names another address;
- an address other machines can reach needs Locust's own ``--web-login``, with the user and password set
  by ``--web-credentials`` (``LOCUST_WEB_CREDENTIALS``); without them Locust does not start (one line,
  exit 2);
- a Start is refused, before anything is sent, unless its host (and a metrics or Prometheus URL typed
  into the form) is on a server allowed at launch: ``--host`` and every ``--allow-host``.

No Flask at import: the hooks import this module in headless runs too; the login is installed by
:func:`install_login` only where a web UI runs.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tailgate.load.target import Target, TargetError
from tailgate.optiontable import OptionError

LOOPBACK = "127.0.0.1"
"""Where the web UI listens when no ``--web-host`` is given."""
WEB_HOST_HELP = (
    "Host to bind the web interface to. Defaults to 127.0.0.1 (this machine only) with the suite's "
    "locustfiles; any other address (0.0.0.0 or '*': all interfaces) needs --web-login and --web-credentials"
)
CREDENTIALS_ENV = "LOCUST_WEB_CREDENTIALS"
LOGIN_ROUTE = "/tailgate/login"


def add_web_arguments(g: Any) -> None:
    """The web UI's access options, on Locust's parser (never shown in the start form: the form must not be
    able to widen its own allow-list, nor show a password)."""
    g.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="URL",
        include_in_web_ui=False,
        help="web UI: a server the start form may send load to besides --host (repeat for more); "
        "a Start naming any other host is refused",
    )
    g.add_argument(
        "--web-credentials",
        default="",
        metavar="USER:PASSWORD",
        include_in_web_ui=False,
        is_secret=True,
        help=f"web UI: the user and password --web-login asks for (needed for a --web-host other than "
        f"loopback); prefer ${CREDENTIALS_ENV} or locust.conf to a command line other users can see",
    )


def prepare_parser(parser: Any) -> None:
    """Locust's parser as the suite needs it: no abbreviated options, the web UI on loopback by default.

    argparse takes ``--rate 2`` for ``--rates 2`` by prefix; among the suite's many options with shared
    prefixes (``--prefix-*``, ``--rates``/``--rate-*``) that silently measures something else, so an option
    must be spelt out. Both are settings of Locust's own parser, not a change to Locust's code."""
    parser.allow_abbrev = False
    parser.set_defaults(web_host=LOOPBACK)
    for action in getattr(parser, "_actions", ()):
        if action.dest == "web_host":
            action.help = WEB_HOST_HELP


def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable from this machine only (a name counts when every address it
    resolves to is loopback); ``""`` and ``*`` are every interface."""
    host = host.strip().strip("[]")
    if host in ("", "*"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in found)


def parse_credentials(text: str) -> tuple[str, str]:
    """``USER:PASSWORD`` (the password may hold colons)."""
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise OptionError("--web-credentials: give USER:PASSWORD, both non-empty")
    return user, password


@dataclass(frozen=True)
class WebAccess:
    """What the command line decided about the web UI: where it listens and the login it asks for."""

    bind: str
    login: tuple[str, str] | None

    def notice(self, port: int) -> str | None:
        """The one line said when the web UI is reachable from other machines (None on loopback)."""
        if is_loopback(self.bind):
            return None
        where = "every interface" if self.bind in ("", "*", "0.0.0.0", "::") else self.bind
        user = self.login[0] if self.login else "?"
        return f"tailgate: the web UI listens on {where}, port {port}, behind a login (user {user!r})"


def check_access(opts: Any) -> WebAccess:
    """The launch's web options, checked; raises OptionError (one line, exit 2) for a web UI that others could
    reach without a login, or a login nobody could pass."""
    bind = str(getattr(opts, "web_host", "") or "")
    login_on = bool(getattr(opts, "web_login", False))
    text = str(getattr(opts, "web_credentials", "") or "")
    login = parse_credentials(text) if text else None
    shown = bind or "*"
    if not is_loopback(bind) and not (login_on and login):
        raise OptionError(
            f"--web-host {shown}: a web UI other machines can reach needs a login: add --web-login and set "
            f"{CREDENTIALS_ENV}=USER:PASSWORD (or --web-credentials), or leave --web-host at {LOOPBACK}"
        )
    if login_on and login is None:
        raise OptionError(f"--web-login: set the user and password it asks for: {CREDENTIALS_ENV}=USER:PASSWORD "
                          "(or --web-credentials)")  # fmt: skip
    if login is not None and not login_on:
        raise OptionError("--web-credentials: a login is asked for only with --web-login; add it")
    return WebAccess(bind=bind, login=login)


def forget_credentials(opts: Any) -> None:
    """Locust sends the master's parsed options to every worker that connects (no authentication): the
    password leaves them once the login holds it."""
    if opts is not None and getattr(opts, "web_credentials", None):
        opts.web_credentials = ""


def install_login(web_ui: Any, user: str, password: str, base_path: str = "") -> None:
    """Locust's ``--web-login`` page checks this one user and password (constant-time)."""
    from flask import Blueprint, redirect, request, session, url_for
    from flask_login import UserMixin, login_user
    from werkzeug.wrappers import Response

    class Operator(UserMixin):  # type: ignore[misc]
        def __init__(self, name: str) -> None:
            self.id = name

    def load_user(user_id: str) -> Operator | None:
        return Operator(user_id) if hmac.compare_digest(user_id.encode(), user.encode()) else None

    web_ui.login_manager.user_loader(load_user)
    web_ui.app.config["SECRET_KEY"] = secrets.token_hex(32)  # sessions end with the process
    web_ui.auth_args = {"username_password_callback": f"{base_path}{LOGIN_ROUTE}"}
    bp = Blueprint("tailgate_login", __name__, url_prefix=base_path or None)

    @bp.route(LOGIN_ROUTE, methods=["POST"])
    def login_submit() -> Response:
        name = str(request.form.get("username") or "")
        given = str(request.form.get("password") or "")
        user_ok = hmac.compare_digest(name.encode(), user.encode())
        password_ok = hmac.compare_digest(given.encode(), password.encode())
        if user_ok and password_ok:
            login_user(Operator(user))
            return redirect(url_for("locust.index"))
        session["auth_error"] = "Wrong user name or password"
        return redirect(url_for("locust.login"))

    web_ui.app.register_blueprint(bp)


def origin(url: str) -> tuple[str, str, int] | None:
    """Scheme, host and port of a server URL (its path does not change which machine gets the load)."""
    try:
        t = Target.parse(url)
    except TargetError:
        return None
    return (t.scheme, t.host.lower(), t.port)


@dataclass(frozen=True)
class AllowList:
    """The servers a Start from the form may name, fixed at launch: the form can neither see nor widen it."""

    hosts: tuple[str, ...]
    """As given: ``--host`` then every ``--allow-host``."""
    metrics_urls: tuple[str, ...] = ()
    """``--metrics-url`` / ``--prometheus-url`` given at launch: allowed for those options whatever their host."""

    @classmethod
    def at_launch(cls, opts: Any, host: str | None) -> AllowList:
        given = [host or "", *(getattr(opts, "allow_host", None) or ())]
        extra = [str(getattr(opts, name, "") or "") for name in ("metrics_url", "prometheus_url")]
        return cls(tuple(h.strip() for h in given if h and h.strip()), tuple(u for u in extra if u))

    def _origins(self, urls: Iterable[str]) -> set[tuple[str, str, int]]:
        return {o for o in map(origin, urls) if o is not None}

    def refusal(self, option: str, url: str) -> str | None:
        """None when ``url`` may be loaded, else the one line that says why not. A URL that does not parse
        is left to the option's own check, which names the fault (nothing is sent for it either)."""
        if not url.strip():
            return None
        wanted = origin(url)
        if wanted is None:
            return None
        allowed = self._origins(self.hosts)
        if option != "--host":
            allowed |= self._origins(self.metrics_urls)
        if wanted in allowed:
            return None
        scheme, host, port = wanted
        shown = f"{scheme}://{host}:{port}"
        if not self.hosts:
            return (f"{option}: {shown} is not allowed: this web UI was started without --host or --allow-host, "
                    f"so its form may load no server; start Locust with --allow-host {shown}")  # fmt: skip
        return (f"{option}: {shown} is not one of the servers this web UI may load ({', '.join(self.hosts)}); "
                f"start Locust with --allow-host {shown} to allow it")  # fmt: skip
