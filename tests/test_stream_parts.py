"""The stream reader's parts, each alone: the response head, what the events say, when the chunks arrived."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tailgate.load.chunkstamps import LATE_READ_NS, ChunkStamper
from tailgate.load.completionevents import TEMPLATE_ATTEMPTS, EventReader
from tailgate.load.sse import event_ends
from tailgate.load.timing import StreamTiming
from tailgate.load.transport import RequestFailure, ResponseHead, read_head, refuse_status

CLOCK = time.perf_counter_ns


def chunk(text: str, reason: str | None = None) -> bytes:
    why = "null" if reason is None else f'"{reason}"'
    return b'{"id":"cmpl-7","object":"text_completion","choices":[{"index":0,"text":"%s","finish_reason":%s}]}' % (
        text.encode(),
        why.encode(),
    )


USAGE = b'{"id":"cmpl-7","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3}}'


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def head_of(raw: bytes, pair: tuple[socket.socket, socket.socket]) -> ResponseHead:
    client, server = pair
    server.sendall(raw)
    return read_head(client, False, CLOCK, CLOCK() + 2_000_000_000, 2.0)


# -- transport: the response head ---------------------------------------------------------------------


def test_head_parsed_with_the_stream_start_it_brought(pair: tuple[socket.socket, socket.socket]) -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:"
    head = head_of(raw, pair)
    assert head.status == 200 and head.chunked and head.content_length is None
    assert head.headers["content-type"] == "text/event-stream"
    assert head.rest == b"5\r\ndata:" and raw[head.body_offset :] == head.rest


def test_head_split_over_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair

    def dribble() -> None:
        for piece in (b"HTTP/1.1 200 OK\r\nContent-", b"Length: 4\r\n\r", b"\nbody"):
            server.sendall(piece)
            time.sleep(0.02)

    t = threading.Thread(target=dribble)
    t.start()
    head = read_head(client, False, CLOCK, CLOCK() + 2_000_000_000, 2.0)
    t.join()
    assert head.content_length == 4 and not head.chunked


@pytest.mark.parametrize(
    ("raw", "error_class"),
    [
        (b"HTTP/1.1 2OO OK\r\n\r\n", "bad_response"),
        (b"garbage\r\n\r\n", "bad_response"),
        (b"HTTP/1.1 600 Nope\r\n\r\n", "bad_response"),
    ],
)
def test_bad_status_line_is_classified(raw: bytes, error_class: str, pair: tuple[socket.socket, socket.socket]) -> None:
    with pytest.raises(RequestFailure) as failed:
        head_of(raw, pair)
    assert failed.value.error_class == error_class


def test_server_closing_before_headers(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    server.sendall(b"HTTP/1.1 200")
    server.shutdown(socket.SHUT_WR)
    with pytest.raises(RequestFailure) as failed:
        read_head(client, False, CLOCK, CLOCK() + 2_000_000_000, 2.0)
    assert failed.value.error_class == "connection_closed"


def test_headers_past_the_limit_are_a_bad_response(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    threading.Thread(target=server.sendall, args=(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20_000,)).start()
    with pytest.raises(RequestFailure) as failed:
        read_head(client, False, CLOCK, CLOCK() + 2_000_000_000, 2.0)
    assert failed.value.error_class == "bad_response"


def test_error_status_takes_its_message_from_the_body(pair: tuple[socket.socket, socket.socket]) -> None:
    body = b'{"error":{"message":"Too many requests","type":"rate_limit"}}'
    framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = head_of(b"HTTP/1.1 429 Too Many\r\nTransfer-Encoding: chunked\r\n\r\n" + framed[:10], pair)
    pair[1].sendall(framed[10:])
    pair[1].shutdown(socket.SHUT_WR)
    failure = refuse_status(pair[0], head, 2.0)
    assert (failure.error_class, failure.message) == ("http_429", "Too many requests")


# -- what the events say ------------------------------------------------------------------------------


def test_template_learned_then_chunks_counted_without_decoding() -> None:
    timing = StreamTiming()
    reader = EventReader(timing)
    reader.read([chunk(" a")])
    assert (reader.content, reader.others, timing.response_id) == (1, 0, "cmpl-7")
    reader.read([chunk(" b"), chunk("\\u00e9"), chunk(" d", "length"), USAGE, b"[DONE]"])
    assert (reader.content, reader.others) == (3, 2)
    assert timing.done and timing.finish_reason == "length"
    assert (timing.prompt_tokens, timing.completion_tokens) == (12, 3)


def test_an_event_unlike_the_template_is_decoded_not_miscounted() -> None:
    timing = StreamTiming()
    reader = EventReader(timing)
    reader.read([chunk(" a")])
    # same prefix and suffix, but the text slot is not one string literal: it must not pass as content
    odd = chunk(' a","x":"y')
    with pytest.raises(RequestFailure):
        reader.read([odd.replace(b'"x"', b"x")])


def test_a_malformed_event_keeps_the_chunks_before_it() -> None:
    timing = StreamTiming()
    reader = EventReader(timing)
    with pytest.raises(RequestFailure) as failed:
        reader.read([chunk(" a"), chunk(" b"), b"{not json"])
    assert failed.value.error_class == "malformed_event" and reader.content == 2


@pytest.mark.parametrize(
    ("event", "error_class"),
    [
        (b'{"error":{"message":"engine died"}}', "server_error_event"),
        (b'{"choices":[],"usage":{"prompt_tokens":true}}', "malformed_event"),
        (b'{"choices":{"0":1}}', "malformed_event"),
        (b"[1,2]", "malformed_event"),
        (b'{"choices":[{"text":"x","finish_reason":7}]}', "malformed_event"),
    ],
)
def test_bad_events_are_classified(event: bytes, error_class: str) -> None:
    with pytest.raises(RequestFailure) as failed:
        EventReader(StreamTiming()).read([event])
    assert failed.value.error_class == error_class


def test_no_template_after_its_attempts() -> None:
    timing = StreamTiming()
    reader = EventReader(timing)
    odd = b'{"choices":[{"text":"x","finish_reason":null}],"usage":{"completion_tokens":1}}'  # usage: no template
    for _ in range(TEMPLATE_ATTEMPTS + 2):
        reader.read([odd])
    reader.read([chunk(" a"), chunk(" b")])
    assert reader.content == 2 and timing.completion_tokens == 1


# -- when the chunks arrived ----------------------------------------------------------------------------


def test_one_instant_per_read_and_the_worst_gap_between_reads() -> None:
    timing = StreamTiming(chunk_ns=[], chunk_delay_ns=[])
    stamper = ChunkStamper(timing, kernel=False)
    stamper.stamp(500, None, 0, 0, b"x")  # a read of no content (a comment, a split event) ends no gap
    for now, content in ((1_000, 1), (3_000, 3), (9_000, 1), (10_000, 0), (11_000, 2)):
        stamper.stamp(now, None, content, 0, b"x")
    assert timing.first_chunk_ns == 1_000
    assert timing.chunk_ns == [1_000, 3_000, 3_000, 3_000, 9_000, 11_000, 11_000]
    assert timing.chunks == 7 and timing.max_events_per_read == 3
    assert (timing.worst_gap_ns, timing.worst_gap_end_ns) == (6_000, 9_000)
    assert timing.last_chunk_ns == 11_000 and timing.chunk_delay_ns == [-1] * 7


def test_kernel_stamps_move_the_instant_back_by_the_wait() -> None:
    kernel, recv = StreamTiming(), StreamTiming()
    ChunkStamper(kernel, kernel=True).stamp(50_000, 700, 1, 0, b"x")
    ChunkStamper(recv, kernel=False).stamp(50_000, 700, 1, 0, b"x")
    assert kernel.first_chunk_ns == 49_300 and recv.first_chunk_ns == 50_000
    assert kernel.max_read_delay_ns == recv.max_read_delay_ns == 700


def test_a_late_read_of_several_chunks_is_counted_as_possibly_merged() -> None:
    timing = StreamTiming()
    stamper = ChunkStamper(timing, kernel=True)
    stamper.stamp(10 * LATE_READ_NS, LATE_READ_NS - 1, 2, 0, b"x")
    stamper.stamp(20 * LATE_READ_NS, LATE_READ_NS * 5, 1, 0, b"x")  # one chunk: nothing merged, however late
    stamper.stamp(30 * LATE_READ_NS, LATE_READ_NS + 1, 2, 0, b"x")
    assert timing.late_coalesced_reads == 1 and timing.max_read_delay_ns == LATE_READ_NS * 5


def test_capture_offsets_count_from_the_body_across_reads() -> None:
    timing = StreamTiming()
    stamper = ChunkStamper(timing, kernel=False, body_offset=100)
    first, second = b"data: a\n\ndata: b\n", b"\ndata: [DONE]\n\n"
    stamper.stamp(1, None, 1, 0, first)
    stamper.stamp(2, None, 1, 1, second)  # "b" ends on this read's first byte; [DONE] is not content
    assert timing.chunk_last_bytes == [100 + 8, 100 + len(first)]
    assert timing.chunk_last_bytes == [*event_ends(first, 100, 1, 1), 100 + len(first)]
