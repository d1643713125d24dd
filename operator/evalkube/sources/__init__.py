"""Dataset and output sources named by ``uri``: object stores, volumes, pinned HTTPS, files.

- :func:`prepare` pins a source once per run: its identity (ETag, VersionId, sha256, size,
  mtime), its row count and a row index; the only full read, made by trusted code (``evalkube
  run``, or the run's prepare pod in a cluster: never the operator process).
- :func:`read_pinned` reads rows ``[start, stop)`` of a pinned source, checking first that the
  object is still the one pinned; a shard of a plain JSONL or CSV file seeks to its rows, a
  shard of a Parquet file reads only the row groups holding them.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

from evalkube.sources.access import PVC_ROOT, ObjectInfo, SourceAccess, SourceChanged
from evalkube.sources.formats import RowIndex, index_rows, parquet_rows_count, read_rows
from evalkube.sources.pins import SourcePin, identity_digest
from evalkube.sources.uri import CLUSTER_SCHEMES, SourceURI, parse_uri

__all__ = [
    "CLUSTER_SCHEMES",
    "PVC_ROOT",
    "ObjectInfo",
    "SourceAccess",
    "SourceChanged",
    "SourcePin",
    "SourceURI",
    "check_pinned",
    "identity_digest",
    "parse_uri",
    "prepare",
    "read_pinned",
]


def prepare(
    source: SourceURI, access: SourceAccess, where: str, sha256: str | None = None
) -> SourcePin:
    """Pin ``source``: read it once (a Parquet file: its footer only, unless ``sha256`` is
    declared), count its rows, index where they begin, and check a declared ``sha256``."""
    with access.open(source, where) as opened:
        digest: str | None = opened.sha256
        index = RowIndex()
        if source.format == "parquet":
            index.rows = parquet_rows_count(opened.handle, source.raw, where)
            if sha256 is not None and digest is None:
                opened.handle.seek(0)
                digest = _sha256(opened.handle)
        else:
            hashing = _Hashing(opened.handle)
            reader = io.BufferedReader(hashing, buffer_size=1 << 20)
            index = index_rows(reader, source.format, source.compression, source.raw, where)
            while reader.read(1 << 20):  # the rest (a compressed stream's trailer) is hashed too
                pass
            digest = digest or hashing.hexdigest()
    if sha256 is not None and digest != sha256:
        raise SourceChanged(
            f"{where}: {source.raw} has sha256 {digest}, not the {sha256} it is pinned to; "
            "nothing of it was graded"
        )
    info = opened.info
    return SourcePin(
        # a local file as an absolute file:// URL
        uri=Path(source.location).as_uri() if source.scheme == "file" else source.raw,
        format=source.format,
        compression=source.compression,
        size=info.size,
        rows=index.rows,
        etag=info.etag,
        version_id=info.version_id,
        sha256=digest,
        mtime_ns=info.mtime_ns,
        stride=index.stride,
        offsets=index.offsets,
        header_end=index.header_end,
    )


def read_pinned(
    pin: SourcePin, access: SourceAccess, where: str, start: int = 0, stop: int | None = None
) -> Generator[dict[str, Any], None, None]:
    """Rows ``[start, stop)`` of the pinned source (:class:`SourceChanged` if it is not the
    object pinned any more)."""
    source = parse_uri(pin.uri, where, base_dir=Path("/"), fmt=pin.format)
    with access.open(source, where, pin) as opened:
        yield from read_rows(
            opened.handle,
            pin.format,
            pin.compression,
            source.raw,
            where,
            start=start,
            stop=stop,
            seek=pin.seek_point(start),
            header_end=pin.header_end,
        )


def check_pinned(pin: SourcePin, access: SourceAccess, where: str) -> None:
    """Raise :class:`SourceChanged` unless the object is still the one pinned (an https://
    source is checked whenever it is read, against its sha256)."""
    source = parse_uri(pin.uri, where, base_dir=Path("/"), fmt=pin.format)
    if source.scheme != "https":
        with access.open(source, where, pin):
            pass


def _sha256(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


class _Hashing(io.RawIOBase):
    """A read-only stream that hashes every byte read through it."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self._digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        self._digest.update(data)
        buffer[: len(data)] = data
        return len(data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()
