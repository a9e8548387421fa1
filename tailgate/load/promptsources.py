"""Prompt sources by name: the one place that knows what ``--prompts seed`` or ``prefix`` means.

A source says whether its texts need the served tokenizer (every one but the seed's filler), whether every
request carries the same text (a prefix cache then serves the seed's prompts from memory, which a summary
warns about), which of its options are recorded beside the records, how its options are checked, and how
its prompts are built. Options, materialisation, the suite and the summaries ask the source, never its
name, so a new source is one :func:`register` call here or in a plugin (:mod:`tailgate.plugins`).

The builders themselves (words of one token each, exact lengths) are in :mod:`tailgate.load.prompts`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tailgate.jsontypes import JsonObject
from tailgate.load.arrivals import TraceRow
from tailgate.load.prompts import (
    Builder,
    DatasetEntry,
    Prompt,
    PromptError,
    ServerTokenizer,
    block_prompts,
    dataset_prompts,
    load_dataset,
    one_token_words,
    prefix_prompts,
    unique_prompts,
)
from tailgate.load.workload import TraceItem, make_trace
from tailgate.plugins import Registry

OptionGetter = Callable[[str, Any], Any]
"""Reads a parsed option by its dest, with a default for a parser that lacks it (an old locust.conf); the
values are argparse's (Locust's options object is third-party), checked by the source that reads them."""


class PromptOptions(TypedDict, total=False):
    """The prompt sources' own option values, named as the settings fields they become: a source's check
    returns only its own, :meth:`~tailgate.load.options.Settings.prompt_options` gives every one."""

    dataset: str
    dataset_entries: tuple[DatasetEntry, ...]
    prefix_tokens: int
    prefix_share: float
    prefix_groups: int


PREFIX_DEFAULTS: dict[str, float] = {"prefix_tokens": 512, "prefix_share": 0.5, "prefix_groups": 4}
"""The prefix source's shape when not given: one table for Locust's options, the suite's and validation."""


@dataclass(frozen=True)
class PromptPlan:
    """What a source builds from: the served tokenizer, the planned requests and the run's own settings."""

    tokenizer: ServerTokenizer
    items: Sequence[TraceItem]
    seed: int
    endpoint: str
    stages: int
    """Stages of the run: a source that varies its texts per stage builds one set each."""
    trace_rows: Sequence[TraceRow] = ()
    options: PromptOptions = field(default_factory=lambda: PromptOptions())
    """The source's own option values, as :attr:`PromptSource.check` returned them."""


@dataclass(frozen=True)
class BuiltPrompts:
    items: list[TraceItem]
    """The planned requests, with lengths a source may set (a dataset's tokenized prompts)."""
    sets: list[list[Prompt | None]]
    """One list of prompts per stage (the last one serves later stages), in arrival order."""
    check: JsonObject
    """How they were built and counted, for ``run.json``."""


@dataclass(frozen=True)
class PromptSource:
    name: str
    tokenized: bool = True
    """Built before the run with the server's tokenizer; False: the seed's filler, made in the load processes."""
    same_text: bool = False
    """Every request of a length carries the same text, so a prefix cache serves it from memory."""
    selectable: bool = True
    """Offered by ``--prompts``; False for a source another option implies (a Mooncake trace's blocks)."""
    flag: str = "--prompts"
    """The option a failure to build it is reported under."""
    recorded: tuple[str, ...] = ()
    """Its option values kept in ``run.json``'s workload beside the source's name."""
    check: Callable[[OptionGetter], PromptOptions] | None = None
    """Reads and checks its own options (a :class:`PromptError` line on a bad one) into settings fields."""
    build: Callable[[PromptPlan], BuiltPrompts] | None = None


SOURCES: Registry[PromptSource] = Registry("prompt source")
DEFAULT_PROMPTS = "seed"
"""The source of a run that names none, and of a record written before sources were recorded."""
TRACE_BLOCKS = "mooncake"
"""The source a Mooncake trace with ``hash_ids`` implies: its blocks define the prompts."""


def register(source: PromptSource) -> PromptSource:
    return SOURCES.add(source.name, source)


def prompt_sources() -> Mapping[str, PromptSource]:
    return SOURCES.loaded()


def selectable_sources() -> tuple[str, ...]:
    """The names ``--prompts`` accepts, in registry order."""
    return tuple(name for name, s in prompt_sources().items() if s.selectable)


def prompt_source(name: str) -> PromptSource:
    """The source of this name, or a :class:`PromptError` line listing those ``--prompts`` accepts."""
    known = prompt_sources()
    if name not in known:
        raise PromptError(f"--prompts: unknown source {name!r}; choose one of {', '.join(selectable_sources())}")
    return known[name]


# ------------------------------------------------------------------------------------------- builders


@dataclass(frozen=True, slots=True)
class Words:
    """What every word-built source shares: a builder of exact lengths from the server's one-token words, a
    random salt per run (two runs with one seed never send the same texts into one prefix cache), and the
    planned prompt lengths; it counts the built prompts against the plan for ``run.json``."""

    builder: Builder
    targets: list[int]
    salt: int
    one_token_words: int
    template_tokens: int
    """The chat template's own tokens, as calibrated before any prompt was built."""

    @classmethod
    def of(cls, plan: PromptPlan) -> Words:
        words = one_token_words(plan.tokenizer)
        builder = Builder(plan.tokenizer, words, plan.endpoint)
        builder.calibrate()
        targets = [it.prompt_tokens for it in plan.items]
        return cls(builder, targets, secrets.randbelow(1 << 30), len(words), builder.overhead)

    def counted(self, items: Sequence[TraceItem], sets: list[list[Prompt | None]]) -> BuiltPrompts:
        """The sets with how exactly their token counts met the plan."""
        diffs = [(p.tokens or 0) - t for s in sets for p, t in zip(s, self.targets, strict=True) if p is not None]
        check: JsonObject = {
            "one_token_words": self.one_token_words, "template_tokens": self.template_tokens, "salt": self.salt,
            "prompts": len(diffs), "exact": sum(1 for d in diffs if d == 0),
            "max_abs_diff": max((abs(d) for d in diffs), default=0),
        }  # fmt: skip
        return BuiltPrompts(list(items), sets, check)


def build_unique(plan: PromptPlan) -> BuiltPrompts:
    w = Words.of(plan)
    n = len(plan.items)
    sets: list[list[Prompt | None]] = [
        list(unique_prompts(w.builder, w.targets, plan.seed, stage, stage * n, w.salt)) for stage in range(plan.stages)
    ]
    return w.counted(plan.items, sets)


def build_prefix(plan: PromptPlan) -> BuiltPrompts:
    w = Words.of(plan)
    o, n = plan.options, len(plan.items)
    sets: list[list[Prompt | None]] = []
    for stage in range(plan.stages):
        built, _ = prefix_prompts(
            w.builder, w.targets, plan.seed, stage, stage * n, length=o["prefix_tokens"], share=o["prefix_share"],
            groups=o["prefix_groups"], salt=w.salt,
        )  # fmt: skip
        sets.append(list(built))
    return w.counted(plan.items, sets)


def build_blocks(plan: PromptPlan) -> BuiltPrompts:
    w = Words.of(plan)
    ids = [r.hash_ids or () for r in plan.trace_rows]
    return w.counted(plan.items, [list(block_prompts(w.builder, w.targets, ids, plan.seed, w.salt))])


def build_dataset(plan: PromptPlan) -> BuiltPrompts:
    """The dataset's prompts, sampled with the seed; their tokenized lengths become the planned ones, their
    ``max_tokens`` the output lengths (the seed's mix where an entry has none)."""
    n = len(plan.items)
    prompts, outs = dataset_prompts(plan.tokenizer, plan.options["dataset_entries"], n, plan.seed, plan.endpoint)
    mix = make_trace(n, plan.seed)
    items = [TraceItem(it.id, p.tokens or 1, o or m.max_tokens)
             for it, p, o, m in zip(plan.items, prompts, outs, mix, strict=True)]  # fmt: skip
    return BuiltPrompts(items, [list(prompts)], {"planned_from": "tokenized dataset prompts"})


# ------------------------------------------------------------------------------------------- option checks


def check_dataset(get: OptionGetter) -> PromptOptions:
    dataset = get("dataset", "") or ""
    if not dataset:
        raise PromptError("--prompts dataset: name the file with --dataset (ShareGPT JSON or JSONL)")
    try:
        entries = tuple(load_dataset(dataset))
    except PromptError as e:
        raise PromptError(f"--dataset: {e}") from None
    return PromptOptions(dataset=dataset, dataset_entries=entries)


def prefix_options(get: OptionGetter) -> PromptOptions:
    """The prefix shape as given (defaults where absent), unchecked: every source carries it."""
    return PromptOptions(
        prefix_tokens=int(get("prefix_tokens", PREFIX_DEFAULTS["prefix_tokens"])),
        prefix_share=float(get("prefix_share", PREFIX_DEFAULTS["prefix_share"])),
        prefix_groups=int(get("prefix_groups", PREFIX_DEFAULTS["prefix_groups"])),
    )


def check_prefix(get: OptionGetter) -> PromptOptions:
    shape = prefix_options(get)
    if shape["prefix_tokens"] < 1:
        raise PromptError(f"--prefix-tokens: must be at least 1, got {shape['prefix_tokens']}")
    if not 0 <= shape["prefix_share"] <= 1:
        raise PromptError(f"--prefix-share: must be between 0 and 1, got {shape['prefix_share']:g}")
    if shape["prefix_groups"] < 1:
        raise PromptError(f"--prefix-groups: must be at least 1, got {shape['prefix_groups']}")
    return shape


register(PromptSource(DEFAULT_PROMPTS, tokenized=False, same_text=True))
register(PromptSource("unique", build=build_unique))
register(PromptSource("dataset", flag="--dataset", recorded=("dataset",), check=check_dataset, build=build_dataset))
register(PromptSource("prefix", recorded=tuple(PREFIX_DEFAULTS), check=check_prefix, build=build_prefix))
register(PromptSource(TRACE_BLOCKS, selectable=False, flag="--arrival-trace", build=build_blocks))


__all__ = [
    "DEFAULT_PROMPTS",
    "PREFIX_DEFAULTS",
    "SOURCES",
    "TRACE_BLOCKS",
    "BuiltPrompts",
    "PromptOptions",
    "PromptPlan",
    "PromptSource",
    "Words",
    "prefix_options",
    "prompt_source",
    "prompt_sources",
    "register",
    "selectable_sources",
]
