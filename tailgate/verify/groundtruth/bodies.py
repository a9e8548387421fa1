"""What a request body asks for, read as vLLM reads it: the prompt's words (the ground truth's tokenizer is
one token per whitespace-separated word, chat through a fixed template), a completion's limits, and the
``/tokenize`` and ``/detokenize`` answers.

Pure functions of the bytes, kept apart from the server's connections and timers so they can be read
(and tested) without an event loop.
"""

from __future__ import annotations

import json

from tailgate.jsontypes import JsonMapping, JsonObject

from .settings import Settings
from .wire import DEFAULT_MAX_TOKENS, HttpError

PREFIX_BLOCK_TOKENS = 16
"""Tokens per prefix-cache block (vLLM's GPU default block size)."""


def chat_tokens(messages: object) -> list[str]:
    """The ground truth's chat template: a role marker before each message's words, one marker to end it, and
    the assistant's generation prompt: ``2 × messages + 1`` tokens beside the words."""
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "messages must be a non-empty list")
    out: list[str] = []
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise HttpError(400, "every message needs a string role and content")
        out += [f"<|{m['role']}|>", *m["content"].split(), "<|end|>"]
    return [*out, "<|assistant|>"]


def _prompt_words(req: JsonMapping, chat: bool) -> list[str]:
    """The prompt as the ground truth's tokenizer splits it: one token per whitespace-separated word."""
    if chat:
        return chat_tokens(req.get("messages"))
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [f"t{t}" for t in prompt]
    raise HttpError(400, "prompt must be a string, a list of one string, or a list of token ids")


def token_id(word: str) -> int:
    """``t<n>`` is id n (what ``/detokenize`` gives back); any other word a stable id above 100000."""
    if word[:1] == "t" and word[1:].isdigit() and len(word) < 8:
        return int(word[1:])
    return 100_000 + int.from_bytes(word.encode()[:6].ljust(6, b"\0"), "big") % 900_000


def _json_object(body: bytes) -> JsonMapping:
    try:
        req = json.loads(body)
    except ValueError:
        raise HttpError(400, "request body is not valid JSON") from None
    if not isinstance(req, dict):
        raise HttpError(400, "request body must be a JSON object")
    return req


def tokenize(body: bytes, s: Settings) -> JsonObject:
    """vLLM's ``/tokenize``: ``messages`` through the chat template, or ``prompt``."""
    req = _json_object(body)
    words = _prompt_words(req, chat="messages" in req)
    tokens = [token_id(w) for w in words]
    return {"count": len(tokens), "max_model_len": MODEL_MAX_LEN, "tokens": tokens, "token_strs": None}


def detokenize(body: bytes) -> JsonObject:
    req = _json_object(body)
    tokens = req.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise HttpError(400, "tokens must be a list of integers")
    return {"prompt": " ".join(f"t{t}" for t in tokens)}


MODEL_MAX_LEN = 1_000_000


def parse_completion(body: bytes, s: Settings, *, chat: bool = False) -> tuple[int, int, bool, bool, list[str]]:
    """(prompt tokens, max tokens, stream, include usage, prompt words), or the 4xx vLLM would answer."""
    req = _json_object(body)
    model = req.get("model")
    if model is not None and model != s.model and not s.accept_any_model:
        raise HttpError(404, f"The model `{model}` does not exist.")
    words = _prompt_words(req, chat)
    prompt_tokens = len(words)
    max_tokens = req.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens!r}")
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise HttpError(400, "stream must be a boolean")
    options = req.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise HttpError(400, "Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise HttpError(400, "stream_options must be an object")
        include_usage = bool(options.get("include_usage"))
    return prompt_tokens, max_tokens, stream, include_usage, words
