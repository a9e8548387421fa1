"""Packet-capture stamps: the kernel's arrival time of every TCP segment from the server, from its own process.

Any stamp the load process takes itself depends on it being on time: the kernel keeps one receive stamp
per read, so a reader that comes back 30 ms late gets one instant for every segment that waited. A
packet socket (``AF_PACKET``) is handed a copy of each segment as the network stack receives it, stamped
there, before TCP queues it for the reader; this process reads those copies and keeps, per connection,
each segment's sequence number, length and stamp. When a stream has ended the load process asks for its
connection's segments (by 4-tuple) and gives each chunk the arrival of the segment that completed it
(:func:`chunk_times`), however late it read the chunk.

The socket is ``SOCK_DGRAM`` (no link-layer header, so any interface type works) with a classic BPF
filter: IPv4 or IPv6 TCP from the server's port, not outgoing. On loopback every packet is seen twice,
once leaving (``PACKET_OUTGOING``) and once arriving; the filter keeps the arrival. Only the headers are
copied (the filter returns :data:`SNAP` bytes); a payload's length comes from the IP header. Drops (the
socket buffer full) are counted by the kernel (``PACKET_STATISTICS``) and reported.

Run as ``python -m tailgate.load.capture --port P --fd N``: ``N`` is a connected Unix stream socket on
which it answers one JSON line per query line. One per load process: each copies and parses every segment
from the server's port (a process shared by a host's load processes is not built). No gevent here: this
process only reads sockets.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Sequence

from tailgate.load.rxstamp import SO_TIMESTAMPNS, TIMESPEC, TS_SPACE, WallToClock

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
SO_RCVBUFFORCE = 33
SO_ATTACH_FILTER = 26
SNAP = 160
"""Bytes copied per packet: the largest IPv4 (60) or IPv6 (40) header plus the largest TCP header (60)."""
RCVBUF = 64 << 20
"""Packet socket buffer: about 300,000 header-only copies, seconds of a busy host if this process stalls."""
DRAIN_S = 0.005
"""How often the packet socket is read when no query comes (a query drains it first). The segments carry
their kernel stamps, so reading them in batches changes nothing but how many wait in the buffer (at 25,000
segments/s, about 125 of its 300,000). Woken for every segment instead, this process used about 40% more
CPU (0.85-0.96 s against 1.23-1.40 s for 50,000 chunks at 50 req/s, 2-core VM)."""
EXPIRE_S = 300.0
"""A connection nobody asked for within this long after its last segment is forgotten."""
SEQ_MOD = 1 << 32
_V4 = struct.Struct("!2xH8x8s")
"""IPv4: total length, then source and destination addresses."""
_V6 = struct.Struct("!4xH2x32s")
"""IPv6: payload length, then source and destination addresses."""
_TCP = struct.Struct("!4xI4xH")
"""TCP after the ports: sequence number, then data offset and flags in one 16-bit word."""
_STATS = struct.Struct("II")


def bpf_program(port: int) -> bytes:
    """A ``struct sock_fprog`` body: keep incoming IPv4/IPv6 TCP segments whose source port is ``port``."""
    ld_w_abs, ld_b_abs, ld_h_abs, ld_h_ind = 0x20, 0x30, 0x28, 0x48
    ldx_msh, rsh, jeq, jset, ret = 0xB1, 0x74, 0x15, 0x45, 0x06
    pkttype = 0xFFFFF000 + 4  # SKF_AD_OFF + SKF_AD_PKTTYPE
    accept, drop = 17, 18
    ops = [
        (ld_w_abs, 0, 0, pkttype),  # 0
        (jeq, drop - 2, 0, PACKET_OUTGOING),  # 1: a copy leaving this host
        (ld_b_abs, 0, 0, 0),  # 2: IP version
        (rsh, 0, 0, 4),  # 3
        (jeq, 1, 0, 4),  # 4: IPv4 -> 6
        (jeq, 7, drop - 6, 6),  # 5: IPv6 -> 13
        (ld_b_abs, 0, 0, 9),  # 6: IPv4 protocol
        (jeq, 0, drop - 8, 6),  # 7: TCP
        (ld_h_abs, 0, 0, 6),  # 8: flags and fragment offset
        (jset, drop - 10, 0, 0x1FFF),  # 9: not the first fragment
        (ldx_msh, 0, 0, 0),  # 10: X = IPv4 header length
        (ld_h_ind, 0, 0, 0),  # 11: TCP source port
        (jeq, accept - 13, drop - 13, port),  # 12
        (ld_b_abs, 0, 0, 6),  # 13: IPv6 next header
        (jeq, 0, drop - 15, 6),  # 14: TCP
        (ld_h_abs, 0, 0, 40),  # 15: TCP source port
        (jeq, accept - 17, drop - 17, port),  # 16
        (ret, 0, 0, SNAP),  # 17: accept
        (ret, 0, 0, 0),  # 18: drop
    ]
    assert len(ops) == drop + 1
    return b"".join(struct.pack("HBBI", *op) for op in ops)


def attach_filter(sock: socket.socket, port: int) -> None:
    import ctypes

    prog = bpf_program(port)
    buf = ctypes.create_string_buffer(prog)
    fprog = struct.pack("HL", len(prog) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def open_capture(port: int) -> socket.socket:
    """The filtered packet socket with kernel stamps; ``PermissionError`` without ``CAP_NET_RAW``."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
    try:
        attach_filter(sock, port)
        if SO_TIMESTAMPNS is None:  # not Linux: no packet sockets either
            raise PermissionError("kernel packet stamps need Linux")
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        sock.setblocking(False)
        # segments that passed before the filter was attached may sit in the queue: drop them
        while True:
            try:
                sock.recv(SNAP)
            except BlockingIOError:
                break
        sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATS.size)  # reading resets the counters
    except BaseException:
        sock.close()
        raise
    return sock


def connection_key(server: tuple[str, int], client: tuple[str, int]) -> str:
    """How a connection is named on both sides: server address and port, then the client's, as hex."""
    family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    raw = (
        socket.inet_pton(family, server[0])
        + socket.inet_pton(family, client[0])
        + server[1].to_bytes(2, "big")
        + client[1].to_bytes(2, "big")
    )
    return raw.hex()


JOIN_SLACK_NS = 20_000_000
"""How far a SYN-ACK's stamp may lie outside the window in which the client was connecting and still be its
connection's. The stamps agree with the load process's clock to tens of microseconds on a quiet host, but
under full CPU stress they were seen a millisecond or two early; generations of one 4-tuple are a whole
stream apart, and the nearest one is taken."""


class Segments:
    """Per connection: every generation of its 4-tuple, each with the server's initial sequence number (from
    its SYN-ACK), when that SYN-ACK arrived, and every data segment.

    A 4-tuple is reused: on loopback the kernel hands a client port back out a second after it closed, and a
    load process that is behind asks for a stream's segments seconds after it ended. Keeping one entry per
    4-tuple, reset by each SYN-ACK, gave a late query the next connection's segments; with identical streams
    their byte offsets matched, and the stream got another's times, seconds off. So each SYN-ACK opens a new
    generation, and :meth:`take` picks the one whose SYN-ACK arrived while the asking stream was connecting.
    """

    __slots__ = ("_wall", "conns", "drops", "packets")

    def __init__(self, wall: WallToClock | None = None) -> None:
        self.conns: dict[bytes, list[list]] = {}  # type: ignore[type-arg]
        """key -> generations, oldest first: [server ISN, [(seq, length, stamp)], last seen (monotonic s),
        SYN-ACK stamp]"""
        self.packets = 0
        self.drops = 0
        self._wall = wall or WallToClock()

    def add(self, data: bytes, wall_ns: int, now_s: float) -> None:
        """One captured packet: ``wall_ns`` its kernel stamp, ``now_s`` about when it was read (for expiry).

        Runs once per segment, so it keeps the kernel's wall-clock stamp as it is; :meth:`take` puts a
        connection's stamps on ``perf_counter_ns`` with one offset."""
        if data[0] == 0x45 or data[0] >> 4 == 4:
            ihl = (data[0] & 15) * 4
            length, addrs = _V4.unpack_from(data)
            length -= ihl
        elif data[0] >> 4 == 6:
            ihl = 40
            length, addrs = _V6.unpack_from(data)
        else:
            return
        seq, offflags = _TCP.unpack_from(data, ihl)
        key = addrs + data[ihl : ihl + 4]
        self.packets += 1
        gens = self.conns.get(key)
        if offflags & 0x12 == 0x12:  # SYN-ACK: a new connection, unless it is a retransmitted copy
            if gens is None:
                self.conns[key] = [[seq, [], now_s, wall_ns]]
            elif gens[-1][0] != seq:
                gens.append([seq, [], now_s, wall_ns])
            return
        if gens is None:
            return
        entry = gens[-1]
        payload = length - (offflags >> 12) * 4
        if payload > 0:
            entry[1].append((seq, payload, wall_ns))
        entry[2] = now_s

    def take(self, key_hex: str, after_ns: int | None = None, before_ns: int | None = None) -> dict[str, object]:
        """The segments of one connection, forgotten once given.

        ``after_ns`` and ``before_ns`` (``perf_counter_ns``) bound when the asking stream was connecting: the
        generation whose SYN-ACK arrived nearest that window (within :data:`JOIN_SLACK_NS`) is its connection.
        Without them, the latest generation. ``isn`` None: no generation fits (never seen, or seen only for
        another stream).
        """
        gens = self.conns.get(bytes.fromhex(key_hex))
        if not gens:
            return {"isn": None, "segs": []}
        now = time.perf_counter_ns()
        to_clock = self._wall.to_clock
        pick = len(gens) - 1
        if after_ns is not None and before_ns is not None:
            # distance of each SYN-ACK from the connecting window (0 inside it); the nearest within the slack
            away = [max(after_ns - t, t - before_ns, 0) for t in (to_clock(g[3], now) for g in gens)]
            pick = min(range(len(gens)), key=lambda i: (away[i], -i))
            if away[pick] > JOIN_SLACK_NS:
                return {"isn": None, "segs": [], "generations": len(gens)}
        entry = gens.pop(pick)
        if not gens:
            del self.conns[bytes.fromhex(key_hex)]
        return {
            "isn": entry[0],
            "segs": [(seq, n, to_clock(ts, now)) for seq, n, ts in entry[1]],
            "syn_ns": to_clock(entry[3], now),
        }

    def expire(self, now_s: float) -> None:
        for key, gens in list(self.conns.items()):
            gens[:] = [g for g in gens if now_s - g[2] <= EXPIRE_S]
            if not gens:
                del self.conns[key]


def drain(sock: socket.socket, segs: Segments) -> None:
    """Read every segment queued now."""
    recvmsg = sock.recvmsg
    add = segs.add
    unpack = TIMESPEC.unpack_from
    now_s = time.monotonic()
    while True:
        try:
            data, anc, _, _ = recvmsg(SNAP, TS_SPACE)
        except BlockingIOError:
            return
        if anc and len(anc[0][2]) >= 16:  # the only ancillary message asked for: SO_TIMESTAMPNS
            sec, nsec = unpack(anc[0][2])
            add(data, sec * 1_000_000_000 + nsec, now_s)


def read_drops(sock: socket.socket, segs: Segments) -> None:
    _, drops = _STATS.unpack(sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _STATS.size))
    segs.drops += drops


def serve(port: int, ctl: socket.socket) -> int:
    """Capture until the control socket closes; one JSON answer per query line."""
    try:
        sock = open_capture(port)
    except (OSError, ValueError, AttributeError) as e:
        ctl.sendall((json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n").encode())
        return 1
    segs = Segments()
    ctl.sendall(b'{"ready": true}\n')
    pending = b""
    last_expire = time.monotonic()
    while True:
        ready, _, _ = select.select([ctl], [], [], DRAIN_S)
        drain(sock, segs)
        if ctl in ready:
            data = ctl.recv(65536)
            if not data:
                return 0
            pending += data
            answers = []
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                query = json.loads(line)
                drain(sock, segs)
                if "conn" in query:
                    answers.append(segs.take(query["conn"], query.get("after"), query.get("before")))
                else:
                    read_drops(sock, segs)
                    answers.append({"packets": segs.packets, "drops": segs.drops, "open": len(segs.conns)})
            ctl.sendall("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in answers).encode())
        if time.monotonic() - last_expire > 10:
            last_expire = time.monotonic()
            segs.expire(last_expire)


def chunk_times(isn: int, segs: Sequence[Sequence[int]], last_bytes: Sequence[int]) -> list[int] | None:
    """Each chunk's time: when every byte of the response up to its last one had arrived.

    ``last_bytes`` are the offsets, in the response (0 is the first byte after the server's SYN-ACK), of
    each chunk's last byte, ascending. A byte is available to the reader once it and all bytes before it
    have arrived, so a chunk's time is the latest arrival among the segments covering the response up to
    its last byte (a retransmitted copy of bytes already there changes nothing). None when a chunk's
    bytes are not all covered: a segment the capture dropped.
    """
    ordered = sorted((((seq - isn - 1) % SEQ_MOD), length, ts) for seq, length, ts in segs)
    out: list[int] = []
    covered = 0
    latest = -(1 << 62)
    i = 0
    for off in last_bytes:
        while covered <= off:
            if i == len(ordered):
                return None
            start, length, ts = ordered[i]
            i += 1
            if start > covered:
                return None  # a hole: bytes no captured segment carried
            if start + length > covered:
                covered = start + length
                latest = ts if ts > latest else latest
        out.append(latest)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tailgate.load.capture")
    p.add_argument("--port", type=int, required=True, help="the server's TCP port")
    p.add_argument("--fd", type=int, required=True, help="a connected Unix stream socket to answer on")
    args = p.parse_args(argv)
    ctl = socket.socket(fileno=args.fd)
    try:
        return serve(args.port, ctl)
    except (BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return 0
    finally:
        ctl.close()


__all__ = [
    "JOIN_SLACK_NS",
    "SNAP",
    "Segments",
    "bpf_program",
    "chunk_times",
    "connection_key",
    "main",
    "open_capture",
    "serve",
]

if __name__ == "__main__":
    os.environ.pop("TAILGATE_STALL_LOG", None)
    sys.exit(main())
