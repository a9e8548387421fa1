"""The arms: how a stage's requests are scheduled, and everything else that depends on it.

Each arm is one :class:`Arm` in :data:`ARMS`, which says what the rest of the suite needs to know: the
plan builder that turns the trace into stages, the locustfile that runs it, how its stages and cells are
named, whether its arrivals are open-loop (a rate axis, an in-flight cap, a target rate) and whether a
group's requests start together. The suite and the analysis ask the arm, never compare its name.
A new arm is an entry here, its plan builder in ``tailgate/load/plan.py``, a ``SuiteShape`` subclass in
``shapes/`` that names it and a three-line locustfile in ``locustfiles/``.

Pure Python (the plan module imports no gevent): the analysis reads the names and flags too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tailgate.load.plan import Stage, continuous_stage, gated_stage
from tailgate.load.plan import rate_label as value_label
from tailgate.load.workload import TraceItem
from tailgate.optiontable import OptionError


def value_text(value: float | None) -> str:
    """A rate or batch size as the seed's table writes it: ``5.0`` -> ``5``, ``2.5`` -> ``2.5``; ``?`` when
    a damaged summary lacks it."""
    if value is None or value != value:  # NaN from a frame column
        return "?"
    v = float(value)
    return str(int(v)) if v.is_integer() else f"{v:g}"


StageBuilder = Callable[[Sequence[TraceItem], Sequence[float], int, int], list[Stage]]
"""(trace, the arm's values, seed, warm-up) -> the stages of one run, in order."""


@dataclass(frozen=True)
class Arm:
    name: str
    label_prefix: str
    """Stage labels are this plus the value: ``cont_r`` + ``2p5``, ``gated_b`` + ``16``."""
    locustfile: str
    """File name in ``locustfiles/``."""
    value_option: str
    """The Locust option that carries this arm's values (``--rates``, ``--batch-size``)."""
    open_loop: bool
    """Arrivals follow a schedule whatever is in flight: values are rates, the in-flight cap applies, and
    the analysis plots these cells against their rate."""
    starts_together: bool
    """Each group's requests connect first and are written in trace order at once (a gated batch)."""
    build: StageBuilder
    """The arm's stages. An open-loop run takes them from its arrival process instead
    (:mod:`tailgate.load.arrivals`), whose default, Poisson, builds the same ones."""

    def stage_label(self, value: float) -> str:
        return f"{self.label_prefix}{value_label(value if self.open_loop else int(value))}"

    def value_args(self, value: float) -> list[str]:
        """The Locust arguments that run one stage of this arm at ``value``."""
        return [self.value_option, f"{value:g}" if self.open_loop else str(int(value))]


def _continuous(trace: Sequence[TraceItem], rates: Sequence[float], seed: int, warmup: int) -> list[Stage]:
    return [continuous_stage(i, trace, r, seed, warmup) for i, r in enumerate(rates)]


def _gated(trace: Sequence[TraceItem], batches: Sequence[float], seed: int, warmup: int) -> list[Stage]:
    return [gated_stage(i, trace, int(b), warmup) for i, b in enumerate(batches)]


CONTINUOUS = Arm("continuous", "cont_r", "continuous.py", "--rates", True, False, _continuous)
GATED = Arm("gated", "gated_b", "gated.py", "--batch-size", False, True, _gated)

ARMS: dict[str, Arm] = {a.name: a for a in (CONTINUOUS, GATED)}
OPEN_LOOP: frozenset[str] = frozenset(a.name for a in ARMS.values() if a.open_loop)
"""Names of the arms whose cells sit on a rate axis (the analysis selects rows with ``isin``)."""
STARTS_TOGETHER: frozenset[str] = frozenset(a.name for a in ARMS.values() if a.starts_together)
"""Names of the arms whose groups start at once: the static stand-in the analysis sets against the open loop."""


def arm(name: str) -> Arm:
    """The arm of this name, or an :class:`OptionError` line listing the known ones."""
    try:
        return ARMS[name]
    except KeyError:
        raise OptionError(f"--arm: unknown arm {name!r}; choose one of {', '.join(ARMS)}") from None


def is_open_loop(name: object) -> bool:
    return name in OPEN_LOOP


def stage_label(arm_name: str, value: float) -> str:
    """``cont_r2p5``, ``gated_b16``: a stage's label, its summary file and (after the configuration) its folder."""
    return arm(arm_name).stage_label(value)


def cell_folder(config: str, arm_name: str, value: float) -> str:
    """A suite cell's folder: the configuration, then the stage label (``nochunk_cont_r10``)."""
    return f"{config}_{stage_label(arm_name, value)}"


def cell_name(config: str, arm_name: str, value: float) -> str:
    """A cell's one name, in the report as on disk and in the console: its suite folder (``nochunk_cont_r10``).

    Unknown arms (a file from a newer version) read as gated did.
    """
    a = ARMS.get(arm_name, GATED)
    return cell_folder(config, a.name, value)
