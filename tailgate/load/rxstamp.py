"""Kernel receive stamps: turning them on for a socket, choosing them as a chunk's instant, and putting
the kernel's wall-clock stamps on the ``perf_counter_ns`` clock the stream is timed on.

Kept apart from the streaming client so its module holds the stream itself; the read that unpacks a
stamp (``client._read``) stays there, since it runs once per chunk.
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
REFRESH_NS = 20_000_000
"""How long a measured offset between the wall clock and ``perf_counter_ns`` is used before it is
measured again. Only a slewing wall clock moves it: NTP slews at most 500 ppm, 10 us over this
interval, and in practice a few ppm (well under 0.1 us)."""


class WallToClock:
    """Converts the kernel's wall-clock receive stamps to ``perf_counter_ns`` ticks.

    Measuring the offset costs three clock reads and must be a tight pair (a preemption between the
    reads would shift it by milliseconds on a busy machine), so it is measured at most every
    ``REFRESH_NS`` and shared by every stream of the process, instead of once per read.
    """

    __slots__ = ("_clock", "_measured", "_offset")

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock = clock
        self._offset = 0
        self._measured = -(1 << 62)

    def to_clock(self, wall_ns: int, now: int) -> int:
        """``wall_ns`` on the clock, ``now`` being a current reading of it (to know when to re-measure)."""
        if now - self._measured > REFRESH_NS:
            self.measure()
        return wall_ns - self._offset

    def measure(self) -> None:
        """The tightest of up to five (clock, wall, clock) triples sets the offset (wall minus clock)."""
        clock, wall = self._clock, time.time_ns
        best_width = best_offset = 0
        for attempt in range(5):
            before = clock()
            real = wall()
            after = clock()
            width = after - before
            if attempt == 0 or width < best_width:
                best_width, best_offset = width, real - (before + after) // 2
            if width <= PAIR_NS:
                break
        self._offset = best_offset
        self._measured = after


WALL = WallToClock()
"""The process's one converter, shared by every stream."""
