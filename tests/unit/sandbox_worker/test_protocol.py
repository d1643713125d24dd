"""Frames: the worker's protocol module, and the contract between host and worker sides.

``evalkube_sandbox`` imports nothing from ``evalkube``; this test is what keeps the two
implementations of the framing in step (docs/security.md, "The worker channel").
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any

import pytest

from evalkube.sandbox import protocol as host
from evalkube_sandbox import protocol as worker

MESSAGES: list[Any] = [
    {"t": "hello", "protocol": 1, "pid": 1234},
    {"op": "run", "program": "grader", "items": [[{"output_text": "x"}, {"target": "y"}]]},
    {"t": "results", "b": 7, "start": 0, "answers": [{"ok": True, "value": 0.5, "ms": 0.01}]},
    {"unicode": "résumé ✓ 日本語 \U0001f600", "escapes": 'tab\t"quote" back\\slash\nnl'},
    {"nested": {"deep": [[[[{"x": [None, True, False, -1, 2.5, 1e300]}]]]]}},
    {"int64": 2**63 - 1, "negative": -(2**63)},
    [],
    {},
    "just a string",
    0,
    {"empty": "", "long": "x" * 200_000},
]


def frames_of(encode: Any, messages: list[Any]) -> io.BytesIO:
    return io.BytesIO(b"".join(encode(m) for m in messages))


def read_all(read_frame: Any, stream: io.BytesIO) -> list[Any]:
    out = []
    while (frame := read_frame(stream)) is not None:
        out.append(frame)
    return out


# -- the contract -------------------------------------------------------------------------------


def test_headers_agree() -> None:
    assert host.HEADER.format == worker.HEADER.format
    assert host.HEADER.size == worker.HEADER.size == 4


def test_host_frames_decode_on_the_worker() -> None:
    assert read_all(worker.read_frame, frames_of(host.encode, MESSAGES)) == MESSAGES


def test_worker_frames_decode_on_the_host() -> None:
    assert read_all(host.read_frame, frames_of(worker.encode, MESSAGES)) == MESSAGES


@pytest.mark.parametrize("message", [*MESSAGES, None], ids=range(len(MESSAGES) + 1))
def test_each_side_reads_its_own_frames(message: Any) -> None:
    assert worker.read_frame(io.BytesIO(worker.encode(message))) == message
    assert host.read_frame(io.BytesIO(host.encode(message))) == message


def test_both_sides_write_the_same_length_prefix_layout() -> None:
    for encode in (host.encode, worker.encode):
        data = encode({"a": "é"})
        (size,) = struct.unpack(">I", data[:4])
        assert size == len(data) - 4
        assert data[4:].decode("utf-8")  # UTF-8 JSON body, no BOM, no trailing newline


def test_non_finite_numbers_from_the_worker_reach_the_host() -> None:
    # the worker must be able to report a grader's NaN/Infinity; the host must see them
    frame = host.read_frame(io.BytesIO(worker.encode({"v": [math.nan, math.inf, -math.inf]})))
    nan, inf, ninf = frame["v"]
    assert math.isnan(nan)
    assert inf == math.inf
    assert ninf == -math.inf


def test_host_reads_many_frames_split_across_reads() -> None:
    class Trickle(io.RawIOBase):
        """Returns at most 3 bytes per read, like a slow pipe."""

        def __init__(self, data: bytes) -> None:
            self.data = data

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            chunk, self.data = self.data[: min(size, 3)], self.data[min(size, 3) :]
            return chunk

    data = b"".join(worker.encode(m) for m in MESSAGES[:5])
    assert read_all(host.read_frame, Trickle(data)) == MESSAGES[:5]  # type: ignore[arg-type]
    data = b"".join(host.encode(m) for m in MESSAGES[:5])
    assert read_all(worker.read_frame, Trickle(data)) == MESSAGES[:5]  # type: ignore[arg-type]


# -- both sides ---------------------------------------------------------------------------------

SIDES = [
    pytest.param(worker.read_frame, worker.ProtocolError, id="worker"),
    pytest.param(host.read_frame, host.FrameError, id="host"),
]


@pytest.mark.parametrize(("read_frame", "error"), SIDES)
def test_clean_end_of_stream_is_none(read_frame: Any, error: type[Exception]) -> None:
    assert read_frame(io.BytesIO(b"")) is None  # not an error


@pytest.mark.parametrize(("read_frame", "error"), SIDES)
@pytest.mark.parametrize("cut", [2, -1, -3], ids=["in-header", "last-byte", "in-body"])
def test_an_end_inside_the_header_or_the_body_is_an_error(
    read_frame: Any, error: type[Exception], cut: int
) -> None:
    data = worker.encode({"a": 1})
    with pytest.raises(error, match="inside a frame"):
        read_frame(io.BytesIO(data[:cut]))


# -- worker side --------------------------------------------------------------------------------


def test_worker_refuses_oversized_requests() -> None:
    header = worker.HEADER.pack(worker.MAX_REQUEST_BYTES + 1)
    with pytest.raises(worker.ProtocolError, match="exceeds"):
        worker.read_frame(io.BytesIO(header))


# -- host side ----------------------------------------------------------------------------------


def test_host_refuses_frames_over_its_limit_without_reading_them() -> None:
    stream = io.BytesIO(host.HEADER.pack(1_000) + b"x" * 1_000)
    with pytest.raises(host.FrameError, match="exceeds the 999-byte limit"):
        host.read_frame(stream, max_bytes=999)
    assert stream.tell() == 4


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b'{"a": 1} trailing', b""])
def test_host_rejects_bodies_that_are_not_json(body: bytes) -> None:
    with pytest.raises(host.FrameError):
        host.read_frame(io.BytesIO(host.HEADER.pack(len(body)) + body))


def test_host_rejects_absurdly_nested_json() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(host.FrameError):
        host.read_frame(io.BytesIO(host.HEADER.pack(len(body)) + body))
