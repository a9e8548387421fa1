from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.load.sse import ChunkedDecoder, SSEParser, StreamFormatError

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

VLLM_STREAM = (
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","choices":[{"index":0,"text":" b","finish_reason":"length"}]}\n\n'
    b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_several_events_in_one_read() -> None:
    events = SSEParser().feed(VLLM_STREAM)
    assert len(events) == 4 and events[-1] == b"[DONE]" and b'"usage"' in events[2]


@pytest.mark.parametrize("step", [1, 2, 7, 50])
def test_events_split_across_reads_come_out_once(step: int) -> None:
    parser = SSEParser()
    out = []
    for i in range(0, len(VLLM_STREAM), step):
        out += parser.feed(VLLM_STREAM[i : i + step])
    assert out == SSEParser().feed(VLLM_STREAM)
    assert not parser.pending


def test_keepalive_comments_crlf_and_multiline() -> None:
    events = SSEParser().feed(b': ping\r\n\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: x\nid: 3\n\n')
    assert events == [b'{"a":\n1}']


def test_truncated_stream_leaves_pending_bytes() -> None:
    parser = SSEParser()
    events = parser.feed(VLLM_STREAM[:100])
    assert len(events) == 1 and parser.pending


def test_chunked_decoder_any_split() -> None:
    body = chunked(b"data: x\n\n", b"data: [DONE]\n\n")
    for step in (1, 3, 1000):
        dec = ChunkedDecoder()
        out = b"".join(dec.feed(body[i : i + step]) for i in range(0, len(body), step))
        assert out == b"data: x\n\ndata: [DONE]\n\n" and dec.done


def test_chunked_decoder_rejects_garbage() -> None:
    with pytest.raises(StreamFormatError):
        ChunkedDecoder().feed(b"zz\r\nabc\r\n")
    with pytest.raises(StreamFormatError):
        ChunkedDecoder().feed(b"2\r\nabcdef\r\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20))
def test_sse_parser_never_crashes_on_arbitrary_bytes(reads: list[bytes]) -> None:
    parser = SSEParser()
    for data in reads:
        for event in parser.feed(data):
            assert isinstance(event, bytes)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20))
def test_chunked_decoder_classifies_arbitrary_bytes(reads: list[bytes]) -> None:
    dec = ChunkedDecoder()
    try:
        for data in reads:
            assert isinstance(dec.feed(data), bytes)
    except StreamFormatError:
        pass
