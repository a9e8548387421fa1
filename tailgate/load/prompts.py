"""Prompt sources: what text each planned request carries, and how many tokens it really is.

``seed`` is the reference harness's filler (``ocean `` × n) and stays the default, built in the load
processes exactly as before. Every other source is built here, before anything is sent, because it needs
the served model's tokenizer: the server's ``POST /tokenize`` counts each prompt (chat prompts with their
template), and the text is adjusted until the count is the planned one. The count a request actually got
comes back in its usage and is recorded beside the plan.

Texts are made of words that the served tokenizer keeps as one token each, found by asking the server
itself (``/detokenize`` of low token ids, then ``/tokenize`` to confirm), so the same code gives exact
lengths for a word-level test tokenizer and a byte-level BPE one.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailgate.jsontypes import JsonMapping, JsonObject
from tailgate.load.payloads import endpoints

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry of a Mooncake trace."""
PROBE_BATCH = 512
PROBE_MAX_IDS = 8192
"""Token ids are probed with ``/detokenize`` in batches from 0 until ``POOL_TARGET`` words are found, the
vocabulary ends, or this many ids were tried."""
POOL_TARGET = 1000
"""One-token words wanted: unique prompts differ in their first word across this many consecutive requests."""
MIN_POOL = 16
ADJUST_ROUNDS = 6
TOKENIZE_THREADS = 8


class PromptError(ValueError):
    """A prompt source that cannot be used; ``str()`` is the one line shown to the user."""


class _Rejected(PromptError):
    """The server refused one request (400/422): an id outside the vocabulary, say."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt as sent: completion text, or chat messages (never both)."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    tokens: int | None = None
    """The served tokenizer's count of this prompt as sent (template included for chat), from ``/tokenize``."""

    def turns(self) -> list[dict[str, str]] | None:
        """The chat messages as a request carries them; None for completion text."""
        if self.messages is None:
            return None
        return [{"role": r, "content": c} for r, c in self.messages]

    def wire(self) -> JsonObject:
        """The request fields this prompt sets (``prompt`` or ``messages``)."""
        turns = self.turns()
        if turns is not None:
            return {"messages": turns}
        return {"prompt": self.text}

    def to_order(self) -> list[Any]:
        """A JSON-friendly form for the order message to the load processes."""
        return [self.text, None if self.messages is None else [list(m) for m in self.messages], self.tokens]

    @classmethod
    def from_order(cls, raw: Sequence[Any]) -> Prompt:
        text, messages, tokens = raw
        return cls(text, None if messages is None else tuple((r, c) for r, c in messages), tokens)


# ------------------------------------------------------------------------------------------- tokenizer


class ServerTokenizer:
    """The served model's tokenizer through vLLM's ``/tokenize`` and ``/detokenize``."""

    def __init__(self, root: str, model: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        self.root = root.rstrip("/")
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.max_model_len: int | None = None

    def _post(self, path: str, body: JsonObject) -> JsonMapping:
        data = json.dumps({"model": self.model, **body}).encode()
        req = urllib.request.Request(self.root + path, data=data, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                obj = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code in (404, 405):
                raise PromptError(f"the server has no {path} endpoint; this prompt source needs the served "
                                  "model's tokenizer (vLLM serves it)") from None  # fmt: skip
            kind = _Rejected if e.code in (400, 422) else PromptError
            raise kind(f"{path} answered HTTP {e.code}: {e.read()[:200].decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PromptError(f"{path}: cannot reach {self.root}: {getattr(e, 'reason', e)}") from None
        except ValueError:
            raise PromptError(f"{path} did not return JSON") from None
        if not isinstance(obj, dict):
            raise PromptError(f"{path} did not return a JSON object")
        return obj

    def count(self, prompt: Prompt) -> int:
        """Tokens the server will see for this prompt (chat: with its template and generation prompt)."""
        if prompt.messages is not None:
            body: JsonObject = {**prompt.wire(), "add_generation_prompt": True}
        else:
            body = {"prompt": prompt.text}
        obj = self._post("/tokenize", body)
        n = obj.get("count")
        if not isinstance(n, int):
            tokens = obj.get("tokens")
            if not isinstance(tokens, list):
                raise PromptError("/tokenize returned neither count nor tokens")
            n = len(tokens)
        limit = obj.get("max_model_len")
        if isinstance(limit, int) and limit > 0:
            self.max_model_len = limit
        return n

    def ids(self, text: str) -> list[int]:
        tokens = self._post("/tokenize", {"prompt": text, "add_special_tokens": False}).get("tokens")
        if not isinstance(tokens, list):
            raise PromptError("/tokenize returned no tokens")
        return [int(t) for t in tokens]

    def detokenize(self, token_id: int) -> str | None:
        """The text of one token id; None for an id the server refuses (past the end of the vocabulary)."""
        try:
            text = self._post("/detokenize", {"tokens": [token_id]}).get("prompt")
        except _Rejected:
            return None
        return text if isinstance(text, str) else ""


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """Map over a thread pool: tokenizing hundreds of prompts one after another would take minutes."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(TOKENIZE_THREADS) as pool:
        return list(pool.map(fn, items))


_WORD = re.compile(r"^[a-z][a-z0-9]{1,11}$")


def one_token_words(tok: ServerTokenizer) -> list[str]:
    """Words that the served tokenizer reads as exactly one token each, and distinct ones, after a space.

    Candidates come from the tokenizer itself (``/detokenize`` of the first ids), so no word list is
    assumed; the joined text of all of them is then tokenized once to prove the property holds in
    sequence, and words that break it are dropped one by one.
    """
    seen: set[str] = set()
    words: list[str] = []
    start = 0
    while len(words) < POOL_TARGET and start < PROBE_MAX_IDS:
        texts = _parallel(tok.detokenize, list(range(start, start + PROBE_BATCH)))
        start += PROBE_BATCH
        for t in texts:
            w = (t or "").strip()
            if _WORD.match(w) and w not in seen:
                seen.add(w)
                words.append(w)
        if all(t is None for t in texts):
            break  # past the vocabulary's end
    if len(words) < MIN_POOL:
        raise PromptError(f"the served tokenizer gave only {len(words)} plain words among its first {start} "
                          "ids; unique prompts need at least 16")  # fmt: skip
    ids = tok.ids("".join(" " + w for w in words))
    if len(ids) == len(words) and len(set(ids)) == len(ids):
        return words

    def single(w: str) -> int | None:
        got = tok.ids(" " + w)
        return got[0] if len(got) == 1 else None

    by_id: dict[int, str] = {}
    for w, i in zip(words, _parallel(single, words), strict=True):
        if i is not None and i not in by_id:
            by_id[i] = w
    kept = list(by_id.values())
    if len(kept) < MIN_POOL:
        raise PromptError(f"only {len(kept)} one-token words found for the served tokenizer; need 16")
    return kept


# ------------------------------------------------------------------------------------------- building


def _rng(*parts: object) -> random.Random:
    """A generator seeded from its parts by a stable hash (``hash()`` of a str changes per process)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass
class Builder:
    """Builds prompts of an exact token count from one-token words, checking each with ``/tokenize``."""

    tok: ServerTokenizer
    words: list[str]
    endpoint: str
    overhead: int = 0
    """Tokens the server adds around the text (BOS, the chat template)."""

    def calibrate(self) -> None:
        sample = self.words[:8]
        self.overhead = self.tok.count(self.wrap(sample)) - len(sample)

    def wrap(self, words: Sequence[str]) -> Prompt:
        text = "".join(" " + w for w in words)
        if endpoints()[self.endpoint].messages:
            return Prompt(messages=(("user", text),))
        return Prompt(text=text)

    def exact(self, head: list[str], target: int, filler: random.Random) -> Prompt:
        """``head`` then filler words, grown or cut at the end until the server counts ``target`` tokens.

        The head (a unique key, a shared prefix) is kept whole whenever the target leaves room for it."""
        body = max(1, target - self.overhead)
        words = head[:body] + [filler.choice(self.words) for _ in range(max(0, body - len(head)))]
        for _ in range(ADJUST_ROUNDS):
            prompt = self.wrap(words)
            n = self.tok.count(prompt)
            if n == target:
                return Prompt(prompt.text, prompt.messages, n)
            diff = target - n
            if diff > 0:
                words += [filler.choice(self.words) for _ in range(diff)]
            elif len(words) + diff >= 1:
                words = words[:diff]
            else:
                return Prompt(prompt.text, prompt.messages, n)  # shorter than the template allows
        return Prompt(prompt.text, prompt.messages, n)

    def unique_key(self, k: int) -> list[str]:
        """Distinct for every k: the first word differs between any ``pool`` consecutive keys, the first two
        words between any ``pool²`` (a run's keys are consecutive from a random salt)."""
        p = len(self.words)
        return [self.words[k % p], self.words[(k // p) % p]] if k >= p else [self.words[k]]


def unique_prompts(
    b: Builder, targets: Sequence[int], seed: int, stage: int, offset: int, salt: int = 0
) -> list[Prompt]:
    """One prompt per target, distinct from its first token(s) across every stage of the run.

    ``salt`` (random per run) keeps two runs with one seed from sending the same texts: a second run
    against the same server would otherwise find the first one's prompts in its prefix cache."""

    def one(i: int) -> Prompt:
        return b.exact(b.unique_key(salt + offset + i), targets[i], _rng("unique", seed, salt, stage, i))

    return _parallel(one, list(range(len(targets))))


def prefix_prompts(
    b: Builder,
    targets: Sequence[int],
    seed: int,
    stage: int,
    offset: int,
    *,
    length: int,
    share: float,
    groups: int,
    salt: int = 0,
) -> tuple[list[Prompt], list[int | None]]:
    """A share of requests start with one of ``groups`` shared prefixes of ``length`` tokens, the rest is unique.

    Returns the prompts and each request's group (None: no shared prefix). Group prefixes differ from their
    first word; a prompt's own part starts with a key distinct across the run."""
    pick = _rng("prefix-groups", seed, stage)
    member = [pick.randrange(groups) if pick.random() < share else None for _ in targets]
    heads = [[b.words[(salt + g * 7919 + 1) % len(b.words)]] + [_rng("prefix", seed, salt, g).choice(b.words)
             for _ in range(length - 1)] for g in range(groups)]  # fmt: skip

    def one(i: int) -> Prompt:
        g = member[i]
        head = (heads[g] if g is not None else []) + b.unique_key(salt + offset + i)
        return b.exact(head, targets[i], _rng("prefix-tail", seed, salt, stage, i))

    return _parallel(one, list(range(len(targets)))), member


def block_prompts(
    b: Builder, targets: Sequence[int], hash_ids: Sequence[Sequence[int]], seed: int, salt: int = 0
) -> list[Prompt]:
    """Mooncake prompts: each hash id is one block of words, the same block wherever the id appears, so
    requests that share leading ids share that prefix; the length is then made exact at the tail."""
    blocks: dict[int, list[str]] = {}

    def block(h: int) -> list[str]:
        if h not in blocks:
            r = _rng("block", seed, salt, h)
            blocks[h] = [b.words[(salt + h) % len(b.words)]] + [
                r.choice(b.words) for _ in range(MOONCAKE_BLOCK_TOKENS - 1)
            ]
        return blocks[h]

    heads = [[w for h in ids for w in block(h)] for ids in hash_ids]

    def one(i: int) -> Prompt:
        head = heads[i] or b.unique_key(salt + i)
        return b.exact(head, targets[i], _rng("block-tail", seed, salt, i))

    return _parallel(one, list(range(len(targets))))


# ------------------------------------------------------------------------------------------- datasets


@dataclass(frozen=True, slots=True)
class DatasetEntry:
    text: str | None
    messages: tuple[tuple[str, str], ...] | None
    max_tokens: int | None


def load_dataset(path: str | Path) -> list[DatasetEntry]:
    """ShareGPT JSON (a list of ``{conversations: [{from, value}]}``) or JSONL (``prompt`` or ``messages``,
    optional ``max_tokens``). A ShareGPT entry is its first human turn; entries without one are skipped,
    as peer tools do. Every other defect is one :class:`PromptError` naming the file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptError(f"dataset file {p} does not exist") from None
    except UnicodeDecodeError:
        raise PromptError(f"dataset file {p} is not UTF-8 text") from None
    except OSError as e:
        raise PromptError(f"dataset file {p} cannot be read: {e.strerror or e}") from None
    stripped = text.lstrip()
    entries: list[DatasetEntry] = []
    if stripped.startswith("["):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise PromptError(f"dataset file {p}: not valid JSON") from None
        for i, conv in enumerate(doc):
            turns = conv.get("conversations") if isinstance(conv, dict) else None
            if not isinstance(turns, list):
                raise PromptError(f"dataset file {p} entry {i}: no 'conversations' list (ShareGPT format)")
            human = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"), None)
            if isinstance(human, str) and human.strip():
                entries.append(DatasetEntry(human, None, None))
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                raise PromptError(f"dataset file {p} line {lineno}: not valid JSON") from None
            if not isinstance(obj, dict):
                raise PromptError(f"dataset file {p} line {lineno}: expected an object")
            entries.append(_jsonl_entry(obj, f"dataset file {p} line {lineno}"))
    if not entries:
        raise PromptError(f"dataset file {p} holds no prompts")
    return entries


def _jsonl_entry(obj: JsonMapping, where: str) -> DatasetEntry:
    out = obj.get("max_tokens")
    if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
        raise PromptError(f"{where}: max_tokens must be a positive integer")
    prompt = obj.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        return DatasetEntry(prompt, None, out)
    msgs = obj.get("messages")
    if isinstance(msgs, list) and msgs:
        pairs = []
        for m in msgs:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise PromptError(f"{where}: every message needs a string role and content")
            pairs.append((m["role"], m["content"]))
        return DatasetEntry(None, tuple(pairs), out)
    raise PromptError(f"{where}: needs a non-empty 'prompt' string or a 'messages' list")


def dataset_prompts(
    tok: ServerTokenizer, entries: Sequence[DatasetEntry], count: int, seed: int, endpoint: str
) -> tuple[list[Prompt], list[int | None]]:
    """``count`` entries sampled with the seed (without replacement while the dataset lasts), each counted
    by the served tokenizer in the form it is sent (chat messages, or completion text)."""
    as_messages = endpoints()[endpoint].messages
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < count:
        batch = list(range(len(entries)))
        rng.shuffle(batch)
        order += batch
    chosen = [entries[i] for i in order[:count]]

    def one(e: DatasetEntry) -> Prompt:
        if as_messages:
            msgs = e.messages if e.messages is not None else (("user", e.text or ""),)
            p = Prompt(messages=msgs)
        else:
            text = e.text if e.text is not None else "\n".join(c for _, c in e.messages or ())
            p = Prompt(text=text)
        return Prompt(p.text, p.messages, tok.count(p))

    return _parallel(one, chosen), [e.max_tokens for e in chosen]
