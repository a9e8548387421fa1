"""Builds every prompt of a run before its first request: the step of a run that needs the server's tokenizer.

The settings say which source; this turns it into text for each stage, counted by the served model's
tokenizer, and refuses lengths the model cannot serve, all before anything is sent (one line, exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import urllib.request
from typing import Any

from tailgate.load.arrivals import arrival_process
from tailgate.load.options import OptionError, Settings
from tailgate.load.prompts import (
    Builder,
    Prompt,
    PromptError,
    ServerTokenizer,
    block_prompts,
    dataset_prompts,
    one_token_words,
    prefix_prompts,
    unique_prompts,
)
from tailgate.load.workload import TraceItem, make_trace


def model_limit(settings: Settings) -> int | None:
    """``max_model_len`` from the server's model card (vLLM puts it there), None when absent."""
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        req = urllib.request.Request(settings.target.url("/v1/models"), headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = json.loads(resp.read())
        for card in body.get("data", []):
            if isinstance(card, dict) and card.get("id") == settings.model:
                limit = card.get("max_model_len")
                return limit if isinstance(limit, int) and limit > 0 else None
    except (OSError, ValueError, AttributeError):
        return None
    return None


def _check_limit(option: str, items: list[TraceItem], prompts: list[Prompt | None], limit: int | None) -> None:
    if limit is None:
        return
    for it, p in zip(items, prompts, strict=True):
        tokens = p.tokens if p is not None and p.tokens is not None else it.prompt_tokens
        if tokens + it.max_tokens > limit:
            raise OptionError(f"{option}: request {it.id} needs {tokens} prompt + {it.max_tokens} output tokens, "
                              f"above the model's limit of {limit}")  # fmt: skip


def materialize(settings: Settings) -> Settings:
    """Settings with ``prompt_sets`` (and, for a dataset, its lengths) filled in; raises OptionError."""
    limit = model_limit(settings)
    option = {"dataset": "--dataset", "mooncake": "--arrival-trace"}.get(settings.prompts, "--prompts")
    replay = arrival_process(settings.arrivals)
    if replay.replays_file and settings.prompts == "seed":  # a file's lengths, unseen until now
        _check_limit(replay.file_flag, list(settings.trace), [None] * len(settings.trace), limit)
    if not settings.needs_tokenizer:
        return settings
    tok = ServerTokenizer(settings.target.root, settings.model, settings.api_key)
    items = list(settings.trace)
    stage_count = len(settings.stages())  # the arm and the arrival process say how many
    check: dict[str, Any] = {"tokenizer": "server /tokenize"}
    try:
        if settings.prompts == "dataset":
            prompts, outs = dataset_prompts(tok, settings.dataset_entries, len(items), settings.seed, settings.endpoint)
            mix = make_trace(len(items), settings.seed)
            items = [TraceItem(it.id, p.tokens or 1, o or m.max_tokens)
                     for it, p, o, m in zip(items, prompts, outs, mix, strict=True)]  # fmt: skip
            sets: list[list[Prompt | None]] = [list(prompts)]
            check["planned_from"] = "tokenized dataset prompts"
        else:
            words = one_token_words(tok)
            builder = Builder(tok, words, settings.endpoint)
            builder.calibrate()
            salt = secrets.randbelow(1 << 30)
            check.update(one_token_words=len(words), template_tokens=builder.overhead, salt=salt)
            targets = [it.prompt_tokens for it in items]
            sets = []
            if settings.prompts == "mooncake":
                ids = [r.hash_ids or () for r in settings.trace_rows]
                sets.append(list(block_prompts(builder, targets, ids, settings.seed, salt)))
            else:
                for stage in range(stage_count):
                    offset = stage * len(items)
                    if settings.prompts == "unique":
                        sets.append(list(unique_prompts(builder, targets, settings.seed, stage, offset, salt)))
                    else:
                        built, _ = prefix_prompts(
                            builder, targets, settings.seed, stage, offset, length=settings.prefix_tokens,
                            share=settings.prefix_share, groups=settings.prefix_groups, salt=salt,
                        )  # fmt: skip
                        sets.append(list(built))
            diffs = [(p.tokens or 0) - t for s in sets for p, t in zip(s, targets, strict=True) if p is not None]
            check.update(prompts=len(diffs), exact=sum(1 for d in diffs if d == 0),
                         max_abs_diff=max((abs(d) for d in diffs), default=0))  # fmt: skip
    except PromptError as e:
        raise OptionError(f"{option}: {e}") from None
    limit = limit or tok.max_model_len
    for s in sets:
        _check_limit(option, items, s, limit)
    return dataclasses.replace(settings, trace=tuple(items), prompt_sets=tuple(tuple(s) for s in sets),
                               prompt_check=check)  # fmt: skip
