"""The asyncio server: connections, routing, the simulated engine's steps, completions and vLLM-like metrics;
the control endpoint's document is applied by :mod:`.control`."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from tailgate.jsontypes import JsonObject

from .bodies import MODEL_MAX_LEN, PREFIX_BLOCK_TOKENS, detokenize, parse_completion, tokenize
from .connection import Connection
from .control import add_to_plan, apply_control, describe
from .engine import Engine, EngineModel, EngineRequest
from .faults import ControlError, Fault
from .metrics import metrics_text
from .settings import ChunkLog, Settings
from .stream import Plan, Stream
from .timers import Timers
from .wire import (
    CHUNK_END,
    HTTP_FAULT_STATUS,
    REASONS,
    SSE_DONE,
    TERMINAL_FAULTS,
    TOKEN_TEXT,
    HttpError,
    RequestHead,
    error_body,
    full_response,
    json_bytes,
    monotonic_ns,
    response_head,
)

# -------------------------------------------------------------------------------------------- server


class GroundTruthServer:
    """The server inside one event loop; :func:`main` runs it as a process.

    Usable in-process too (``await server.start()``), but a benchmark should run it in its own
    process so that the load generator's CPU use cannot delay the writes it is measured against.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_log_path: str | Path | None = None,
        worker: tuple[int, int] = (0, 1),
    ) -> None:
        self.settings = settings or Settings()
        self.worker, self.workers = worker
        """This server's index among the workers sharing its port (``SO_REUSEPORT``), and how many there are.
        Its request numbers are ``worker + k * workers``, so a response id is unique across all of them."""
        self.host = host
        self.requested_port = port
        self.chunk_log_path = Path(chunk_log_path) if chunk_log_path else None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.timers: Timers = None  # type: ignore[assignment]
        self.log = ChunkLog()
        self.connections: set[Connection] = set()
        self.active: set[Stream] = set()
        self.next_seq = self.worker
        self.pause_window = (0, 0)
        self.waiting = 0
        self.running = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_done = 0
        self.requests_total = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prefix_blocks: set[int] = set()
        self.last_authorization: dict[str, str] = {}
        """Path -> the last ``Authorization`` header a request to it carried (``/_*`` paths excluded)."""
        self.started_wall = time.time()
        self._server: asyncio.Server | None = None
        self.engine: Engine | None = None
        self._engine_timer: asyncio.TimerHandle | None = None
        if self.settings.engine is not None:
            self.engine = Engine(self.settings.engine)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> int:
        """Listen and return the port (the chosen one when 0 was asked for)."""
        self.loop = asyncio.get_running_loop()
        self.timers = Timers(self.loop)
        self._server = await self.loop.create_server(
            lambda: Connection(self), self.host, self.requested_port, backlog=4096, reuse_address=True,
            reuse_port=self.workers > 1 or None,
        )  # fmt: skip
        return self.port

    async def stop(self) -> None:
        """Stop listening, cut every connection, then write the chunk log file."""
        if self._server is not None:
            self._server.close()
        if self._engine_timer is not None:
            self._engine_timer.cancel()
        for conn in list(self.connections):
            if conn.stream is not None:
                conn.stream.end()
            conn.closed = True
            conn.transport.abort()
        if self.timers is not None:
            self.timers.close()
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        self.write_chunk_log()

    def write_chunk_log(self) -> None:
        """Write the log atomically, so a reader sees the whole file or none of it."""
        if self.chunk_log_path is None:
            return
        tmp = self.chunk_log_path.with_name(self.chunk_log_path.name + ".tmp")
        tmp.write_bytes(json_bytes(self.log.dump()))
        os.replace(tmp, self.chunk_log_path)

    # -- control

    def apply_control(self, doc: object) -> JsonObject:
        """Validate the whole document, then apply it: a bad key changes nothing (:func:`.control.apply_control`)."""
        return apply_control(self, doc)

    def describe(self) -> JsonObject:
        return describe(self)

    # -- the simulated engine

    def set_engine(self, model: EngineModel | None) -> None:
        """Switch the engine on (a fresh, empty one), off, or to new settings; streams in flight keep theirs."""
        preempted = self.engine.preemptions if self.engine is not None else 0
        self.settings.preemptions_total += preempted
        self.engine = None if model is None else Engine(model)

    def engine_submit(self, req: EngineRequest) -> None:
        engine = self.engine
        if engine is None:  # switched off since the request arrived: it is not served
            return
        ready = engine.ready_ns(req.arrival_ns, req.prompt_tokens)
        if ready > req.arrival_ns:  # the front end holds it first, off the engine's steps
            self.loop.call_at(ready * 1e-9, self._engine_enqueue, engine, req, ready)
        else:
            self._engine_enqueue(engine, req, ready)

    def _engine_enqueue(self, engine: Engine, req: EngineRequest, ready_ns: int) -> None:
        if engine is not self.engine or req.cancelled:
            return
        req.ready_ns = ready_ns
        engine.submit(req)
        if engine.step_end_ns is None:
            self._engine_start(max(ready_ns, engine.last_end_ns))

    def engine_cancel(self, req: EngineRequest) -> None:
        if self.engine is not None:
            self.engine.cancel(req)

    def _engine_start(self, now_ns: int) -> None:
        engine = self.engine
        if engine is None:
            return
        end = engine.start_step(now_ns)
        if end is not None:
            self._engine_timer = self.loop.call_at(end * 1e-9, self._engine_step_end, engine)

    def _engine_step_end(self, engine: Engine) -> None:
        """A step ended on its absolute target: write its tokens, start the next step from that target."""
        end = engine.step_end_ns
        if engine is not self.engine or end is None:
            return
        for req in engine.finish_step():
            stream = req.owner
            if stream is None or stream.ended:
                continue
            stream.target = end
            stream.fire()
        self._engine_start(end)

    # -- routing

    def dispatch(self, conn: Connection, head: RequestHead, body: bytes, recv_ns: int) -> None:
        path, method = head.path, head.method
        ka = conn.keep_alive
        auth = head.headers.get("authorization")
        if auth is not None and not path.startswith("/_"):
            self.last_authorization[path] = auth
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                conn.send(_detail(405, ka))
                return
            self.completions(conn, body, recv_ns, chat=path == "/v1/chat/completions")
            return
        if path in ("/tokenize", "/detokenize"):
            if method != "POST":
                conn.send(_detail(405, ka))
                return
            try:
                answer = tokenize(body, self.settings) if path == "/tokenize" else detokenize(body)
            except HttpError as e:
                conn.send(full_response(e.status, error_body(e.status, e.message), "application/json", ka))
                return
            conn.send(full_response(200, json_bytes(answer), "application/json", ka))
            return
        handlers: dict[str, tuple[str, Callable[[], tuple[int, bytes, str]]]] = {
            "/health": ("GET", self._health),
            "/v1/models": ("GET", self._models),
            "/version": ("GET", lambda: (200, b'{"version":"groundtruth"}', "application/json")),
            "/metrics": ("GET", self._metrics),
            "/_chunklog": ("GET", lambda: (200, json_bytes(self.log.dump()), "application/json")),
        }
        if path in ("/_chunklog", "/_control") and self.workers > 1 and (path == "/_chunklog" or method == "POST"):
            # each worker holds only its own share of the requests: its log or settings alone would mislead
            why = (f"this server runs {self.workers} workers on one port; each keeps its own log, merged into "
                   "--chunk-log when the server stops, and takes its settings from the command line")  # fmt: skip
            conn.send(full_response(409, error_body(409, why), "application/json", ka))
            return
        if path == "/_control":
            if method == "GET":
                conn.send(full_response(200, json_bytes(self.describe()), "application/json", ka))
                return
            if method != "POST":
                conn.send(_detail(405, ka))
                return
            try:
                result = self.apply_control(json.loads(body or b"{}"))
            except (ControlError, ValueError) as e:
                conn.send(full_response(400, error_body(400, str(e)), "application/json", ka))
                return
            conn.send(full_response(200, json_bytes(result), "application/json", ka))
            return
        entry = handlers.get(path)
        if entry is None:
            conn.send(_detail(404, ka))
            return
        if method != entry[0]:
            conn.send(_detail(405, ka))
            return
        status, payload, ctype = entry[1]()
        conn.send(full_response(status, payload, ctype, ka))

    def _health(self) -> tuple[int, bytes, str]:
        return (200 if self.settings.healthy else 503), b"", "application/json"

    def _models(self) -> tuple[int, bytes, str]:
        m = self.settings.model
        card = {
            "id": m,
            "object": "model",
            "created": int(self.started_wall),
            "owned_by": "vllm",
            "root": m,
            "parent": None,
            "max_model_len": MODEL_MAX_LEN,
        }
        return 200, json_bytes({"object": "list", "data": [card]}), "application/json"

    def _metrics(self) -> tuple[int, bytes, str]:
        return 200, metrics_text(self).encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8"

    # -- completions

    def completions(self, conn: Connection, body: bytes, recv_ns: int, *, chat: bool = False) -> None:
        s = self.settings
        seq = self.next_seq
        self.next_seq += self.workers
        if s.pause is not None and seq == s.pause[0]:
            self.pause_window = (recv_ns, recv_ns + s.pause[1])
        ka = conn.keep_alive
        try:
            req = parse_completion(body, s, chat=chat)
        except HttpError as e:
            conn.send(full_response(e.status, error_body(e.status, e.message), "application/json", ka))
            return
        prompt_tokens, max_tokens, stream, include_usage, words = req
        self.prefix_cache_lookup(words)
        row = [recv_ns, -1]
        self.log.requests[seq] = row

        terminal: Fault | None = None
        plan: Plan | None = None
        for fault in s.faults:
            if not fault.matches(seq, prompt_tokens):
                continue
            if fault.kind in TERMINAL_FAULTS:
                if terminal is None:
                    terminal = fault
                    fault.hits += 1
                continue
            if not stream:
                continue
            fault.hits += 1
            if plan is None:
                plan = Plan()
            add_to_plan(plan, fault, s.gap_ms)
        if terminal is not None:
            self._terminal(conn, terminal, recv_ns, row)
            return

        script = s.schedules.get(seq)
        engine_driven = self.engine is not None and stream and script is None
        if engine_driven:
            plan = None  # the engine decides every token time; stream-shaping faults do not combine with it
        st = Stream(
            self,
            conn,
            seq,
            max_tokens,
            prompt_tokens,
            recv_ns,
            round(s.ttft_ms * 1_000_000),
            round(s.gap_ms * 1_000_000),
            script,
            plan,
            row,
            stream,
        )
        conn.stream = st
        st.delay_s = s.write_delay_us / 1e6
        if engine_driven:
            st.engine_req = EngineRequest(prompt_tokens, max_tokens, recv_ns, st)
        created = int(time.time())
        model_json = json.dumps(s.model)
        rid = f"cmpl-{seq}"
        if not stream:
            n = max_tokens
            st.body = full_response(
                200,
                json_bytes(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": s.model,
                        "choices": [
                            {
                                "index": 0,
                                "text": TOKEN_TEXT * n,
                                "logprobs": None,
                                "finish_reason": "length",
                                "stop_reason": None,
                                "prompt_logprobs": None,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "total_tokens": prompt_tokens + n,
                            "completion_tokens": n,
                        },
                    }
                ),
                "application/json",
                ka,
            )
            st.start()
            return

        kind = "chat.completion.chunk" if chat else "text_completion"
        if chat:  # vLLM's chat stream: a delta per token, the first token's event led by a role-only one
            prefix = (
                f'data: {{"id":"chat{rid}","object":"{kind}","created":{created},"model":{model_json},'
                f'"choices":[{{"index":0,"delta":{{"content":{json.dumps(TOKEN_TEXT)}}},"logprobs":null,'
                f'"finish_reason":'
            ).encode()
            st.lead = st.frame(
                (
                    f'data: {{"id":"chat{rid}","object":"{kind}","created":{created},"model":{model_json},'
                    f'"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,'
                    f'"finish_reason":null}}]}}\n\n'
                ).encode()
            )
        else:
            prefix = (
                f'data: {{"id":"{rid}","object":"{kind}","created":{created},"model":{model_json},'
                f'"choices":[{{"index":0,"text":{json.dumps(TOKEN_TEXT)},"logprobs":null,"finish_reason":'
            ).encode()
        st.mid_event = prefix + b'null,"stop_reason":null}]}\n\n'
        st.last_event = prefix + b'"length","stop_reason":null}]}\n\n'
        frame = st.frame
        st.mid = frame(st.mid_event)
        st.last = frame(st.last_event)
        tail = b""
        if include_usage:
            usage = (
                f'data: {{"id":"{rid}","object":"{kind}","created":{created},"model":{model_json},'
                f'"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
                f'"total_tokens":{prompt_tokens + max_tokens},"completion_tokens":{max_tokens}}}}}\n\n'
            ).encode()
            tail += frame(usage)
        tail += frame(SSE_DONE)
        if conn.chunked:
            tail += CHUNK_END
        st.tail = tail
        headers = [("content-type", "text/event-stream; charset=utf-8")]
        if conn.chunked:
            headers.append(("transfer-encoding", "chunked"))
        else:
            conn.keep_alive = False
        conn.transport.write(response_head(200, headers, conn.keep_alive))
        st.start()

    def prefix_cache_lookup(self, words: list[str]) -> None:
        """vLLM's accounting: every prompt token is queried; leading whole blocks seen before are hits."""
        self.prefix_queries += len(words)
        if not self.settings.prefix_caching:
            return
        h = 0
        hit = True
        for start in range(0, len(words) - PREFIX_BLOCK_TOKENS + 1, PREFIX_BLOCK_TOKENS):
            h = hash((h, tuple(words[start : start + PREFIX_BLOCK_TOKENS])))
            if hit and h in self.prefix_blocks:
                self.prefix_hits += PREFIX_BLOCK_TOKENS
            else:
                hit = False
                self.prefix_blocks.add(h)

    def _terminal(self, conn: Connection, fault: Fault, recv_ns: int, row: list[int]) -> None:
        p = fault.params
        if fault.kind == "headers_never":
            return  # the connection stays busy; bytes the client sends are buffered and ignored

        def fire() -> None:
            if conn.closed:
                return
            row[1] = monotonic_ns()
            if fault.kind == "close_before_headers":
                conn.drop(bool(p.get("rst", False)))
                return
            status = HTTP_FAULT_STATUS[fault.kind]
            extra: list[tuple[str, str]] = []
            if status == 429:
                extra.append(("retry-after", str(p.get("retry_after", 1))))
            message = p.get("message", f"injected {status} ({fault.kind})")
            body = error_body(status, message, p.get("type"))
            conn.send(full_response(status, body, "application/json", conn.keep_alive, extra))

        delay_ns = round(float(p.get("delay_ms") or 0.0) * 1_000_000)
        if delay_ns <= 0:
            fire()
        else:
            self.loop.call_at((recv_ns + delay_ns) * 1e-9, fire)


def _detail(status: int, keep_alive: bool) -> bytes:
    """FastAPI's shape for unknown routes and methods, which is what vLLM answers."""
    return full_response(status, json_bytes({"detail": REASONS[status]}), "application/json", keep_alive)
