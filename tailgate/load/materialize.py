"""Builds every prompt of a run before its first request: the step of a run that needs the server's tokenizer.

The settings say which source; this turns it into text for each stage, counted by the served model's
tokenizer, and refuses lengths the model cannot serve, all before anything is sent (one line, exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request

from tailgate.load.arrivals import arrival_process
from tailgate.load.options import Settings
from tailgate.load.prompts import Prompt, PromptError, ServerTokenizer
from tailgate.load.promptsources import PromptPlan, prompt_source
from tailgate.load.workload import TraceItem
from tailgate.optiontable import OptionError


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
    source = prompt_source(settings.prompts)
    replay = arrival_process(settings.arrivals)
    if replay.replays_file and not source.tokenized:  # a file's lengths, unseen until now
        _check_limit(replay.file_flag, list(settings.trace), [None] * len(settings.trace), limit)
    if source.build is None:
        return settings
    tok = ServerTokenizer(settings.target.root, settings.model, settings.api_key)
    plan = PromptPlan(
        tokenizer=tok, items=list(settings.trace), seed=settings.seed, endpoint=settings.endpoint,
        stages=len(settings.stages()),  # the arm and the arrival process say how many
        trace_rows=settings.trace_rows, options=settings.prompt_options(),
    )  # fmt: skip
    try:
        built = source.build(plan)
    except PromptError as e:
        raise OptionError(f"{source.flag}: {e}") from None
    limit = limit or tok.max_model_len
    for s in built.sets:
        _check_limit(source.flag, built.items, s, limit)
    return dataclasses.replace(settings, trace=tuple(built.items), prompt_sets=tuple(tuple(s) for s in built.sets),
                               prompt_check={"tokenizer": "server /tokenize", **built.check})  # fmt: skip
