"""Connecting under gevent without a turn of the event loop where the kernel has already finished the handshake,
and with gevent's own wait (and the socket's timeout) where it has not."""

from __future__ import annotations

import gevent
import gevent.socket

import socket
import time
from collections.abc import Iterator

import pytest

from tailgate.load.transport import connect_now


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.close()


def gevent_socket(timeout: float = 2.0) -> gevent.socket.socket:
    sock = gevent.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    return sock


def test_loopback_connects_without_turning_the_loop(listener: socket.socket) -> None:
    loop = gevent.get_hub().loop
    sock = gevent_socket()
    try:
        turns = loop.iteration
        connect_now(listener.getsockname(), sock)
        assert loop.iteration == turns
        assert sock.getpeername() == listener.getsockname()
    finally:
        sock.close()


def test_a_refused_connection_raises_its_own_class() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    address = probe.getsockname()
    probe.close()  # a port nobody listens on
    sock = gevent_socket()
    try:
        with pytest.raises(ConnectionRefusedError):
            connect_now(address, sock)
    finally:
        sock.close()


def test_a_handshake_still_under_way_waits_in_gevent_with_the_timeout() -> None:
    """A listener whose accept queue is full drops the SYN: the connect stays in progress, gevent waits, and the
    socket's timeout ends it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    held = []
    try:
        for _ in range(4):  # fill the queue (its length is the backlog plus one)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(server.getsockname())
            held.append(s)
        time.sleep(0.05)
        sock = gevent_socket(timeout=0.3)
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                connect_now(server.getsockname(), sock)
        finally:
            sock.close()
        assert 0.25 <= time.monotonic() - started < 5.0
    finally:
        for s in held:
            s.close()
        server.close()
