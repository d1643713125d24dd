"""What a run pins of each source: the object's identity and the index shards seek by.

A pin is made once (:func:`evalkube.sources.prepare.prepare`: by ``evalkube run`` before its
first unit, in a cluster by the run's trusted prepare pod) and travels in the run's snapshot.
Every later read checks the object is still the one pinned, so a run, its retried units and
``--resume`` read the same bytes, or fail naming the object.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field

from evalkube.sources.uri import Compression, Format


class SourcePin(BaseModel):
    """One source as a run found it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str
    format: Format
    compression: Compression | None = None
    size: int = Field(ge=0)
    """Bytes of the object as stored (compressed, when it is)."""
    rows: int = Field(ge=0)
    etag: str | None = None
    """The object store's ETag (``s3://``): range reads are made ``If-Match`` it."""
    version_id: str | None = None
    """The object's version, when its bucket keeps versions: reads ask for that version."""
    sha256: str | None = None
    """SHA-256 of the object's bytes, where they were read whole (JSONL, CSV, https://) or a
    ``sha256`` was declared (then checked)."""
    mtime_ns: int | None = None
    """Modification time of a file (local or on a PersistentVolumeClaim)."""
    stride: int = Field(default=0, ge=0)
    """Rows between two offsets of :attr:`offsets` (0: no index; shards read from the start)."""
    offsets: list[int] = Field(default_factory=list)
    """Byte offset of row ``i * stride`` (plain JSONL and CSV)."""
    header_end: int = Field(default=0, ge=0)
    """Where a CSV's header record ends (rows are read after it is parsed)."""
    aligned: bool = False
    """Outputs only: record ``i`` holds row ``i``'s output (same ids, same order, as many), so
    a shard reads the outputs of its own row range, not the whole object."""

    def seek_point(self, row: int) -> tuple[int, int]:
        """``(byte offset, rows to skip)`` to reach ``row`` (``(0, row)`` without an index)."""
        if not self.stride or not self.offsets:
            return 0, row
        index = min(row // self.stride, len(self.offsets) - 1)
        return self.offsets[index], row - index * self.stride

    def identity(self) -> str:
        """What names these bytes (for the run's suite version): every field but the index."""
        return self.model_dump_json(exclude={"offsets", "stride", "header_end", "aligned"})


def identity_digest(pins: list[SourcePin]) -> str:
    """A short digest over several pins' identities."""
    digest = hashlib.sha256()
    for pin in pins:
        digest.update(pin.identity().encode())
    return digest.hexdigest()
