"""A ground-truth OpenAI-compatible streaming server with a per-chunk write log.

A load generator's gaps and TTFTs can only be trusted as far as its own timing error is known. This
server emits ``/v1/completions`` streams in vLLM's wire format on an exact, absolute schedule and logs
the instant each content chunk was handed to the kernel, so a client's receive times can be compared
with the server's write times chunk by chunk. The same precision makes it a fake server for tests:
faults (HTTP errors, dropped connections, stalls of a chosen length, malformed events, coalesced
writes) are injected per request through a control endpoint.

Stdlib only (asyncio protocols and a small HTTP/1.1 parser) so that it starts in a fresh interpreter,
runs beside the load generator in a separate process, and adds no framework overhead to what it
measures.

Clock: every time here is ``time.monotonic_ns()``. On Linux, ``time.perf_counter()`` and
``time.monotonic()`` both read ``CLOCK_MONOTONIC``, so a client on the same host may subtract its
``perf_counter_ns()`` or ``monotonic_ns()`` receive times from the write times logged here directly.

Run it as ``python -m tailgate.verify.groundtruth --port 0 --port-file PATH --chunk-log PATH`` or from a test
through :func:`start_server_process`.

Endpoints
    ``POST /v1/completions``: streams ``max_tokens`` content chunks (one token each, text ``" w"``), the
    first at ``ttft_ms`` after the request body was read, then one every ``gap_ms``, each on an absolute
    target; then the usage chunk (with ``stream_options.include_usage``), ``data: [DONE]`` and the
    terminating HTTP chunk. Prompt tokens are the prompt's whitespace-separated words. Without
    ``stream`` the whole JSON body goes out at the last token's target.
    ``POST /v1/chat/completions``: the same stream in vLLM's chat format (``delta.content``), led by a
    role-only delta; the prompt is each message's words plus ``2 × messages + 1`` template tokens.
    ``POST /tokenize`` (``prompt`` or ``messages``: count, ids, ``max_model_len``) and ``/detokenize``
    (id n reads ``t<n>``), as vLLM serves them.
    ``GET /health``, ``/v1/models``, ``/version``, ``/metrics`` (vLLM's metric names, real counts; with
    ``--prefix-caching`` the prefix-cache counters count hits over whole 16-word blocks seen before).
    ``GET /_chunklog``: ``{"chunks": [[seq, index, written_ns]], "chunk_targets": [...],
    "chunk_write_begin": [...], "requests": [[seq, body_received_ns, first_write_ns]], ...}``; the
    same document is written to ``--chunk-log`` on SIGTERM/SIGINT. Serving it blocks the loop for as
    long as it takes to render, so fetch it between measurements.
    ``GET /_control`` shows the settings and, under ``last_authorization``, the last ``Authorization``
    header each client-facing path received (so a test can see what credentials reached the server);
    ``POST /_control`` changes the settings (see :meth:`GroundTruthServer.apply_control`).

Simulated engine (``--engine on`` or a JSON object of settings, or ``{"engine": {...}}`` on ``/_control``):
streaming completions are then scheduled by :mod:`.engine` (fixed slots, FIFO admission, prefill time per
prompt token stalling the whole batch, bounded with ``chunked``, per-step decode time, optional KV pool with
preemption) on absolute step targets, and ``/metrics`` reports its running/waiting queue, KV use and
preemptions. :func:`.engine.simulate` runs the same scheduler in virtual time, so a benchmark's true p99
and capacity are those of the server. Non-streaming and scripted requests keep the fixed schedule, and
stream-shaping faults do not apply to engine-driven streams.

Request numbers (``seq``, also the response id ``cmpl-<seq>``) count ``/v1/completions`` requests
from 0; other endpoints do not advance them.

Faults (``{"faults": [{"match": ..., "kind": ..., ...params}]}``; ``match`` is ``{"seq": n | [n, ...]}``,
``{"every": n, "offset": r}`` (seq % n == r), ``{"prompt_tokens": n}`` (at least n), ``{"all": true}``,
or several of these together; ``"times": n`` stops a fault after n requests):

- ``http_429`` / ``http_500`` / ``http_503``: vLLM's JSON error body; ``retry_after`` (429, default 1),
  ``message``, ``type``, ``delay_ms``.
- ``close_before_headers``: read the request, close with no response; ``rst`` resets instead,
  ``delay_ms``.
- ``headers_never``: read the request, never answer; the socket stays open until the client closes.
- ``cut_mid_stream``: after ``after_chunks`` content chunks, at the next chunk's target, close with no
  ``[DONE]`` and no terminating chunk; ``rst`` resets instead of a clean close.
- ``malformed_json``: ``data: {not json`` just before content chunk ``at_chunk``.
- ``stall``: content chunk ``at_chunk`` and all after it move ``stall_ms`` later (null, or at least
  ``FOREVER_MS``: never).
- ``error_event``: at chunk ``at_chunk``, ``data: {"error": {...}}`` then ``[DONE]`` instead of the rest,
  as vLLM does when its engine fails mid-stream; ``message``, ``type``, ``code``.
- ``keepalive_comments``: ``: ping`` SSE comments every ``interval_ms`` (default: the gap), offset by
  half an interval so they fall between content chunks; ``comment`` sets the text.
- ``multi_event_writes``: ``events_per_write`` consecutive content chunks go out in one write at the
  last one's target; ``same_http_chunk`` puts them in one HTTP chunk too. The log gives each the
  write's time.

The first matching fault of the first five kinds replaces the response; every matching fault of the
others shapes a streaming response.
"""

from .cli import main
from .faults import ControlError
from .process import ServerProcess, start_server_process
from .server import GroundTruthServer
from .settings import ChunkLog, Settings
from .wire import DEFAULT_MODEL, FAULT_KINDS, HttpError, RequestHead, parse_request_head

__all__ = [
    "DEFAULT_MODEL",
    "FAULT_KINDS",
    "ChunkLog",
    "ControlError",
    "GroundTruthServer",
    "HttpError",
    "RequestHead",
    "ServerProcess",
    "Settings",
    "main",
    "parse_request_head",
    "start_server_process",
]
