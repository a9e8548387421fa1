"""Typed contracts for what one part of the suite hands another, besides the per-request record.

An order (master to load process), its DONE reply and a stage summary (``summary-<stage>.json``) are frozen
dataclasses, as are the run, suite and SLO metadata (:mod:`tailgate.runmeta`), checked when they are read: a key
spelled one way by the writer and another by a reader cannot fail silently, and a wrong-typed or damaged file
gives one :class:`ContractError` line naming the file and the key, where it is read.

Three properties keep files compatible in both directions:

- ``to_dict`` writes exactly what was read: the same keys in the same order, values untouched (the
  rounding is the writer's, done once in ``tailgate/stats.py``);
- keys this module does not know are kept in ``extra`` and written back after the known ones, so a
  field added elsewhere survives a read-modify-write here;
- a known key that was absent stays absent on the way back, unless it was given a value.

Standard library only: the load path (gevent) and the analysis (pandas) both import it.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

from tailgate.jsontypes import JsonObject, JsonValue
from tailgate.records import RequestRecord
from tailgate.stats import SEED_SUMMARY_KEYS

C = TypeVar("C", bound="Contract")

_NOTHING = object()


class ContractError(ValueError):
    """A contract that does not hold; ``str()`` is one line naming the file (when known) and the key."""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        name: str = origin.__name__
        return name
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a JSON value fits a field's annotation: the shape is checked, not every nested element."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # JSON writes 10.0 as 10 when a writer passed an int
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple) or tp in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if origin is Mapping:  # JsonMapping: an object whose values its reader checks
        return isinstance(value, Mapping)
    return isinstance(value, tp)


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _default_of(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return _NOTHING


@dataclass(frozen=True)
class Contract:
    """Base of every contract: declared fields, then ``extra`` for the keys a reader does not know."""

    KIND: ClassVar[str] = "contract"
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    WRITTEN_WHEN_SET: ClassVar[frozenset[str]] = frozenset()
    """Declared keys a contract built in code writes only when they hold a value: a note that exists only when
    it applies (a warning, a reconciliation), which a reader tells apart by its presence."""

    extra: JsonObject = field(default_factory=dict, kw_only=True, compare=False)
    """Keys this version does not declare, in the order they were read; written back unchanged."""
    key_order: tuple[str, ...] = field(default=(), kw_only=True, compare=False, repr=False)
    """The keys as read, in order; empty for a contract built in code (then: declared order, then extra)."""

    @classmethod
    def declared(cls) -> dict[str, object]:
        """Field name -> resolved annotation, without the bookkeeping fields."""
        cache = cls.__dict__.get("_declared")
        if cache is None:
            # JsonObject's values name JsonValue by string (the alias is recursive): resolved here for every module
            hints = typing.get_type_hints(cls, localns={"JsonValue": JsonValue})
            cache = {f.name: hints[f.name] for f in fields(cls) if f.name not in ("extra", "key_order")}
            cls._declared = cache  # type: ignore[attr-defined]
        return cache

    @classmethod
    def from_dict(cls: type[C], data: Any, *, source: str = "") -> C:
        """Check a decoded JSON object and type it; raise one :class:`ContractError` line when it does not fit."""
        where = f"{source}: " if source else ""
        if not isinstance(data, Mapping):
            raise ContractError(f"{where}{cls.KIND} must be a JSON object, got {type(data).__name__}")
        declared = cls.declared()
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise ContractError(f"{where}{cls.KIND} lacks {', '.join(repr(k) for k in missing)}")
        known: dict[str, object] = {}
        extra: JsonObject = {}
        for key, value in data.items():
            tp = declared.get(key)
            if tp is None:
                extra[key] = value
                continue
            nested = _contract_in(tp)
            if nested is not None and isinstance(value, Mapping):  # a nested contract: checked and kept typed
                known[key] = nested.from_dict(value, source=f"{source or cls.KIND} {key}")
                continue
            if not _matches(value, tp):
                raise ContractError(
                    f"{where}{cls.KIND} key {key!r} should be {_type_name(tp)}, got {_show(value)}"
                    f" ({type(value).__name__})"
                )
            known[key] = value
        return cls(**known, extra=extra, key_order=tuple(data))

    def to_dict(self) -> JsonObject:
        """The JSON object to write: as read (same keys, same order), or declared order for a new one."""
        declared = self.declared()
        defaults = {f.name: _default_of(f) for f in fields(self)}
        out: JsonObject = {}
        if self.key_order:
            for key in self.key_order:
                if key in declared:
                    out[key] = _plain(getattr(self, key))
                elif key in self.extra:
                    out[key] = self.extra[key]
            for key in declared:  # given a value after it was read
                if key not in out and getattr(self, key) != defaults.get(key, _NOTHING):
                    out[key] = _plain(getattr(self, key))
        else:
            sparse = self.WRITTEN_WHEN_SET
            out = {key: _plain(getattr(self, key)) for key in declared
                   if key not in sparse or getattr(self, key) is not None}  # fmt: skip
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """Read a key whether declared or extra: for readers that accept older and newer files alike."""
        if key in self.declared():
            return getattr(self, key)
        return self.extra.get(key, default)

    def with_(self: C, **changes: Any) -> C:
        """A copy with some keys changed (checked as a read checks them); keys not declared go to ``extra``."""
        declared = self.declared()
        extra = dict(self.extra)
        known = {}
        for key, value in changes.items():
            if key in declared:
                nested = _contract_in(declared[key])
                if nested is not None and isinstance(value, Mapping):  # an object for a nested contract: read it
                    value = nested.from_dict(value, source=f"{self.KIND} {key}")
                if not _matches(value, declared[key]):
                    raise ContractError(
                        f"{self.KIND} key {key!r} should be {_type_name(declared[key])}, got {_show(value)}"
                    )
                known[key] = value
            else:
                extra[key] = value
        order = self.key_order
        if order:  # a key written after the file was read goes after the others, as dict.update puts it
            order = order + tuple(k for k in changes if k not in order)
        return replace(self, **known, extra=extra, key_order=order)

    @classmethod
    def read(cls: type[C], path: str | Path) -> C:
        """Read and check a JSON file; every failure (missing, unreadable, damaged, wrong type) is one line."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ContractError(f"{p}: cannot read {cls.KIND} ({e.strerror or e})") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ContractError(f"{p}: {cls.KIND} is not valid JSON ({e})") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def read_or_none(cls: type[C], path: str | Path) -> C | None:
        """For resume and listing code that treats an absent or damaged file as 'not there'."""
        try:
            return cls.read(path)
        except ContractError:
            return None

    def write(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a file), indented as every results file is."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n", encoding="utf-8")
        tmp.replace(p)


def _is_contract(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Contract)


def _contract_in(tp: Any) -> type[Contract] | None:
    """The contract a field holds, alone or as the one contract of an optional (``CaptureStats | None``)."""
    if _is_contract(tp):
        found: type[Contract] = tp
        return found
    if typing.get_origin(tp) in (Union, types.UnionType):
        members: list[type[Contract]] = [a for a in typing.get_args(tp) if _is_contract(a)]
        if len(members) == 1:
            return members[0]
    return None


def _plain(value: Any) -> Any:
    """A field's JSON value: a nested contract is written as its object."""
    return value.to_dict() if isinstance(value, Contract) else value


# ------------------------------------------------------------------------------------------- order


class OrderItem(typing.NamedTuple):
    """One request of an order; travels as a five-element list (the message stays small for big stages), six
    when the run built its prompts itself (unique, dataset, prefix, trace blocks): ``[text, messages, tokens]``."""

    trace_id: int
    prompt_tokens: int
    max_tokens: int
    offset_s: float
    batch: int | None
    prompt: list[Any] | None = None


@dataclass(frozen=True)
class OrderConfig(Contract):
    """What a load process needs to build and send requests, the same for every order of a run.

    Declared in the order the master writes them, so a config built in code travels as it always did."""

    KIND: ClassVar[str] = "order config"
    REQUIRED: ClassVar[tuple[str, ...]] = ("host", "model", "results_dir", "connect_timeout", "request_timeout")

    host: str = ""
    model: str = ""
    ignore_eos: bool = False
    api_key: str | None = None
    """Only in one process: orders that cross the network leave it out (a worker reads its own)."""
    prompt_word: str = "hi"
    record_chunks: bool = False
    results_dir: str = ""
    prompts: str | None = None
    """The prompt source (``seed`` when absent)."""
    endpoint: str | None = None
    """``completions`` or ``chat`` (the default endpoint when absent)."""
    connect_timeout: float = 10.0
    request_timeout: float = 600.0
    stall_timeout: float | None = None
    chunk_stamp: str | None = None
    """How chunks are stamped (``capture``, ``kernel``, ``recv``); absent: the process's own default."""


@dataclass(frozen=True)
class Order(Contract):
    """The master's instruction to one load process: send these requests at these offsets from ``t0_wall``.

    ``t0_wall`` is on the receiving process's clock (the master adds that process's measured offset);
    ``t0_master`` is the same instant on the master's clock, which stamps records of a lost share.
    """

    KIND: ClassVar[str] = "order"
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "order_id", "run_id", "stage", "stage_label", "arm", "rate_or_batch", "t0_wall", "items", "config",
    )  # fmt: skip

    order_id: str = ""
    run_id: str = ""
    stage: int = 0
    stage_label: str = ""
    arm: str = ""
    rate_or_batch: float = 0.0
    t0_wall: float = 0.0
    t0_master: float = 0.0
    max_in_flight: int = 0
    items: list[OrderItem] = field(default_factory=list)
    config: OrderConfig = field(default_factory=OrderConfig)
    arrivals: str | None = None
    """The stage's arrival process (``poisson``, ``gamma``, ``trace``, ``batches``); absent: the default."""

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "") -> Order:
        order = super().from_dict(data, source=source)
        where = f"{source}: " if source else ""
        # checked field by field without the generic machinery: a stage's order can hold thousands of items,
        # and it is read between the master's send and the stage's start
        items: list[OrderItem] = []
        for i, raw in enumerate(order.items):
            if (
                isinstance(raw, (list, tuple))
                and len(raw) in (5, 6)
                and type(raw[0]) is int
                and type(raw[1]) is int
                and type(raw[2]) is int
                and type(raw[3]) in (float, int)
                and (raw[4] is None or type(raw[4]) is int)
                and (len(raw) == 5 or raw[5] is None or (isinstance(raw[5], (list, tuple)) and len(raw[5]) == 3))
            ):
                items.append(OrderItem(*raw))
                continue
            expected = (
                "[trace_id int, prompt_tokens int, max_tokens int, offset_s float, batch int or null"
                "(, [text, messages, tokens])]"
            )
            raise ContractError(f"{where}order item {i} should be {expected}, got {_show(raw)}")
        return replace(order, items=items)

    def to_dict(self) -> JsonObject:
        out = super().to_dict()
        out["items"] = [list(item) if item.prompt is not None else list(item[:5]) for item in self.items]
        return out


# ------------------------------------------------------------------------------------ stage summary


@dataclass(frozen=True)
class StageSummary(Contract):
    """``summary-<stage>.json``: the seed's twelve keys with the seed's meanings first, then what the seed lacks.

    Milliseconds carry one decimal (``tailgate.stats.round_ms``); None means not measurable (no
    successful request, no preemption counter). Later keys are optional: older files lack some.
    """

    KIND: ClassVar[str] = "stage summary"
    REQUIRED: ClassVar[tuple[str, ...]] = SEED_SUMMARY_KEYS
    WRITTEN_WHEN_SET: ClassVar[frozenset[str]] = frozenset({"prefix_cache_warning", "reconciled"})

    # the seed's keys, in the seed's order
    arm: str = ""
    n: int = 0
    started: str = ""
    rate_or_batch: float = 0.0
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    gap_p50: float | None = None
    gap_p99: float | None = None
    total_p50: float | None = None
    total_p99: float | None = None
    preemptions_delta: float | None = None
    errors: int = 0
    # the load path's extras (tailgate/stats.py)
    sent: int | None = None
    warmup: int | None = None
    warmup_rule: str | None = None
    errors_by_class: dict[str, int] | None = None
    ttft_from_intended_p50: float | None = None
    ttft_from_intended_p99: float | None = None
    total_from_intended_p99: float | None = None
    schedule_lag_p50: float | None = None
    schedule_lag_p99: float | None = None
    schedule_lag_max: float | None = None
    chunks_p50: float | None = None
    achieved_rate: float | None = None
    completion_tokens: int | None = None
    client_coalesced_streams: int | None = None
    read_delay_measured: int | None = None
    max_read_delay_p99: float | None = None
    max_read_delay_max: float | None = None
    max_events_per_read_max: int | None = None
    # the coordinator's extras (shapes/session.py)
    stage: int | None = None
    stage_label: str | None = None
    config: str | None = None
    run_id: str | None = None
    partial: bool | None = None
    window_start_s: float | None = None
    window_end_s: float | None = None
    planned: int | None = None
    dropped_arrivals: int | None = None
    preemptions_before: float | None = None
    preemptions_after: float | None = None
    preemptions_before_t: float | None = None
    preemptions_after_t: float | None = None
    preemptions_source: str | None = None
    preemption_counter_reset: bool | None = None
    metrics_url: str | None = None
    target_rate: float | None = None
    # where every planned arrival went (tailgate/load/runfiles.py): planned = recorded + lost_in_flight + never_sent
    recorded: int | None = None
    lost_in_flight: int | None = None
    never_sent: int | None = None
    ran_short: bool | None = None
    # the workload and the server's view of it (tailgate/load/stage_workload.py)
    prompts: str | None = None
    endpoint: str | None = None
    arrivals: str | None = None
    prefix_cache_queries_delta: float | None = None
    prefix_cache_hits_delta: float | None = None
    prefix_cache_hit_rate: float | None = None
    prefix_caching: bool | None = None
    server_slow_gaps_delta: float | None = None
    server_slow_gap_edge_s: float | None = None
    prefix_cache_warning: str | None = None
    """Present only when the seed's repeated filler met a prefix cache."""
    prompt_tokens_checked: int | None = None
    prompt_tokens_exact: int | None = None
    prompt_tokens_diff_max: int | None = None
    prompt_tokens_diff_mean: float | None = None
    workers_lost: list[str] | None = None
    negative_latencies: int | None = None
    chunks_per_s: float | None = None
    load_processes: int | None = None
    # how the chunks were stamped (tailgate/load/capturelink.py)
    chunk_stamp: str | None = None
    capture_drops: int | None = None
    capture_missed_streams: int | None = None
    processes_to_keep_up: int | None = None
    host_steal_share: float | None = None
    """Share of the coordinating machine's CPU time the hypervisor stole during the stage (None: unknown)."""
    reconciled: bool | None = None
    """Present only on a summary written again after a load process written off reported more."""

    def seed_row(self) -> dict[str, str | int | float | None]:
        """The seed's twelve keys only, in its order: what a comparison with the reference harness reads."""
        return {k: getattr(self, k) for k in SEED_SUMMARY_KEYS}


# ---------------------------------------------------------------------------------------- order done


@dataclass(frozen=True)
class CaptureStats(Contract):
    """What a load process's packet capture saw during one order: segments, drops, and streams it missed."""

    KIND: ClassVar[str] = "capture stats"

    packets: int = 0
    drops: int = 0
    missed_streams: int = 0


@dataclass(frozen=True)
class OrderDone(Contract):
    """A load process's reply once an order has ended or failed: the master waits for one per order.

    ``order_id``, ``run_id`` and ``stage`` are None only when the order was too damaged to name them; the
    master still hears of the failure (``error``) instead of waiting for the order until its deadline.
    """

    KIND: ClassVar[str] = "order done"
    REQUIRED: ClassVar[tuple[str, ...]] = ("order_id", "run_id", "stage", "worker", "sent", "ended")

    order_id: str | None = None
    run_id: str | None = None
    stage: int | None = None
    worker: str = ""
    dropped: int = 0
    """Arrivals not sent because ``max_in_flight`` streams were already open."""
    sent: int = 0
    """Requests this process started, all orders together: the master's baseline for the next stage."""
    ended: int = 0
    stamp: str | None = None
    """How this order's chunks were stamped (``capture``, ``kernel``, ``recv``)."""
    stamp_note: str | None = None
    """Why this process gave up kernel stamps or the capture, if it did."""
    capture: CaptureStats | None = None
    error: str | None = None
    records: list[RequestRecord] | None = None
    """One process only: the order's records as the stage summary reads them, in memory (several processes
    stream them to the master instead, and this stays None)."""
