"""Kernel receive stamps: turning them on for a socket, choosing them as a chunk's instant, putting the
kernel's wall-clock stamps on the ``perf_counter_ns`` clock the stream is timed on, and checking that the
kernel's wall clock agrees with this process's before a load process trusts them.

Kept apart from the streaming client so its module holds the stream itself; the read that unpacks a
stamp (``reads.read_stamped``) lives with the stream's reads, since it runs once per chunk.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable

SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
"""Linux's receive-timestamp option (``SO_TIMESTAMPNS_OLD``, 35; Python does not name it). With it, every
``recvmsg`` on a TCP socket also returns when the kernel received the newest bytes it hands over."""
TS_SPACE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
"""Ancillary buffer room for one ``timespec``; 0 where ``recvmsg`` cannot carry one."""
TIMESPEC = struct.Struct("qq")
SOL_SOCKET = socket.SOL_SOCKET

CHUNK_STAMPS = ("recv", "kernel")
CHUNK_STAMP_ENV = "TAILGATE_CHUNK_STAMP"
DEFAULT_CHUNK_STAMP = "kernel"
"""Which instant stamps a read's events: ``kernel`` (the kernel's receive time of the newest bytes in the
read, the default) or ``recv`` (when ``recvmsg`` returned). A read without a kernel stamp (TLS) falls back
to ``recv``. The self-check reports both from the same reads; the kernel stamp's error was lower at every
percentile (benchmarks/results/chunk-stamp.md), because it does not include the time the loop took to
come back to the socket."""


def chunk_stamp_mode() -> str:
    """The chunk stamp chosen through ``TAILGATE_CHUNK_STAMP`` (``DEFAULT_CHUNK_STAMP`` when unset or unknown)."""
    mode = os.environ.get(CHUNK_STAMP_ENV, DEFAULT_CHUNK_STAMP).strip().lower()
    return mode if mode in CHUNK_STAMPS else DEFAULT_CHUNK_STAMP


def enable_rx_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp received bytes; False where it cannot (TLS, no ``recvmsg``, not Linux)."""
    if SO_TIMESTAMPNS is None or not TS_SPACE or isinstance(sock, ssl.SSLSocket):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


PAIR_NS = 20_000
"""Two reads of the clock around a wall-clock read closer than this make a pair to convert with."""
FIRST_ATTEMPTS = 200
"""Triples the first measurement may take to find a tight one: every later one is judged against it."""
REFRESH_NS = 20_000_000
"""How often the offset between the wall clock and ``perf_counter_ns`` is measured again, to notice a step.

Linux slews ``CLOCK_REALTIME`` and ``CLOCK_MONOTONIC`` together (NTP's frequency corrections apply to
both), so their difference changes only when the wall clock is stepped. A new measurement therefore
replaces the offset in use only when it is tighter (a better estimate of the same offset) or cannot be
the same offset (its interval and the current one's do not overlap: a step)."""


class WallToClock:
    """Converts the kernel's wall-clock receive stamps to ``perf_counter_ns`` ticks, with one offset.

    A measurement is a (clock, wall, clock) triple: the true offset lies within half the triple's width
    of its midpoint. On a busy machine a triple can be preempted and be hundreds of microseconds wide;
    adopting each new one would move the conversion by up to half that between two stamps of one stream,
    enough to put a kernel-stamped chunk before the request that caused it was written. So the offset in
    use is the tightest measured, changed only by a tighter one or by a step of the wall clock.
    Measured at most every ``REFRESH_NS`` and shared by every stream of the process.
    """

    __slots__ = ("_clock", "_measured", "_offset", "_wall", "_width")

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns, wall: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._wall = wall
        self._offset = 0
        self._width: int | None = None
        self._measured = -(1 << 62)

    @property
    def uncertainty_ns(self) -> int | None:
        """Half the width of the measurement in use: how far the offset may be from the true one."""
        return None if self._width is None else self._width // 2 + 1

    def to_clock(self, wall_ns: int, now: int) -> int:
        """``wall_ns`` on the clock, ``now`` being a current reading of it (to know when to re-measure)."""
        if now - self._measured > REFRESH_NS:
            self.measure()
        return wall_ns - self._offset

    def measure(self) -> None:
        """Take the tightest of up to five (clock, wall, clock) triples; keep it if it is a better estimate
        of the offset in use, or if the wall clock was stepped since."""
        clock, wall = self._clock, self._wall
        width = offset = after = 0
        for attempt in range(5 if self._width is not None else FIRST_ATTEMPTS):
            before = clock()
            real = wall()
            after = clock()
            w = after - before
            if attempt == 0 or w < width:
                width, offset = w, real - (before + after) // 2
            if w <= PAIR_NS:
                break
        self._measured = after
        old = self._width
        if old is None or width <= old or 2 * abs(offset - self._offset) > width + old + 2:
            self._offset, self._width = offset, width


WALL = WallToClock()
"""The process's one converter, shared by every stream."""


STAMP_AGREE_MS = 5.0
"""Kernel receive stamps are used only while the kernel's wall clock and this process's agree to within this.
They disagree under libfaketime (it shifts or speeds the process's clock, not the kernel's), and every chunk
stamped with the kernel's clock would then be off by the difference: TTFTs of -5 s under ``+5s``."""


def kernel_clock_disagreement_ms() -> float | None:
    """This process's wall clock minus the kernel's, from a datagram sent to itself (the smallest of three
    tries: a preemption between the receive and the read only adds). None where there are no receive stamps."""
    if SO_TIMESTAMPNS is None:
        return None
    best: float | None = None
    try:
        udp = (socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(*udp) as rx, socket.socket(*udp) as tx:
            rx.bind(("127.0.0.1", 0))
            rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            rx.settimeout(1.0)
            for _ in range(3):
                tx.sendto(b"t", rx.getsockname())
                _, ancillary, _, _ = rx.recvmsg(16, socket.CMSG_SPACE(16))
                now = time.time_ns()
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                        sec, nsec = struct.unpack_from("qq", payload)
                        diff = (now - (sec * 1_000_000_000 + nsec)) / 1e6
                        best = diff if best is None or abs(diff) < abs(best) else best
    except OSError:
        return None
    return best
