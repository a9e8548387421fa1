"""Which peers of the master port hear anything about a run, and which are sent away.

Locust's master answers any peer that says ``client_ready`` and sends it ``spawn``: the target host, the
results folder, the trace file, the bind address, the rates and every other parsed option. Locust has no
authentication, so the master does it here, before the run says anything:

- **Challenged at connect.** Every peer is challenged the moment it connects (and again every
  :data:`RECHALLENGE_S` until it answers): an HMAC of a fresh nonce under the API key, the key itself never
  sent (:func:`tailgate.load.distributed.proof`).
- **Spawn held until the proof.** While the master has a key, Locust's ``spawn`` to a peer that has not shown
  it holds the same key is held back, not sent; the newest one goes out when the proof arrives. A peer that
  cannot show it (no key, another key, no answer) never gets one, so it never runs a user, never says it is
  ready and is never given an order: all it hears is Locust's ``ack``, heartbeats, the user count of
  ``spawning_complete``, ``quit`` and the challenge.
- **Written off means gone.** A load process a run wrote off (lost mid-stage, or before a stage) has its share
  accounted already; when it is heard again (a partition heals, a frozen process thaws) it is told to quit,
  instead of idling as a Locust worker until the run's end.
"""

from __future__ import annotations

import gevent
from locust.rpc import Message

import logging
import time
from collections.abc import Callable
from typing import Any

from tailgate.load import distributed

log = logging.getLogger("tailgate")

RECHALLENGE_S = 1.0
"""An unanswered challenge is sent again this often (a worker that registered its handler late)."""
WATCH_S = 0.5
"""How often the master looks for written-off processes that are back."""
MISSING = "missing"


def _message(kind: str, data: Any, node: str) -> Message:
    """Locust's RPC message (its constructor is unannotated)."""
    make: Callable[[str, Any, str], Message] = Message
    return make(kind, data, node)


class PeerGate:
    """The master's admission of peers: challenges, held spawns, refusals, and quitting written-off processes."""

    def __init__(self, runner: Any, key: Callable[[], str | None]) -> None:
        self.runner = runner
        self.key = key
        """The key in force (the pending or running run's): checked when a spawn is about to go out."""
        self.nonces: dict[str, str] = {}
        self.answers: dict[str, str | None] = {}
        """Node -> the proof it answered with (None: it has no key; ``""``: not a text, so no proof)."""
        self.names: dict[str, str] = {}
        self.held: dict[str, Message] = {}
        """Node -> the newest ``spawn`` held back from it."""
        self.written_off: set[str] = set()
        self.told_to_quit: list[str] = []
        self._asked: dict[str, float] = {}
        self._send: Callable[[Any], Any] | None = None
        self._server: Any = None
        self._watcher: gevent.Greenlet | None = None

    # -- wiring ------------------------------------------------------------------------------------
    def install(self) -> None:
        self.runner.environment.events.worker_connect.add_listener(self.on_connect)
        self.runner.register_message(distributed.PROOF_MESSAGE, self.on_proof)
        self._wrap()
        self._watcher = gevent.spawn(self._watch)

    def _wrap(self) -> None:
        """Every message to a peer passes here; Locust's RPC server is replaced after a connection reset."""
        server = self.runner.server
        if server is self._server:
            return
        send = server.send_to_client

        def gated(msg: Any) -> Any:
            if msg.type == "spawn" and not self.admitted(msg.node_id):
                self.held[msg.node_id] = msg
                self.challenge(msg.node_id)
                return None
            return send(msg)

        server.send_to_client = gated
        self._server, self._send = server, send

    def _raw(self, msg: Any) -> None:
        self._wrap()
        assert self._send is not None
        self._send(msg)

    # -- the proof -----------------------------------------------------------------------------------
    def admitted(self, node: str) -> bool:
        """The peer may hear about the run: no key to prove, or it showed it holds the key in force."""
        key = self.key()
        if not key:
            return True
        nonce = self.nonces.get(node)
        return nonce is not None and node in self.answers and distributed.proof_ok(key, nonce, self.answers[node])

    def refusal(self, node: str) -> str | None:
        """Why an answered peer is not admitted (None: admitted, or no answer yet)."""
        if node not in self.answers or self.admitted(node):
            return None
        why = "has no key" if self.answers[node] is None else "holds another key"
        return f"{self.names.get(node, node)} {why}"

    def refusals(self) -> dict[str, str]:
        """Connected peers that answered and cannot show the key in force."""
        out = {}
        for node in list(self.runner.clients.keys()):
            why = self.refusal(node)
            if why:
                out[node] = why
        return out

    def on_connect(self, client_id: str, **_: Any) -> None:
        if client_id in self.answers and self.admitted(client_id):
            return  # a worker saying ready again after a stop: it proved the key on this connection already
        self.nonces[client_id] = distributed.new_nonce()
        self.answers.pop(client_id, None)
        self._asked.pop(client_id, None)
        self.challenge(client_id)

    def challenge(self, node: str) -> None:
        if node in self.answers:
            return
        nonce = self.nonces.setdefault(node, distributed.new_nonce())
        now = time.monotonic()
        if now - self._asked.get(node, -RECHALLENGE_S) < RECHALLENGE_S:
            return
        self._asked[node] = now
        self._raw(_message(distributed.CHALLENGE_MESSAGE, {"nonce": nonce}, node))

    def on_proof(self, environment: Any, msg: Any, **_: Any) -> None:
        node, data = msg.node_id, msg.data or {}
        if data.get("nonce") != self.nonces.get(node) or node in self.answers:
            return  # an answer to another challenge, or a second one
        answer = data.get("proof")
        self.answers[node] = answer if answer is None or isinstance(answer, str) else ""
        if data.get("worker"):
            self.names[node] = str(data["worker"])
        held = self.held.pop(node, None)
        if held is None:
            return
        if self.admitted(node):
            self._raw(held)
        else:
            self.held[node] = held

    # -- written off -----------------------------------------------------------------------------------
    def write_off(self, node: str) -> None:
        """A run closed this process's share: once it is heard again, it is told to quit."""
        self.written_off.add(node)

    def _watch(self) -> None:
        while True:
            gevent.sleep(WATCH_S)
            try:
                self._look()
            except Exception:  # the watch must outlive any one bad turn
                log.exception("tailgate: peer watch")

    def _look(self) -> None:
        self._wrap()
        clients = self.runner.clients
        for node in sorted(self.written_off):
            client = clients.get(node)
            if client is None or client.state == MISSING:
                continue
            self.written_off.discard(node)
            self.told_to_quit.append(node)
            log.warning("tailgate: load process %s, written off earlier, is back: told to quit",
                        self.names.get(node, node))  # fmt: skip
            self._raw(_message("quit", None, node))
        for node in list(clients.keys()):
            if node not in self.answers:
                self.challenge(node)
