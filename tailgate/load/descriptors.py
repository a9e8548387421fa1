"""Grow the process's descriptor table before a stage, so no stream's ``socket()`` has to.

Linux keeps a process's open files in a table that starts at 64 slots and doubles when a new
descriptor does not fit. In a process with more than one thread the kernel waits for an RCU grace
period before freeing the old table (``expand_fdtable``), and the sandboxed 16-core host showed the
same: the ``socket()`` call that crossed 64, then 128 open descriptors, held the event loop for
10-16 ms, at the same moment of every run (the stall watch named ``_connect`` each time), and every
stream in flight then had chunks merged. The table never shrinks, so one descriptor opened high up
and closed again, before the first send, pays that once and out of the way.
"""

from __future__ import annotations

import fcntl
import os

RESERVED_DESCRIPTORS = 16384
"""Slots the table is grown to (or the open-files limit, if lower): about 128 KiB of kernel memory, and
more streams in flight than one load process carries."""


def reserve_descriptors(count: int = RESERVED_DESCRIPTORS) -> int:
    """Grow the descriptor table to hold ``count`` descriptors (at most the soft limit); the size reached.

    ``F_DUPFD`` takes the lowest free descriptor at or above the one asked for, so no open descriptor is
    touched; 0 where it could not be done (no ``resource`` module, a limit too low to matter)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    top = min(count, soft if soft != resource.RLIM_INFINITY else count) - 1
    if top < 64:
        return 0
    probe = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        high = fcntl.fcntl(probe, fcntl.F_DUPFD_CLOEXEC, top)
    except OSError:
        return 0
    finally:
        os.close(probe)
    os.close(high)
    return top + 1
