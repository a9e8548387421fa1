"""Bad input of every kind: arbitrary bytes from a server, arbitrary trace files, bad command lines.

A server can send anything, and a user can hand over any file or option. The stream decoders must
either produce events or raise their own :class:`StreamFormatError`; a whole request fed arbitrary
bytes by a raw socket must end as a success with ``[DONE]`` or as a named error class, never as
``client_error`` (the class that means "an exception the client did not expect"); the trace loader
must return items or a :class:`TraceError`; ``tailgate suite`` and ``tailgate report`` must refuse
bad values with one line and exit 2 before they start anything.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tailgate.load.client import StreamTiming, Target, Timeouts, build_payload, stream_completion
from tailgate.load.sse import ChunkedDecoder, SSEParser, StreamFormatError
from tailgate.load.workload import TraceError, TraceItem, load_jsonl

#: Every class the client may give a request that reached a server; anything else is a new outcome
#: that the summaries and the report would show unexplained.
KNOWN_CLASSES = frozenset(
    {
        "connection_closed", "bad_response", "headers_timeout", "request_timeout", "stall_timeout",
        "malformed_event", "server_error_event", "stream_truncated", "malformed_stream",
        "connection_reset", "io_error",
    }
)  # fmt: skip
HTTP_CLASS = re.compile(r"http_[1-5][0-9][0-9]")


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given positions (taken modulo its length), in order."""
    if not data:
        return [data]
    points = sorted({c % len(data) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def chunk_frame(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


# ------------------------------------------------------------------------------------- SSE + chunked


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_sse_events_do_not_depend_on_how_reads_split_the_bytes(data: bytes, cuts: list[int]) -> None:
    whole = SSEParser()
    expected = whole.feed(data)
    pieces = SSEParser()
    got: list[bytes] = []
    for piece in split_at(data, cuts):
        got += pieces.feed(piece)
    assert got == expected
    assert pieces.pending == whole.pending


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=120).filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=10),
    st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    st.booleans(),
)
def test_sse_round_trip_through_chunked_framing(payloads: list[bytes], cuts: list[int], crlf: bool) -> None:
    eol = b"\r\n" if crlf else b"\n"
    body = b"".join(b": ping" + eol + eol + b"data: " + p + eol + eol for p in payloads)
    wire = chunk_frame(*split_at(body, cuts[: len(cuts) // 2]))
    decoder, parser = ChunkedDecoder(), SSEParser()
    events: list[bytes] = []
    for piece in split_at(wire, cuts[len(cuts) // 2 :]):
        events += parser.feed(decoder.feed(piece))
    assert decoder.done and not parser.pending
    assert events == list(payloads)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1500), st.lists(st.integers(min_value=0, max_value=3000), max_size=12))
@example(b"5\r\nab", [])
@example(b"1;ext=1\r\na\r\n0\r\nTrailer: x\r\n\r\n", [3])
def test_chunked_decoder_arbitrary_bytes_bytes_or_its_own_error(data: bytes, cuts: list[int]) -> None:
    def run(pieces: list[bytes]) -> tuple[bytes | None, bool]:
        decoder = ChunkedDecoder()
        out = b""
        try:
            for piece in pieces:
                got = decoder.feed(piece)
                assert isinstance(got, bytes)
                out += got
        except StreamFormatError:
            return None, decoder.done
        return out, decoder.done

    whole, pieces = run([data]), run(split_at(data, cuts))
    if whole[0] is not None and pieces[0] is not None:
        assert whole == pieces


# ------------------------------------------------------------------ a whole request against raw bytes


class RawReplyServer:
    """Accepts connections one at a time, reads the request, writes the bytes it was told to, closes.

    The reply is written in the given pieces with a pause between them, so the client's incremental
    decoding sees reads that split the bytes where the test chose.
    """

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.pieces: list[bytes] = []
        self.reset = False
        self.served = 0
        self._thread = threading.Thread(target=self._serve, name="raw-reply", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self._read_request(conn)
                    for i, piece in enumerate(self.pieces):
                        if i:
                            time.sleep(0.0005)
                        conn.sendall(piece)
                    if self.reset:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            self.served += 1

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
        head, _, body = buf.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            data = conn.recv(65536)
            if not data:
                return
            body += data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def raw_server() -> Iterator[RawReplyServer]:
    server = RawReplyServer()
    yield server
    server.close()


BODY = build_payload("m", "hello world", 4)
TIMEOUTS = Timeouts(connect_s=5.0, request_s=10.0, stall_s=5.0)


def complete(server: RawReplyServer, pieces: list[bytes], reset: bool = False) -> StreamTiming:
    server.pieces, server.reset = pieces, reset
    return stream_completion(Target.parse(f"http://127.0.0.1:{server.port}"), BODY, StreamTiming(), timeouts=TIMEOUTS)


def check_classified(t: StreamTiming) -> None:
    """A request either completed with [DONE] or carries a known class, with record-safe field types."""
    if t.error_class is None:
        assert t.done and t.error is None
    else:
        assert t.error_class in KNOWN_CLASSES or HTTP_CLASS.fullmatch(t.error_class), (t.error_class, t.error)
        assert isinstance(t.error, str) and t.error
    assert t.end_ns is not None and t.end_ns >= t.sent_ns
    for value in (t.prompt_tokens, t.completion_tokens):
        assert value is None or (isinstance(value, int) and not isinstance(value, bool))
    assert t.finish_reason is None or isinstance(t.finish_reason, str)
    assert t.response_id is None or isinstance(t.response_id, str)
    assert t.chunks >= 0 and t.worst_gap_ns >= 0
    if t.chunks:
        assert t.first_chunk_ns is not None and t.last_chunk_ns is not None
        assert t.first_chunk_ns <= t.last_chunk_ns


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
chunk_like = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "choices": st.one_of(
            json_values,
            st.lists(
                st.fixed_dictionaries({}, optional={"text": json_values, "finish_reason": json_values}) | json_values,
                max_size=2,
            ),
        ),
        "usage": st.one_of(
            json_values,
            st.fixed_dictionaries({}, optional={"prompt_tokens": json_values, "completion_tokens": json_values}),
        ),
        "error": json_values,
    },
)
event_payloads = st.one_of(
    chunk_like.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.just(b"[DONE]"),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ")),
)
status_lines = st.sampled_from(
    [b"HTTP/1.1 200 OK", b"HTTP/1.1 429 Too Many", b"HTTP/1.1 500 Oops", b"HTTP/1.1 503 X", b"HTTP/1.0 200 OK",
     b"HTTP/1.1 -5 Minus", b"HTTP/1.1 1_00 Sep", b"HTTP/1.1 2000 Big", b"HTTP/1.1 OK", b"garbage", b""]
)  # fmt: skip
framings = st.sampled_from(["chunked", "length", "eof", "bad_length"])


@st.composite
def http_replies(draw: st.DrawFn) -> tuple[list[bytes], bool]:
    events = draw(st.lists(event_payloads, max_size=8))
    sse = b"".join(b"data: " + e + b"\n\n" for e in events)
    framing = draw(framings)
    headers = [b"Content-Type: text/event-stream"]
    if framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        body = chunk_frame(*split_at(sse, draw(st.lists(st.integers(0, 2000), max_size=4))))
        if draw(st.booleans()):  # framing damaged at a random place
            pos = draw(st.integers(0, max(0, len(body) - 1)))
            body = body[:pos] + draw(st.binary(max_size=6)) + body[pos + 1 :]
    elif framing == "length":
        headers.append(b"Content-Length: %d" % len(sse))
        body = sse
    elif framing == "bad_length":
        headers.append(b"Content-Length: " + draw(st.sampled_from([b"\xb2", b"-1", b"1e3", b"", b"99999999999"])))
        body = sse
    else:
        body = sse
    headers += draw(st.lists(st.binary(max_size=30).filter(lambda b: b"\r\n" not in b), max_size=2))
    wire = draw(status_lines) + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body
    if draw(st.booleans()):
        wire = wire[: draw(st.integers(0, len(wire)))]
    pieces = split_at(wire, draw(st.lists(st.integers(0, 4000), max_size=6)))
    return pieces, draw(st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=600), st.lists(st.integers(0, 1200), max_size=5), st.booleans())
@example(b"", [], False)
@example(b"HTTP/1.1 200 OK\r\n\r\n", [], True)
def test_request_fed_arbitrary_bytes_is_classified(
    raw_server: RawReplyServer, data: bytes, cuts: list[int], reset: bool
) -> None:
    check_classified(complete(raw_server, split_at(data, cuts), reset))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(http_replies())
@example(([b'HTTP/1.1 200 OK\r\n\r\ndata: {"choices": 5}\n\n'], False))
@example(([b'HTTP/1.1 200 OK\r\n\r\ndata: {"choices": [{}], "usage": "many"}\n\n'], False))
@example(([b'HTTP/1.1 200 OK\r\n\r\ndata: {"choices": [{}], "usage": {"completion_tokens": "3"}}\n\n'], False))
@example(([b'HTTP/1.1 200 OK\r\n\r\ndata: {"choices": [{"finish_reason": {"a": 1}}], "id": 7}\n\n'], False))
@example(([b"HTTP/1.1 200 OK\r\n\r\ndata: " + b"[" * 100_000 + b"\n\n"], False))
@example(([b"HTTP/1.1 500 X\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100_000], False))
@example(([b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\ndata: [DONE]\n\n"], False))
@example(([b"HTTP/1.1 -5 Minus\r\n\r\n"], False))
@example(([b'HTTP/1.1 200 OK\r\n\r\ndata: {"id": null, "error": ""}\n\n'], False))
def test_request_fed_arbitrary_http_replies_is_classified(
    raw_server: RawReplyServer, reply: tuple[list[bytes], bool]
) -> None:
    pieces, reset = reply
    check_classified(complete(raw_server, pieces, reset))


def test_a_well_formed_reply_split_everywhere_still_succeeds(raw_server: RawReplyServer) -> None:
    events = [
        b'{"id":"cmpl-1","choices":[{"index":0,"text":" a","finish_reason":null}]}',
        b'{"id":"cmpl-1","choices":[{"index":0,"text":" b","finish_reason":"length"}]}',
        b'{"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2}}',
        b"[DONE]",
    ]
    body = chunk_frame(*[b"data: " + e + b"\n\n" for e in events])
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    for step in (1, 7, 64, len(wire)):
        t = complete(raw_server, [wire[i : i + step] for i in range(0, len(wire), step)])
        assert t.error_class is None, t.error
        assert t.done and t.chunks == 2 and t.completion_tokens == 2 and t.finish_reason == "length"


# ------------------------------------------------------------------------------------------ trace file

trace_lines = st.one_of(
    st.fixed_dictionaries(
        {"prompt_tokens": json_values | st.integers(-3, 9), "max_tokens": json_values | st.integers(-3, 9)},
        optional={"id": json_values | st.integers(0, 5)},
    ).map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)


def load_bytes(data: bytes) -> list[TraceItem]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.jsonl"
        path.write_bytes(data)
        return load_jsonl(path)


def check_trace(data: bytes) -> None:
    try:
        items = load_bytes(data)
    except TraceError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert items and all(isinstance(i, TraceItem) for i in items)
    assert all(i.prompt_tokens >= 1 and i.max_tokens >= 1 for i in items)
    assert len({i.id for i in items}) == len(items)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
@example(b"[" * 100_000)
@example(b'{"prompt_tokens": 1, "max_tokens": ' + b"[" * 100_000 + b"}")
@example(b"\xef\xbb\xbf" + b'{"prompt_tokens": 1, "max_tokens": 1}')
def test_trace_loader_arbitrary_bytes_is_a_list_or_a_trace_error(data: bytes) -> None:
    check_trace(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(trace_lines, max_size=6), st.sampled_from([b"\n", b"\r\n", b"\r", "\x85".encode(), "\u2028".encode()]))
def test_trace_loader_lines_of_almost_traces(lines: list[bytes], sep: bytes) -> None:
    check_trace(sep.join(lines))


# ------------------------------------------------------------------------------ bad command lines

ROOT = Path(__file__).resolve().parent.parent


def tailgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailgate.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], prog: str, *fragments: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), done.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--rates", "0"], ["--rates", "positive"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--n", "5", "--warmup", "25"], ["--n", "warm-up"]),
        (["--server", "unknown"], ["--server", "invalid choice"]),
        (["--host", "ftp//nowhere"], ["--host"]),
        (["--host", "http://127.0.0.1:99999"], ["--host", "port"]),
        (["--host", "http://[::1"], ["--host", "not a valid URL"]),
        (["--prometheus-url", "localhost:9090"], ["--prometheus-url"]),
        (["--prometheus-url", "http://[::1"], ["--prometheus-url", "not a valid URL"]),
        (["--processes", "0"], ["--processes"]),
        (["--knee-factor", "1"], ["--knee-factor"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None,
)
def test_suite_refuses_bad_values_before_starting_anything(
    tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    results = tmp_path / "suite"
    done = tailgate("suite", "--server", "manual", "--results", str(results), *args)
    assert_one_line_error(done, "tailgate suite", *fragments)
    assert done.stdout == ""  # no progress line: nothing was started
    assert not results.exists()


WORKLOADS = ROOT / "tests" / "fixtures" / "workloads"


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--prompts", "dataset"], ["--prompts dataset", "--dataset"]),
        (["--prompts", "seed,dataset", "--dataset", "{bad}"], ["--dataset", "not valid JSON"]),
        (["--prompts", "prefix", "--prefix-share", "2"], ["--prefix-share"]),
        (["--locust-arg=--arrival-trace=/nonexistent/t.jsonl"], ["--arrival-trace", "does not exist"]),
        ([f"--locust-arg=--arrival-trace={WORKLOADS / 'mooncake-small.jsonl'}"], ["--arrival-trace", "--no-gated"]),
    ],
    ids=["dataset-without-file", "dataset-not-json", "prefix-share", "trace-missing", "trace-with-gated"],
)
def test_suite_checks_the_workload_before_any_server_starts(
    tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    """Found by each Locust run anyway, but only after a server start (minutes on a GPU box)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("root:x:0:0\n")
    args = [str(bad) if a == "{bad}" else a for a in args]
    results = tmp_path / "suite"
    done = tailgate("suite", "--embedded", "--results", str(results), *args)
    assert_one_line_error(done, "tailgate suite", *fragments)
    assert done.stdout == ""  # no vLLM install, no server start
    assert not results.exists() or not any(results.iterdir())


def test_suite_forwards_the_workload_options_to_every_locust_run(tmp_path: Path) -> None:
    from tailgate.suitecommand import add_suite_arguments, build_plan

    parser = argparse.ArgumentParser()
    add_suite_arguments(parser)
    dataset = WORKLOADS / "sharegpt-small.json"
    plan = build_plan(parser.parse_args(["--prompts", "seed,dataset", "--dataset", str(dataset.relative_to(ROOT)),
                                         "--prefix-groups", "2"]))  # fmt: skip
    args = plan.locust_args
    assert args[args.index("--dataset") + 1] == str(dataset)  # absolute: Locust may run elsewhere
    assert args[args.index("--prefix-groups") + 1] == "2" and "--prefix-tokens" not in args


def test_suite_against_a_url_nobody_answers_is_one_line_and_leaves_no_folder(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = tmp_path / "suite"
    done = tailgate("suite", "--server", "url", "--configs", "chunked", "--host", f"http://127.0.0.1:{port}",
                    "--results", str(results))  # fmt: skip
    assert_one_line_error(done, "tailgate suite", "--host", "does not answer")
    assert not results.exists()


def test_make_model_into_a_folder_that_cannot_exist() -> None:
    done = tailgate("make-model", "/proc/no-such-folder/model")
    assert_one_line_error(done, "tailgate make-model", "cannot create")


def test_suite_refuses_a_results_path_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    done = tailgate("suite", "--server", "manual", "--host", "http://127.0.0.1:1", "--results", str(target))
    assert_one_line_error(done, "tailgate suite", "--results", "not a folder")
    assert done.stdout == "" and target.read_text() == "x"


def test_suite_needs_to_be_told_who_runs_the_server(tmp_path: Path) -> None:
    done = tailgate("suite", "--results", str(tmp_path / "s"))
    assert_one_line_error(done, "tailgate suite", "--server")


def test_report_on_a_missing_folder(tmp_path: Path) -> None:
    done = tailgate("report", str(tmp_path / "nope"))
    assert_one_line_error(done, "tailgate report", "does not exist")


def test_report_on_a_folder_that_is_not_results(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.csv").write_text("a,b\n1,2\n")
    done = tailgate("report", str(tmp_path))
    assert_one_line_error(done, "tailgate report", "holds no runs")
    assert not (tmp_path / "report").exists()


def test_report_on_a_file(tmp_path: Path) -> None:
    target = tmp_path / "records.jsonl"
    target.write_text("{}\n")
    assert_one_line_error(tailgate("report", str(target)), "tailgate report", "not a folder")


def test_report_on_a_run_with_a_corrupt_summary(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "summary-cont_r1.json").write_text('{"arm": "continuous", ')
    assert_one_line_error(tailgate("report", str(tmp_path)), "tailgate report", "summary-cont_r1.json", "JSON")


def test_report_on_a_run_with_nothing_in_it(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"status": "running"}')
    assert_one_line_error(tailgate("report", str(tmp_path)), "tailgate report", "no stage summaries or records")
