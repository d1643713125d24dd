"""Host side of the worker protocol: frames read strictly from an untrusted peer.

The worker (``evalkube_sandbox.protocol``) writes a 4-byte big-endian length and that many
bytes of JSON. Everything it sends is untrusted data: sizes are capped, JSON must decode,
and the reader never blocks the caller (it runs in its own thread).
"""

from __future__ import annotations

import struct
from typing import IO, Any

from evalkube import limits
from evalkube.util import jsonfast

HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The worker sent bytes that are not a valid frame."""


def encode(message: Any) -> bytes:
    """Encode one request frame for the worker."""
    body = jsonfast.dumps(message)
    return HEADER.pack(len(body)) + body


def read_frame(stream: IO[bytes], max_bytes: int = limits.FRAME_BYTES_MAX) -> Any | None:
    """Read one frame; ``None`` at end of stream; :class:`FrameError` on anything invalid.

    Answers larger than :data:`limits.RESULT_PAYLOAD_BYTES` are replaced, here on the host,
    by the ``oversized`` answer the worker itself sends for them: the worker's own check runs
    inside the sandbox, where a grader can patch it out.
    """
    header = _read_exact(stream, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > max_bytes:
        raise FrameError(f"frame of {size} bytes exceeds the {max_bytes}-byte limit")
    body = _read_exact(stream, size)
    if body is None:
        raise FrameError("stream ended inside a frame")
    try:
        frame = jsonfast.loads(body)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"frame is not JSON: {exc}") from None
    if size > limits.RESULT_PAYLOAD_BYTES:
        cap_answers(frame)
    return frame


def cap_answers(frame: Any) -> None:
    """Replace each answer of a ``results`` frame that encodes to more than
    :data:`limits.RESULT_PAYLOAD_BYTES` by an ``oversized`` answer (in place)."""
    if not isinstance(frame, dict) or frame.get("t") != "results":
        return
    answers = frame.get("answers")
    if not isinstance(answers, list):
        return
    for position, answer in enumerate(answers):
        encoded = jsonfast.dumps(answer)
        if len(encoded) > limits.RESULT_PAYLOAD_BYTES:
            head = encoded[: limits.INVALID_PAYLOAD_REPR_CHARS].decode("utf-8", "replace")
            answers[position] = {
                "ok": True,
                "oversized": {"bytes": len(encoded), "repr": head + "..."},
            }


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    if not data:
        return None if size else b""
    while len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            raise FrameError("stream ended inside a frame")
        data += more
    return data
