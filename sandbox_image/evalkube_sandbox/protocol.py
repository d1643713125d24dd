"""Frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.

Requests (host -> worker) and answers (worker -> host) are batched: one frame carries many
executions, because under gVisor each flushed write costs hundreds of microseconds.
The host side lives in ``evalkube.sandbox.protocol``; a contract test keeps both in step.
"""

from __future__ import annotations

import json
import struct

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
MAX_REQUEST_BYTES = 512 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a frame."""


def encode(message: Any) -> bytes:
    """Serialize one message as a frame (NaN/Infinity allowed: the host rejects them)."""
    try:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a user string: escape it as \udxxx
        body = json.dumps(message, separators=(",", ":")).encode("ascii")
    return HEADER.pack(len(body)) + body


def read_frame(stream: BinaryIO) -> Any | None:
    """Read one frame; ``None`` at a clean end of stream."""
    header = _read_exact(stream, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_REQUEST_BYTES:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_REQUEST_BYTES}")
    body = _read_exact(stream, size)
    if body is None:
        raise ProtocolError("stream ended inside a frame")
    return json.loads(body)


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks = []
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            if remaining == size:
                return None
            raise ProtocolError("stream ended inside a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
