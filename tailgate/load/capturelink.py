"""The load process's side of packet-capture stamps: which stamp source a process uses, its capture process,
and giving a finished stream's chunks their segments' arrival times.

The stream itself is stamped in-process as always (``kernel``); only when its record is built, away from
the path that stamps chunks, is its connection's list of segments asked for and each chunk given the
arrival of the segment that completed it. A stream the capture cannot account for (a dropped segment, a
capture process gone) keeps its in-process stamps and says so in its record (``chunk_stamp``).
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from tailgate.contracts import CaptureStats, OrderDone
from tailgate.jsontypes import JsonMapping, JsonObject, as_object, json_int, json_list, json_opt_int
from tailgate.load.capture import chunk_times
from tailgate.load.target import Target
from tailgate.load.timing import StreamTiming
from tailgate.stats import worst_gap

log = logging.getLogger(__name__)

READY_S = 30.0
"""How long a capture process may take to say it is capturing before the run goes on without it: a Python
start-up on two cores under full CPU stress was seen to take over 10 s."""
QUERY_S = 5.0


def capture_refusal(target: Target) -> str | None:
    """Why packet capture cannot stamp this target's streams here, in one line; None when it can."""
    if target.scheme == "https":
        return "the stream is TLS: its bytes on the wire are not the response's"
    if not sys.platform.startswith("linux") or not hasattr(socket, "AF_PACKET"):
        return "packet sockets are Linux's"
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0).close()
    except PermissionError:
        return "not permitted (no CAP_NET_RAW)"
    except OSError as e:
        return f"no packet socket: {e}"
    return None


class CaptureLink:
    """One capture process for one server port, and the socket it answers queries on."""

    def __init__(self, port: int) -> None:
        self.port = port
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tailgate.load.capture", "--port", str(port), "--fd", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        self._sock = ours
        self._buf = b""
        self._lock = threading.Lock()
        """One query at a time: the record sink and the order's final drain may both ask (under gevent's
        monkey-patching this lock is cooperative)."""
        ours.settimeout(READY_S)
        first = self._line()
        if not first.get("ready"):
            self.close()
            raise OSError(str(first.get("error") or "the capture process did not start"))
        ours.settimeout(QUERY_S)

    def _line(self) -> JsonMapping:
        """The capture process's next answer: one JSON object a line (ValueError when it is not one)."""
        while b"\n" not in self._buf:
            data = self._sock.recv(1 << 20)
            if not data:
                raise OSError("the capture process ended")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return as_object(json.loads(line), where="capture process")

    def ask(self, query: JsonObject) -> JsonMapping:
        with self._lock:
            self._sock.sendall((json.dumps(query) + "\n").encode())
            return self._line()

    def ended(self) -> bool:
        """Whether its capture process has ended."""
        return self.proc.poll() is not None

    def close(self) -> None:
        self._sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class StampSource:
    """The stamp source of one load process: the one asked for, or the fallback it had to take, with why."""

    def __init__(self) -> None:
        self.link: CaptureLink | None = None
        self.capture = False
        self.note: str | None = None
        self.missed = 0
        """Streams the capture could not account for in this order (they kept their in-process stamps)."""
        self._refused: str | None = None
        self._seen = (0, 0)
        """Segments and drops the capture had counted at the end of the last order."""

    def prepare(self, requested: str, target: Target) -> None:
        """Before an order: start (or keep) the capture process for ``target``'s port when capture is asked
        for and permitted; else the in-process stamp, with one line saying why."""
        self.missed = 0
        if requested != "capture":
            self.capture = False
            return
        if self.link is not None and (self.link.port != target.port or self.link.ended()):
            self.link.close()
            self.link = None
        if self.link is None and self._refused is None:
            refusal = capture_refusal(target)
            if refusal is None:
                try:
                    self.link = CaptureLink(target.port)
                except OSError as e:
                    refusal = f"the capture process failed: {e}"
            if refusal is not None:
                self._refused = refusal
                self.note = f"packet capture {refusal}: chunks stamped with kernel receive stamps instead"
                log.warning("tailgate: %s", self.note)
        self.capture = self.link is not None

    def apply(self, timing: StreamTiming, fallback: str) -> None:
        """Give ``timing``'s chunks their segments' arrival times, or leave the in-process ones (``fallback``)."""
        timing.stamp = fallback
        if not self.capture or self.link is None or timing.conn_key is None or not timing.chunk_last_bytes:
            return
        try:
            answer = self.link.ask({"conn": timing.conn_key, "after": timing.sent_ns, "before": timing.connected_ns})
            times = None
            isn = json_opt_int(answer, "isn", where="capture process")
            if isn is not None and len(timing.chunk_last_bytes) == timing.chunks:
                # [seq, length, time] triples; one of another shape fails in chunk_times, within this try
                segs = cast(Sequence[Sequence[int]], json_list(answer, "segs", where="capture process"))
                times = chunk_times(isn, segs, timing.chunk_last_bytes)
        except Exception as e:  # whatever went wrong, the record is still written, with its own stamps
            log.warning("tailgate: capture process unusable (%s): kernel receive stamps from now on", e)
            self.capture = False
            self.note = f"the capture process was lost mid-run ({type(e).__name__}: {e}): later chunks kernel-stamped"
            return
        if times is None or not causal(timing, times):
            self.missed += 1
            return
        apply_times(timing, times)

    def stats(self) -> CaptureStats | None:
        """Segments the capture saw and dropped during this order, and the streams it could not account for."""
        if not self.capture or self.link is None:
            return None
        try:
            got = self.link.ask({"stats": 1})
        except (OSError, ValueError):
            return None
        packets, drops = json_int(got, "packets", 0), json_int(got, "drops", 0)
        seen, self._seen = self._seen, (packets, drops)
        return CaptureStats(packets=packets - seen[0], drops=drops - seen[1], missed_streams=self.missed)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None


@dataclass(frozen=True)
class StampUse:
    """A stage's stamp sources as its load processes used them, and what their captures dropped or missed;
    named as the stage summary names them."""

    chunk_stamp: str | None
    capture_drops: int | None
    """None when no process captured: no capture, not a capture without drops."""
    capture_missed_streams: int | None


def stamp_summary(results: Iterable[OrderDone]) -> StampUse:
    """Every source any process used, joined, so a stage stamped two ways says so."""
    done = list(results)
    stamps = sorted({r.stamp for r in done if r.stamp})
    caps = [r.capture for r in done if r.capture is not None]
    return StampUse(
        chunk_stamp=",".join(stamps) or None,
        capture_drops=sum(c.drops for c in caps) if caps else None,
        capture_missed_streams=sum(c.missed_streams for c in caps) if caps else None,
    )


CAUSAL_SLACK_NS = 20_000_000
"""How far a segment's arrival may seem to follow the in-process stamp of the read that returned its bytes,
or precede the request's write: the two processes' conversions of the kernel's wall clock agree to tens of
microseconds on a quiet host and were seen a millisecond or two apart under full CPU stress. A wrong
join is a whole stream off, seconds on the hosts where it was seen."""


def causal(timing: StreamTiming, times: list[int]) -> bool:
    """Whether capture times can be this stream's: a segment arrives after the request was written and
    before the read that returned it (whose in-process stamp, kernel or recv, is never earlier).

    Whatever joined the wrong segments to a stream, this refuses it rather than give the stream another
    connection's times."""
    sent = timing.written_ns if timing.written_ns is not None else timing.sent_ns
    if times[0] < sent - CAUSAL_SLACK_NS:
        return False
    read = timing.chunk_ns
    if read is not None and len(read) == len(times):
        return all(t <= r + CAUSAL_SLACK_NS for t, r in zip(times, read, strict=True))
    first, last = timing.first_chunk_ns, timing.last_chunk_ns
    return (first is None or times[0] <= first + CAUSAL_SLACK_NS) and (
        last is None or times[-1] <= last + CAUSAL_SLACK_NS
    )


def apply_times(timing: StreamTiming, times: list[int]) -> None:
    """Chunk times from the capture in place of the in-process ones: first, last, worst gap, every chunk.

    No read can merge chunks any more, so the stream is no longer the client's to answer for
    (``late_coalesced_reads`` still counts the late reads, for the record)."""
    timing.stamp = "capture"
    timing.first_chunk_ns, timing.last_chunk_ns = times[0], times[-1]
    timing.worst_gap_ns, timing.worst_gap_end_ns = worst_gap(times)
    if timing.chunk_ns is not None:
        timing.read_chunk_ns = timing.chunk_ns
        timing.chunk_ns = times


__all__ = ["CaptureLink", "StampSource", "StampUse", "apply_times", "capture_refusal", "causal", "stamp_summary"]
