"""How a run's coordinator reaches the processes that send: one interface, two roles.

A run is coordinated in one process (Locust's local runner, or its master) and its load is sent by one
process or by several workers. The coordinator's stages are the same either way; what differs is how an order
gets to a load process and its DONE back, how a stop reaches them, where the counters of sent and ended
requests come from and whether a process can be lost. :class:`OneProcess` and :class:`WorkerProcesses` are
those two answers, so the coordinator asks its links instead of asking which it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tailgate.contracts import Order, OrderDone
from tailgate.load.options import Settings
from tailgate.load.peers import PeerGate
from tailgate.load.worker import CANCEL_MESSAGE, ORDER_MESSAGE, order_runner


class OneProcess:
    """The run's load in the coordinator's own process: an order goes to its order runner and its DONE, with
    the order's records, comes straight back typed; nothing is sent as a message, and nothing can be lost."""

    can_lose = False
    """A process that can be lost has its share closed by the coordinator; this one stops with the run."""
    measures_clocks = False
    """One clock: no round trip to measure before a stage."""

    def __init__(self, runner: Any, on_done: Callable[[str, OrderDone], None]) -> None:
        self.runner = runner
        self._on_done = on_done

    def send_order(self, node: str, order: Order) -> None:
        order_runner(self.runner.environment).submit(order, reply=lambda done: self._on_done(node, done))

    def cancel(self, nodes: Iterable[str], run_id: str) -> None:
        order_runner(self.runner.environment).cancel()

    def sent_ended(self, reported: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        """Read straight from the one order runner's counters."""
        local = order_runner(self.runner.environment)
        return local.sent, local.ended

    def lost_reason(self, node: str) -> str | None:
        return None

    def admitted(self, node: str, settings: Settings) -> bool:
        return True

    def key_in_orders(self, settings: Settings) -> str | None:
        """The API key travels in the order: it never leaves this process."""
        return settings.api_key


class WorkerProcesses:
    """The run's load in Locust workers: orders and stops are messages to them, their counters are what they
    last reported, and one that stops answering is lost (its share then closed by the coordinator)."""

    can_lose = True
    measures_clocks = True

    def __init__(self, runner: Any, gate: PeerGate | None) -> None:
        self.runner = runner
        self.gate = gate

    def send_order(self, node: str, order: Order) -> None:
        self.runner.send_message(ORDER_MESSAGE, order.to_dict(), client_id=node)

    def cancel(self, nodes: Iterable[str], run_id: str) -> None:
        """To the processes of this run only: a peer that never showed the key hears nothing of it."""
        for node in sorted(nodes):
            self.runner.send_message(CANCEL_MESSAGE, {"run_id": run_id}, client_id=node)

    def sent_ended(self, reported: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        """The sum of what each process last reported (every few seconds, and exactly at each DONE): never the
        record files, whose re-reading grew with the run and held the loop that timestamps the streams."""
        return sum(c[0] for c in reported.values()), sum(c[1] for c in reported.values())

    def lost_reason(self, node: str) -> str | None:
        """Why a worker can no longer take part (Locust's heartbeat marked it missing, or it left)."""
        client = self.runner.clients.get(node)
        if client is None:
            return "disconnected from the master"
        if client.state == "missing":
            return "stopped sending heartbeats (missing)"
        return None

    def admitted(self, node: str, settings: Settings) -> bool:
        """Only a worker that proved it holds the key takes part (no key: every worker)."""
        return not settings.api_key or (self.gate is not None and self.gate.admitted(node))

    def key_in_orders(self, settings: Settings) -> str | None:
        """Orders cross the network: the key went once at connect instead (the workers' environment)."""
        return None


LoadLinks = OneProcess | WorkerProcesses


__all__ = ["LoadLinks", "OneProcess", "WorkerProcesses"]
