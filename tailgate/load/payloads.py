"""The bytes of one streamed completion request: its JSON body and its HTTP/1.1 head.

Built before the request's send time (the worker prepares them ahead), so nothing here runs between a
send and its stamps; the streaming client only writes what it is given.

The endpoints are one registry, :data:`ENDPOINTS` (completions, chat): the options, the prompt builders,
the worker and the records ask it for an endpoint's path and whether its prompt goes as messages; a
plugin (:mod:`tailgate.plugins`) adds one with :func:`register_endpoint`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from tailgate.jsontypes import JsonObject
from tailgate.load.target import Target
from tailgate.plugins import Registry


def build_payload(
    model: str, prompt: str, max_tokens: int, *, ignore_eos: bool = False, extra: JsonObject | None = None
) -> bytes:
    """A streamed completion with usage in its final event."""
    return _streamed_body(model, {"prompt": prompt}, max_tokens, ignore_eos, extra)


def build_chat_payload(
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    extra: JsonObject | None = None,
) -> bytes:
    """A streamed chat completion with usage in its final event, as :func:`build_payload` for completions.

    ``max_tokens`` (not ``max_completion_tokens``) because vLLM and the servers that copy it read both and
    older ones only the first."""
    return _streamed_body(model, {"messages": messages}, max_tokens, ignore_eos, extra)


def _streamed_body(
    model: str, content: JsonObject, max_tokens: int, ignore_eos: bool, extra: JsonObject | None
) -> bytes:
    """The fields both endpoints share, in one place, so the two can never disagree on sampling or usage;
    ``extra`` is free-form request fields, sent as given."""
    body: JsonObject = {
        "model": model,
        **content,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return json.dumps(body).encode()


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    """Under the server's API prefix (``/v1``)."""
    messages: bool
    """The prompt goes as chat ``messages`` (the seed's filler as one user turn), not as ``prompt`` text."""

    def body(
        self, model: str, text: str, messages: list[dict[str, str]] | None, max_tokens: int, *, ignore_eos: bool
    ) -> bytes:
        """One streamed request's JSON body; ``messages`` None sends ``text`` as the one user turn."""
        if self.messages:
            turns = messages or [{"role": "user", "content": text}]
            return build_chat_payload(model, turns, max_tokens, ignore_eos=ignore_eos)
        return build_payload(model, text, max_tokens, ignore_eos=ignore_eos)


ENDPOINTS: Registry[Endpoint] = Registry("endpoint")
"""Every known endpoint by name, in the order ``--endpoint`` lists them; read through :func:`endpoints`."""
DEFAULT_ENDPOINT = "completions"
"""The endpoint of a run that names none, and of a record written before endpoints were recorded."""


def register_endpoint(endpoint: Endpoint) -> Endpoint:
    return ENDPOINTS.add(endpoint.name, endpoint)


def endpoints() -> Mapping[str, Endpoint]:
    """The registry, once the plugins that add to it are imported."""
    return ENDPOINTS.loaded()


def endpoint_help() -> str:
    """``--endpoint``'s help, from the registry: each name with its path."""
    names = [f"{e.name} (/v1{e.path})" for e in endpoints().values()]
    return " or ".join(names) + (", both" if len(names) == 2 else ", each") + " streamed with usage"


register_endpoint(Endpoint("completions", "/completions", messages=False))
register_endpoint(Endpoint("chat", "/chat/completions", messages=True))


def build_request(
    target: Target,
    body: bytes,
    api_key: str | None = None,
    request_id: str | None = None,
    endpoint: str = DEFAULT_ENDPOINT,
) -> bytes:
    """The complete request bytes (head and body), so a caller can build them before its send time.

    ``request_id`` goes out as ``X-Request-Id``: vLLM names the request after it (``cmpl-<id>-0``) in its
    stream and in its request log, which is how the order the server received requests in is read back.
    ``endpoint`` picks ``/completions`` or ``/chat/completions`` under the API prefix.
    """
    head = _request_head(target, target.api_prefix + endpoints()[endpoint].path, len(body), api_key, request_id)
    return head + body


def _request_head(
    target: Target, path: str, body_len: int, api_key: str | None, request_id: str | None = None
) -> bytes:
    host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "User-Agent: tailgate",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {body_len}",
        "Connection: close",
    ]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    if request_id:
        lines.append(f"X-Request-Id: {request_id}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
