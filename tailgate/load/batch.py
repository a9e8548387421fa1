"""The gated arm's send: a batch's requests reach the server in trace order, every time.

gevent resumes greenlets whose connects completed in the reverse of the order they started
(last-in first-out), so sixteen greenlets that each connect and then write their own request put
a batch on the wire reversed, and a server that admits requests in arrival order saw it that way.
Here every request still connects in its own greenlet (the batch connects in parallel and each
send stamp is its own), but the writes happen in one place, in trace order, once every
connection of the batch is up or has failed.
"""

from __future__ import annotations

from gevent.event import Event

import time
from collections.abc import Callable
from typing import Any


class BatchGate:
    """Writes the requests of one gated batch in trace order, from one place, once every connection is up.

    Each request's greenlet stamps its send and connects on its own, so the batch connects in parallel; it
    then hands its socket and request bytes to the gate and waits. The dispatcher writes them in slot
    (trace) order in one pass. Left to their own greenlets, the writes would follow the order in which
    gevent resumes connect completions, which is last-in first-out: the server saw each batch reversed.
    """

    def __init__(self, size: int) -> None:
        self._slots: list[_Slot | None] = [None] * size
        self._checked = [False] * size
        self._pending = size
        self._all_in = Event()
        if size == 0:
            self._all_in.set()

    def writer(self, index: int) -> Callable[[Any, bytes], int]:
        """The ``write`` callable that request ``index`` of the batch hands its connected socket to."""

        def write(sock: Any, data: bytes) -> int:
            slot = _Slot(sock, data)
            self._slots[index] = slot
            self._check_in(index)
            slot.done.wait()
            if slot.error is not None:
                raise slot.error
            return slot.written_ns

        return write

    def leave(self, index: int) -> None:
        """Request ``index`` will not write (it failed to connect, or was cancelled); idempotent."""
        self._check_in(index)

    def _check_in(self, index: int) -> None:
        if not self._checked[index]:
            self._checked[index] = True
            self._pending -= 1
            if self._pending == 0:
                self._all_in.set()

    def flush(self) -> None:
        """Wait until every request connected (or gave up), then write them all in trace order."""
        self._all_in.wait()
        clock = time.perf_counter_ns
        for slot in self._slots:
            if slot is None:
                continue
            try:
                slot.sock.sendall(slot.data)
            except OSError as e:  # raised in the request's own greenlet, which classifies it
                slot.error = e
            slot.written_ns = clock()
        for slot in self._slots:  # wake the readers only after the last write, in trace order
            if slot is not None:
                slot.done.set()


class _Slot:
    __slots__ = ("data", "done", "error", "sock", "written_ns")

    def __init__(self, sock: Any, data: bytes) -> None:
        self.sock = sock
        self.data = data
        self.done = Event()
        self.error: OSError | None = None
        self.written_ns = 0
