"""Whether the machine was busy with something else while a probe ran against a server on it.

A server on this machine (the embedded CPU vLLM, ``--server local``) has the CPU that other processes leave
it: a search with the test suite running beside it answered [0, 3] req/s where the same machine, quiet,
passes 8. The verdicts cannot see that, so each attempt measures it: the CPU the machine spent outside the
server's process tree and the Locust child's, in cores, while the attempt ran. The search says so when it is
more than :data:`BUSY_OTHER_CORES`, and the answer carries the most any attempt saw.
"""

from __future__ import annotations

from tailgate.verify.cpu import CpuSampler

BUSY_OTHER_CORES = 0.5
"""Other processes' CPU, in cores, from which a probe's machine counts as busy (a quiet machine: under 0.1)."""


class MachineWatch:
    """Samples the CPU of the Locust child, the server and the whole machine during one attempt."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self._sampler: CpuSampler | None = None

    def on_start(self, child_pid: int) -> None:
        """The Locust child started: sample it beside the server (nothing to do for a server elsewhere)."""
        if self.server_pid is None:
            return
        self._sampler = CpuSampler(child_pid, [self.server_pid])
        self._sampler.start()

    def stop(self) -> float | None:
        """Other processes' CPU over the attempt, in cores (None: not measured)."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return None
        sampler.stop()
        if len(sampler.samples) < 2:
            return None
        window = sampler.window(sampler.samples[0][0], sampler.samples[-1][0])
        return None if window is None else round(max(0.0, window["others_busy_cores"]), 2)


def busy_line(cores: float | None) -> str | None:
    """What the search says of an attempt whose machine was busy (None: it was not, or nobody measured)."""
    if cores is None or cores < BUSY_OTHER_CORES:
        return None
    return (
        f"the machine was busy: other processes took {cores:.1f} core(s) beside the server and the load; "
        "a server on this machine has only what they leave it, so its capacity reads low here"
    )


__all__ = ["BUSY_OTHER_CORES", "MachineWatch", "busy_line"]
