"""The client's undecoded fast path for content chunks must classify every stream as a full decode does.

Each stream is served byte for byte by a tiny socket server and read twice, once as shipped and
once with templates disabled (every event through ``json.loads``); everything the client reports
except the timestamps must be equal.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import tailgate.load.completionevents as completionevents
from tailgate.load.client import StreamReads, StreamTiming, Target, build_payload, content_template, stream_completion
from tailgate.load.transport import ResponseHead

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

HEAD = b'{"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":'
MID = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}'
LAST = b',"logprobs":null,"finish_reason":"length","stop_reason":null}]}'
USAGE = b'{"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[],' + (
    b'"usage":{"prompt_tokens":3,"completion_tokens":%d}}'
)
OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def content(text: bytes, tail: bytes = MID) -> bytes:
    return HEAD + text + tail


def normal(n: int) -> list[bytes]:
    return [*(content(b'" w%d"' % i) for i in range(n - 1)), content(b'" end"', LAST), USAGE % n, b"[DONE]"]


def with_event(event: bytes, at: int = 3, n: int = 6) -> list[bytes]:
    """A normal stream of ``n`` tokens with ``event`` inserted after ``at`` content chunks."""
    events = normal(n)
    return [*events[:at], event, *events[at:]]


class ByteServer:
    """Answers each connection with one fixed response: a status line, chunked framing, given events."""

    def __init__(self, events: Sequence[bytes], *, one_write: bool = False) -> None:
        self.events = list(events)
        self.one_write = one_write
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, body = buf.partition(b"\r\n\r\n")
                length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))[15:])
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(OK_HEAD)
                frames = [b"%x\r\n%s\r\n" % (len(e) + 8, b"data: " + e + b"\n\n") for e in self.events]
                try:
                    if self.one_write:
                        conn.sendall(b"".join(frames) + b"0\r\n\r\n")
                    else:
                        for f in frames:
                            conn.sendall(f)
                        conn.sendall(b"0\r\n\r\n")
                except OSError:  # the client hangs up on a stream it classified as failed
                    pass

    def close(self) -> None:
        self.sock.close()


def read(events: Sequence[bytes], *, one_write: bool = False) -> dict[str, Any]:
    server = ByteServer(events, one_write=one_write)
    try:
        t = stream_completion(
            Target.parse(f"http://127.0.0.1:{server.port}"), build_payload("m", "p", 4), StreamTiming(),
            record_chunks=True,
        )  # fmt: skip
    finally:
        server.close()
    return {
        "chunks": t.chunks, "recorded": len(t.chunk_ns or []), "done": t.done, "finish_reason": t.finish_reason,
        "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens, "response_id": t.response_id,
        "error_class": t.error_class, "error": t.error,
    }  # fmt: skip


@pytest.fixture
def decode_counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    calls = [0]
    real = json.loads

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    yield calls


STREAMS: dict[str, list[bytes]] = {
    "normal": normal(40),
    "single_token": normal(1),
    "error_event_mid_stream": [*normal(10)[:5], b'{"error":{"message":"engine died","code":500}}', b"[DONE]"],
    # valid JSON and a content chunk, not an error: the key is inside the choice
    "error_key_smuggled_in_text": with_event(content(b'"a","error":1,"x":"b"'), at=4),
    "raw_tab_in_text": with_event(content(b'"a\tb"')),  # not JSON: malformed
    "escaped_text": with_event(content(b'"\\u00e9\\"\\\\\\n"')),
    "utf8_text": with_event(content('"é ü"'.encode())),
    "invalid_utf8_text": with_event(content(b'"\xff"')),
    "unterminated_text": with_event(content(b'"abc')),
    "stop_mid_stream": with_event(content(b'"x"', MID.replace(b'"finish_reason":null', b'"finish_reason":"stop"'))),
    "bad_usage_after_template": with_event(content(b'"x"', MID[:-1] + b',"usage":{"prompt_tokens":"3"}}')),
    "continuous_usage": [
        *(content(b'"w"', MID[:-1] + b',"usage":{"prompt_tokens":3,"completion_tokens":%d}}' % i) for i in range(1, 6)),
        b"[DONE]",
    ],
    "no_done": normal(6)[:-1],
    "not_an_object": with_event(b"[1,2]"),
    # what the wire check must not take for a string literal: two quotes, not at its ends; a lone quote
    "quotes_not_at_the_ends": with_event(content(b'ab""')),
    "quotes_in_the_middle": with_event(content(b'"a""b"')),
    "lone_quote": with_event(content(b'"')),
    "empty_text": with_event(content(b'""')),
}


@pytest.mark.parametrize("one_write", [False, True], ids=["write_per_event", "one_write"])
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_fast_path_reports_what_a_full_decode_reports(
    name: str, one_write: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = read(STREAMS[name], one_write=one_write)
    monkeypatch.setattr(completionevents, "TEMPLATE_ATTEMPTS", 0)
    full = read(STREAMS[name], one_write=one_write)
    assert fast == full


def test_without_templates_every_event_is_decoded(decode_counter: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above means something only if its second read really decodes every event."""
    monkeypatch.setattr(completionevents, "TEMPLATE_ATTEMPTS", 0)
    assert read(normal(40))["chunks"] == 40
    assert decode_counter[0] == 41  # 40 content chunks and the usage chunk; [DONE] is not JSON


def test_expected_outcomes() -> None:
    assert read(STREAMS["normal"])["chunks"] == 40
    assert read(STREAMS["normal"])["finish_reason"] == "length"
    assert read(STREAMS["error_event_mid_stream"])["error_class"] == "server_error_event"
    assert read(STREAMS["error_key_smuggled_in_text"])["error_class"] is None
    assert read(STREAMS["raw_tab_in_text"])["error_class"] == "malformed_event"
    assert read(STREAMS["invalid_utf8_text"])["error_class"] == "malformed_event"
    assert read(STREAMS["bad_usage_after_template"])["error_class"] == "malformed_event"
    assert read(STREAMS["continuous_usage"])["completion_tokens"] == 5
    assert read(STREAMS["no_done"])["error_class"] == "stream_truncated"


def test_content_chunks_skip_the_decoder(decode_counter: list[int]) -> None:
    got = read(normal(200))
    assert got["chunks"] == 200 and got["error_class"] is None
    # first chunk, the template's check, the last chunk, the usage chunk
    assert decode_counter[0] <= 6


def test_template_refuses_what_it_cannot_vouch_for() -> None:
    ok = content(b'" w"')
    assert content_template(ok, json.loads(ok)) == (HEAD, MID)
    last = content(b'"x"', LAST)
    assert content_template(last, json.loads(last)) is None
    spaced = b'{"id": "c", "choices": [{"text": " w", "finish_reason": null}]}'
    assert content_template(spaced, json.loads(spaced)) is None
    two = b'{"choices":[{"text":"a","finish_reason":null},{"text":"b","finish_reason":null}]}'
    assert content_template(two, json.loads(two)) is None
    decoy = b'{"model":"\\"text\\":\\"","choices":[{"index":0,"text":"a","finish_reason":null}]}'
    template = content_template(decoy, json.loads(decoy))
    assert template is not None and template[0].endswith(b'"index":0,"text":')
    with_usage = b'{"choices":[{"text":"a","finish_reason":null}],"usage":{"completion_tokens":1}}'
    assert content_template(with_usage, json.loads(with_usage)) is None


FRAMINGS = {
    "lower_hex": lambda e: b"%x\r\n%s\r\n" % (len(e), e),
    "upper_hex": lambda e: b"%X\r\n%s\r\n" % (len(e), e),
    "zero_padded": lambda e: b"%06x\r\n%s\r\n" % (len(e), e),
    "extension": lambda e: b"%x;x=1\r\n%s\r\n" % (len(e), e),
    "size_one_short": lambda e: b"%x\r\n%s\r\n" % (len(e) - 1, e),
}


def take_all(reads: Sequence[bytes]) -> dict[str, Any]:
    """What the read path makes of these reads, handed over as they are (one stamp 10 ms after the other)."""
    timing = StreamTiming()
    timing.chunk_ns, timing.chunk_delay_ns = [], []
    head = ResponseHead(200, {"transfer-encoding": "chunked"}, 0, b"", 0, None)
    reads_of_stream = StreamReads(timing, head, kernel=True, capture_offsets=False)
    outcome: object = "incomplete"
    try:
        for i, data in enumerate(reads):
            if reads_of_stream.take(data, 10_000_000 * (i + 1), 1000 * (i % 3)):
                outcome = "complete"
                break
    except Exception as e:  # the class is the outcome: the stream's error_class comes from it
        outcome = type(e).__name__
    return {
        "outcome": outcome, "chunks": timing.chunks, "stamps": timing.chunk_ns, "worst_gap": timing.worst_gap_ns,
        "first": timing.first_chunk_ns, "done": timing.done, "finish_reason": timing.finish_reason,
    }  # fmt: skip


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_wire_check_counts_what_the_layers_count(name: str, framing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads handed straight to the read path, whole or cut anywhere, in every chunk framing a server may use:
    the wire check (one pass over a read holding one whole chunk like the template) and the framing, SSE and
    event layers must agree read by read."""
    import random

    frame = FRAMINGS[framing]
    wire = b"".join(frame(b"data: " + e + b"\n\n") for e in STREAMS[name]) + b"0\r\n\r\n"
    whole = [frame(b"data: " + e + b"\n\n") for e in STREAMS[name]] + [b"0\r\n\r\n"]
    cuts = random.Random(f"{name}/{framing}")
    cut_reads, pos = [], 0
    while pos < len(wire):
        step = cuts.choice([len(whole[0]), 7, 1, 300, len(whole[0]) + 5])
        cut_reads.append(wire[pos : pos + step])
        pos += step
    for reads in (whole, cut_reads):
        fast = take_all(reads)
        with monkeypatch.context() as m:
            m.setattr(completionevents, "TEMPLATE_ATTEMPTS", 0)
            full = take_all(reads)
        assert fast == full


def test_a_read_like_the_template_skips_the_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    from tailgate.load import sse

    framed = []
    real = sse.ChunkedDecoder.feed

    def counting(self: sse.ChunkedDecoder, data: bytes) -> bytes:
        framed.append(data)
        return real(self, data)

    monkeypatch.setattr(sse.ChunkedDecoder, "feed", counting)
    got = take_all([FRAMINGS["lower_hex"](b"data: " + e + b"\n\n") for e in normal(200)] + [b"0\r\n\r\n"])
    assert got["outcome"] == "complete" and got["chunks"] == 200
    # the first chunk (the template's), the last (another finish_reason), usage, [DONE], the last chunk's framing
    assert len(framed) == 5
