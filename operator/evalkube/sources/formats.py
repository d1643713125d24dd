"""Rows of a source's bytes: JSONL (plain, gzip, zstd), CSV (plain, gzip, zstd), Parquet.

Two passes over the same readers: the prepare step counts rows and notes where every
:data:`~evalkube.limits.SOURCE_INDEX_STRIDE`-th begins (:func:`index_rows`), and a shard reads
``[start, stop)`` from the nearest offset (:func:`read_rows`), skipping earlier lines without
parsing them. Both count rows the same way (blank lines are not rows), so a shard's rows are
exactly those its index promises. A row is a JSON-compatible ``dict`` (a Parquet timestamp
becomes ISO 8601 text, bytes become text); every malformed row names the source and the row.
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from evalkube import limits
from evalkube.models import ConfigError
from evalkube.sources.files import bounded_lines
from evalkube.sources.uri import Compression, Format
from evalkube.util import jsonfast

# A CSV field may be as long as a JSONL line (the module's default is 131,072 characters).
csv.field_size_limit(limits.DATASET_LINE_BYTES)


@dataclass
class RowIndex:
    """What :func:`index_rows` found: the row count and where rows begin."""

    rows: int = 0
    stride: int = 0
    offsets: list[int] = field(default_factory=list)
    header_end: int = 0

    def note(self, row: int, offset: int) -> None:
        """Row ``row`` begins at ``offset`` (called for every row, in order)."""
        if row % self.stride:
            return
        if len(self.offsets) == limits.SOURCE_INDEX_OFFSETS_MAX:
            del self.offsets[1::2]  # keep row 0, 2s, 4s, ...: the stride doubles
            self.stride *= 2
            if row % self.stride:
                return
        self.offsets.append(offset)


def decompressed(handle: IO[bytes], compression: Compression | None) -> IO[bytes]:
    """The stream's bytes uncompressed, read as they are needed."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    if compression == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(
            handle, read_across_frames=True, closefd=False
        )
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return handle


def index_rows(
    handle: IO[bytes], fmt: Format, compression: Compression | None, uri: str, where: str
) -> RowIndex:
    """Count the rows of a JSONL or CSV source, noting offsets when it is not compressed (a
    compressed source cannot be entered in the middle: its shards read from the start)."""
    index = RowIndex(stride=limits.SOURCE_INDEX_STRIDE)
    stream = decompressed(handle, compression)
    ranged = compression is None
    if fmt == "jsonl":
        for row, (offset, number, line) in enumerate(_jsonl_lines(stream, uri, where)):
            if not line.lstrip().startswith(b"{"):
                raise ConfigError(f"{where}: {uri} line {number}: a row must be a JSON object")
            if ranged:
                index.note(row, offset)
            index.rows = row + 1
    else:
        records = _csv_records(stream, uri, where)
        header = next(records, None)
        index.header_end = header[0] if header else 0
        for row, (offset, _fields) in enumerate(records):
            if ranged:
                index.note(row, offset)
            index.rows = row + 1
    if not ranged:
        index.stride, index.offsets = 0, []
    return index


def read_rows(
    handle: IO[bytes],
    fmt: Format,
    compression: Compression | None,
    uri: str,
    where: str,
    *,
    start: int = 0,
    stop: int | None = None,
    seek: tuple[int, int] = (0, 0),
    header_end: int = 0,
) -> Iterator[dict[str, Any]]:
    """Rows ``start`` to ``stop`` (``None``: the end). ``seek``: ``(offset, rows to skip)``
    of the index (the offset of row ``start - skip``); ``header_end``: a CSV's header end."""
    if fmt == "parquet":
        yield from _parquet_rows(handle, uri, where, start, stop)
        return
    offset, skip = seek
    if fmt == "csv":
        records = _csv_records(decompressed(handle, compression), uri, where)
        header = next(records, None)
        if header is None:
            return
        names = header[1]
        if offset > header_end:
            handle.seek(offset)
            records = _csv_records(handle, uri, where, first=False)
        for row, (_offset, fields) in enumerate(records, start - skip):
            if stop is not None and row >= stop:
                return
            if row >= start:
                yield _csv_row(names, fields, uri, where, row)
        return
    if offset:
        handle.seek(offset)
    lines = _jsonl_lines(decompressed(handle, compression), uri, where, base=offset)
    for row, (_offset, number, line) in enumerate(lines, start - skip):
        if stop is not None and row >= stop:
            return
        if row >= start:
            yield _json_row(line, uri, where, row, number if not offset else None)


def _jsonl_lines(
    stream: IO[bytes], uri: str, where: str, base: int = 0
) -> Iterator[tuple[int, int, bytes]]:
    """``(offset, line number, line)`` of every non-blank line (offsets from ``base``)."""
    offset = base
    for number, line in bounded_lines(stream, where, uri):
        here, offset = offset, offset + len(line)
        if line.strip():
            yield here, number, line


def parse_json(data: bytes, described: str) -> Any:
    """JSON of a dataset's row (or file); never a ``RecursionError`` or ``MemoryError``
    traceback: errors start with ``described`` (the field, the file and where in it)."""
    try:
        return jsonfast.loads(data)
    except ValueError as exc:
        raise ConfigError(f"{described}: invalid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{described}: JSON nested too deeply") from None
    except MemoryError:
        raise ConfigError(f"{described}: too large to parse in memory") from None


def _json_row(line: bytes, uri: str, where: str, row: int, number: int | None) -> dict[str, Any]:
    at = f"line {number}" if number is not None else f"row {row:,}"
    value = parse_json(line, f"{where}: {uri} {at}")
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {uri} {at}: a row must be a JSON object")
    return value


def _csv_records(
    stream: IO[bytes], uri: str, where: str, first: bool = True
) -> Iterator[tuple[int, list[str]]]:
    """``(end offset of the header, header)`` first (unless not ``first``), then
    ``(start offset, fields)`` of every non-blank record. Offsets are exact because
    :mod:`csv` reads no further than the record it returns.

    A record (quoted fields may span lines) is read to at most
    :data:`limits.DATASET_LINE_BYTES` bytes, the JSONL line cap, and refused past it without
    reading on; it holds at most :data:`limits.DATASET_CSV_FIELDS_MAX` fields."""
    position = [stream.tell() if stream.seekable() else 0]
    line = [0, 1]  # lines read; the line the current record starts on

    def lines() -> Iterator[str]:
        while True:
            if position[0] == started:
                line[1] = line[0] + 1
            room = limits.DATASET_LINE_BYTES - (position[0] - started)
            data = stream.readline(room + 1)
            if not data:
                return
            line[0] += 1
            position[0] += len(data)
            if len(data) > room:
                raise ConfigError(
                    f"{where}: {uri} line {line[1]}: a CSV record longer than "
                    f"{limits.DATASET_LINE_BYTES:,} bytes (still open at line {line[0]}: an "
                    "unclosed quote?); a row must fit in at most that many bytes"
                )
            try:
                yield data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{where}: {uri}: not UTF-8 text (byte {position[0] - len(data) + exc.start})"
                ) from None

    def fields(record: list[str]) -> list[str]:
        if len(record) > limits.DATASET_CSV_FIELDS_MAX:
            raise ConfigError(
                f"{where}: {uri} line {line[1]}: a CSV record of {len(record):,} fields; "
                f"at most {limits.DATASET_CSV_FIELDS_MAX:,}"
            )
        return record

    reader = csv.reader(lines())
    started = position[0]
    try:
        if first:
            header = next(reader, None)
            if header is None:
                return
            if len(set(fields(header))) != len(header) or not all(header):
                raise ConfigError(
                    f"{where}: {uri}: the header row must name every column once: {header[:20]}"
                )
            yield position[0], header
            started = position[0]
        for record in reader:
            if record:
                yield started, fields(record)
            started = position[0]
    except csv.Error as exc:
        raise ConfigError(f"{where}: {uri} line {reader.line_num}: {exc}") from None
    except MemoryError:
        raise ConfigError(
            f"{where}: {uri} line {line[1]}: a CSV record too large to parse in memory"
        ) from None


def _csv_row(names: list[str], fields: list[str], uri: str, where: str, row: int) -> dict[str, Any]:
    if len(fields) != len(names):
        raise ConfigError(
            f"{where}: {uri} row {row:,}: {len(fields)} fields where the header names {len(names)}"
        )
    return dict(zip(names, fields, strict=True))


# -- Parquet ------------------------------------------------------------------------------------
def parquet_rows_count(handle: IO[bytes], uri: str, where: str) -> int:
    """Rows of a Parquet file, from its footer alone."""
    return int(_parquet_file(handle, uri, where).metadata.num_rows)


def _parquet_file(handle: IO[bytes], uri: str, where: str) -> Any:
    import pyarrow.lib
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(handle)
    except (pyarrow.lib.ArrowException, OSError, ValueError) as exc:
        raise ConfigError(f"{where}: {uri} is not a readable Parquet file ({exc})") from None


def _parquet_rows(
    handle: IO[bytes], uri: str, where: str, start: int, stop: int | None
) -> Iterator[dict[str, Any]]:
    """Rows ``[start, stop)``: only the row groups holding them are read."""
    import pyarrow.lib

    parquet = _parquet_file(handle, uri, where)
    meta = parquet.metadata
    stop = meta.num_rows if stop is None else min(stop, meta.num_rows)
    groups: list[int] = []
    first, row = 0, 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if row + rows > start and row < stop:
            if not groups:
                first = row
            groups.append(group)
        row += rows
    if not groups:
        return
    plain = _json_native(parquet.schema_arrow)
    row = first
    try:
        batches = parquet.iter_batches(
            batch_size=limits.SOURCE_PARQUET_BATCH_ROWS, row_groups=groups
        )
        for batch in batches:
            if row + batch.num_rows <= start:
                row += batch.num_rows
                continue
            for value in batch.to_pylist():
                if row >= stop:
                    return
                if row >= start:
                    yield value if plain else _jsonable(value)
                row += 1
    except (pyarrow.lib.ArrowException, OSError) as exc:
        raise ConfigError(f"{where}: {uri}: cannot read row {row:,} ({exc})") from None


def _json_native(schema: Any) -> bool:
    """Whether every column converts to JSON values as it is (no dates, decimals, bytes)."""
    import pyarrow.types as t

    def plain(kind: Any) -> bool:
        if t.is_list(kind) or t.is_large_list(kind):
            return plain(kind.value_type)
        if t.is_struct(kind):
            return all(plain(kind.field(i).type) for i in range(kind.num_fields))
        return bool(
            t.is_string(kind)
            or t.is_large_string(kind)
            or t.is_integer(kind)
            or t.is_floating(kind)
            or t.is_boolean(kind)
            or t.is_null(kind)
        )

    return all(plain(f.type) for f in schema)


def _jsonable(value: Any) -> Any:
    """``value`` with the types JSON has no word for written as text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return value
