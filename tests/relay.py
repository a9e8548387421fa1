"""A TCP relay that records every byte one side sends: what a peer of the master port really hears.

The peer connects to the relay, the relay to the real port; both directions are copied as they come, and
everything from the upstream side (the master) is kept, across reconnections, for the test to search.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class RecordingRelay:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.heard = bytearray()
        """Every byte the upstream side sent to the peer."""
        self.connections = 0
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                peer, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                peer.close()
                continue
            up.settimeout(None)
            with self._lock:
                self.connections += 1
                self._socks += [peer, up]
            threading.Thread(target=self._pump, args=(up, peer, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(peer, up, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    with self._lock:
                        self.heard += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def recorded(self) -> bytes:
        with self._lock:
            return bytes(self.heard)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()
