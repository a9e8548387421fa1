"""Separate hosts on one machine: network namespaces joined by veth pairs on a bridge.

The master namespace holds a bridge with ``10.231.<k>.1``; each worker namespace gets its own veth into
that bridge with ``10.231.<k>.<2 + i>``. Processes run in a namespace with ``ip netns exec``, so the
master, the workers and the ground-truth server talk over real interfaces, on addresses of this
project's own namespaces only. Everything is removed at the end; a kernel (or container) that refuses
namespaces raises :class:`NetnsUnavailable` with the reason (a test skips on it). The self-check's ``--hosts``
(:mod:`tailgate.verify.multihost`) and the distributed tests use it. Needs root (``CAP_NET_ADMIN``) and
iproute2's ``ip``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field


class NetnsUnavailable(RuntimeError):
    """This machine will not create namespaces, a bridge or veth pairs (not root, no CAP_NET_ADMIN, ...)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


@dataclass
class Hosts:
    """A master namespace and ``workers`` worker namespaces, created by :meth:`create`."""

    workers: int
    tag: str = field(default_factory=lambda: f"tg{os.getpid() % 100000}")
    subnet: int = field(default_factory=lambda: 20 + os.getpid() % 200)
    created: list[str] = field(default_factory=list)

    @property
    def master(self) -> str:
        return f"{self.tag}m"

    def worker(self, i: int) -> str:
        return f"{self.tag}w{i}"

    @property
    def master_ip(self) -> str:
        return f"10.231.{self.subnet}.1"

    def worker_ip(self, i: int) -> str:
        return f"10.231.{self.subnet}.{2 + i}"

    def create(self) -> Hosts:
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the ip command (iproute2) is not installed")
        try:
            _ip("netns", "add", self.master)
            self.created.append(self.master)
            _ip("-n", self.master, "link", "set", "lo", "up")
            _ip("-n", self.master, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.master, "addr", "add", f"{self.master_ip}/24", "dev", "br0")
            _ip("-n", self.master, "link", "set", "br0", "up")
            for i in range(self.workers):
                ns = self.worker(i)
                _ip("netns", "add", ns)
                self.created.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                port = f"v{self.tag[-6:]}{i}"[:15]
                _ip("link", "add", port, "netns", self.master, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", self.master, "link", "set", port, "master", "br0")
                _ip("-n", self.master, "link", "set", port, "up")
                _ip("-n", ns, "addr", "add", f"{self.worker_ip(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Deleting a namespace deletes its end of every veth, and with it the peer."""
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.created.clear()

    def wrap(self, ns: str) -> list[str]:
        """The command prefix that runs a program inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns]

    def command(self, ns: str, argv: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
        """``argv`` run inside namespace ``ns`` with ``env`` set (``ip netns exec`` keeps the environment)."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        return [*self.wrap(ns), "env", *extra, *argv]
