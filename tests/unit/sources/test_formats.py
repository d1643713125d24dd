"""Source readers over real files: every format, every shard range, the row index."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from evalkube import limits
from evalkube.models import ConfigError
from evalkube.sources import SourceAccess, parse_uri, prepare, read_pinned
from evalkube.sources.formats import RowIndex

ROWS = [{"id": f"r{i}", "q": f'line {i}\nwith, "quotes"', "a": str(i)} for i in range(5_003)]
RANGES = [
    (0, 1),
    (0, 10),
    (999, 1_001),
    (1_000, 2_000),
    (2_345, 4_100),
    (5_000, 5_003),
    (5_002, None),
]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    # blank lines are not rows: every seventh row is followed by one
    return b"".join(
        json.dumps(r).encode() + b"\n" + (b"\n" if i % 7 == 0 else b"") for i, r in enumerate(rows)
    )


def _csv(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["id", "q", "a"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def _write(directory: Path, name: str) -> Path:
    path = directory / name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=700)
        return path
    data = _csv(ROWS) if ".csv" in name else _jsonl(ROWS)
    if name.endswith(".gz"):
        data = gzip.compress(data)
    elif name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "name", ["d.jsonl", "d.jsonl.gz", "d.jsonl.zst", "d.csv", "d.csv.gz", "d.parquet"]
)
def test_every_shard_reads_exactly_its_rows(tmp_path: Path, name: str) -> None:
    _write(tmp_path, name)
    access = SourceAccess()
    pin = prepare(parse_uri(name, "f", tmp_path), access, "f")
    assert pin.rows == len(ROWS)
    for start, stop in RANGES:
        assert list(read_pinned(pin, access, "f", start, stop)) == ROWS[start:stop], (start, stop)


@pytest.mark.parametrize("name", ["d.jsonl", "d.csv"])
def test_plain_files_are_indexed_and_shards_seek(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name)
    pin = prepare(parse_uri(name, "f", tmp_path), SourceAccess(), "f")
    assert pin.stride == limits.SOURCE_INDEX_STRIDE
    assert len(pin.offsets) == 6  # rows 0, 1000, ..., 5000
    offset, skip = pin.seek_point(2_345)
    assert skip == 345
    data = path.read_bytes()
    # the offset is where row 2000 starts
    assert (
        data[offset:]
        .lstrip(b"\n")
        .startswith(json.dumps(ROWS[2_000]).encode() if name.endswith(".jsonl") else b"r2000,")
    )


@pytest.mark.parametrize("name", ["d.jsonl.gz", "d.jsonl.zst", "d.csv.gz"])
def test_compressed_files_are_not_indexed(tmp_path: Path, name: str) -> None:
    _write(tmp_path, name)
    pin = prepare(parse_uri(name, "f", tmp_path), SourceAccess(), "f")
    assert (pin.stride, pin.offsets) == (0, [])
    assert pin.seek_point(4_000) == (0, 4_000)


def test_the_index_stays_bounded_by_doubling_its_stride() -> None:
    index = RowIndex(stride=1)
    for row in range(limits.SOURCE_INDEX_OFFSETS_MAX * 5 + 3):
        index.note(row, row * 10)
    assert len(index.offsets) <= limits.SOURCE_INDEX_OFFSETS_MAX
    assert index.stride == 8
    assert index.offsets == [r * 10 for r in range(0, len(index.offsets) * 8, 8)]


def test_a_pin_names_the_bytes(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.jsonl")
    import hashlib

    pin = prepare(parse_uri("d.jsonl", "f", tmp_path), SourceAccess(), "f")
    assert pin.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert pin.size == path.stat().st_size
    assert pin.uri == path.as_uri()


def test_a_declared_sha256_that_does_not_match_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "d.parquet")
    with pytest.raises(
        ConfigError,
        match=r"tasks\[t\].dataset.uri: d.parquet has sha256 .*, not the 0+ it is pinned to",
    ):
        prepare(
            parse_uri("d.parquet", "tasks[t].dataset.uri", tmp_path),
            SourceAccess(),
            "tasks[t].dataset.uri",
            "0" * 64,
        )


def test_a_file_changed_after_pinning_is_named_not_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.jsonl")
    access = SourceAccess()
    pin = prepare(parse_uri("d.jsonl", "f", tmp_path), access, "tasks[t].dataset.uri")
    path.write_bytes(_jsonl(ROWS[:10]))
    with pytest.raises(ConfigError, match="changed since the run pinned it"):
        list(read_pinned(pin, access, "tasks[t].dataset.uri", 0, 5))


def test_malformed_rows_name_the_source_and_the_row(tmp_path: Path) -> None:
    rows = _jsonl(ROWS[:1_500]) + b"{not json\n"
    (tmp_path / "d.jsonl").write_bytes(rows)
    access = SourceAccess()
    pin = prepare(parse_uri("d.jsonl", "f", tmp_path), access, "w")
    # a shard that starts at an index offset knows its row, not its line
    with pytest.raises(ConfigError, match=r"w: file://.*d.jsonl row 1,500: invalid JSON"):
        list(read_pinned(pin, access, "w", 1_200, None))
    (tmp_path / "e.jsonl").write_bytes(b'{"a": 1}\n[1, 2]\n')
    with pytest.raises(ConfigError, match="line 2: a row must be a JSON object"):
        prepare(parse_uri("e.jsonl", "f", tmp_path), access, "w")


def test_csv_rows_must_match_the_header(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("id,q\n1,a\n2,b,extra\n")
    access = SourceAccess()
    pin = prepare(parse_uri("d.csv", "f", tmp_path), access, "w")
    with pytest.raises(ConfigError, match="row 1: 3 fields where the header names 2"):
        list(read_pinned(pin, access, "w"))
    (tmp_path / "e.csv").write_text("id,id\n1,2\n")
    with pytest.raises(ConfigError, match="the header row must name every column once"):
        prepare(parse_uri("e.csv", "f", tmp_path), access, "w")


def test_a_line_past_the_cap_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_bytes(
        b'{"a": "' + b"x" * (limits.DATASET_LINE_BYTES + 10) + b'"}\n'
    )
    with pytest.raises(ConfigError, match="line 1: longer than"):
        prepare(parse_uri("d.jsonl", "f", tmp_path), SourceAccess(), "w")


def test_a_fifo_or_device_is_refused(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "p.jsonl")
    with pytest.raises(
        ConfigError, match=r"p.jsonl: is a FIFO \(named pipe\); give a regular file"
    ):
        prepare(parse_uri("p.jsonl", "f", tmp_path), SourceAccess(), "w")
    with pytest.raises(ConfigError, match="/dev/zero: is a character device"):
        prepare(parse_uri("file:///dev/zero", "f", tmp_path, "jsonl"), SourceAccess(), "w")


def test_parquet_values_json_has_no_word_for_become_text(tmp_path: Path) -> None:
    import datetime
    import decimal

    table = pa.table(
        {
            "id": ["a"],
            "at": pa.array([datetime.datetime(2026, 1, 2, 3, 4, 5)], pa.timestamp("s")),
            "price": pa.array([decimal.Decimal("1.25")], pa.decimal128(5, 2)),
            "blob": pa.array([b"\xff\x00"], pa.binary()),
            "tags": pa.array([["x", "y"]]),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    access = SourceAccess()
    pin = prepare(parse_uri("d.parquet", "f", tmp_path), access, "w")
    [row] = list(read_pinned(pin, access, "w"))
    assert row == {
        "id": "a",
        "at": "2026-01-02T03:04:05",
        "price": "1.25",
        "blob": "/wA=",
        "tags": ["x", "y"],
    }
    json.dumps(row)


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    (tmp_path / "d.parquet").write_bytes(b"PAR1 but not really")
    with pytest.raises(ConfigError, match="is not a readable Parquet file"):
        prepare(parse_uri("d.parquet", "f", tmp_path), SourceAccess(), "w")


def test_a_csv_record_spread_over_lines_is_capped_like_a_line(tmp_path: Path) -> None:
    """Quoted newlines let one record span any number of lines: 4 MiB lines of empty
    fields, each line closing the quote the previous one opened, make one record of
    millions of fields unless its bytes are capped."""
    line = b'"' + b"," * (4 * 1024 * 1024) + b'"\n'
    with (tmp_path / "d.csv").open("wb") as handle:
        handle.write(b'id,q\n1,a\n2,"\n')
        for _ in range(3):
            handle.write(line)
    with pytest.raises(
        ConfigError,
        match=r"w: .*d\.csv line 3: a CSV record longer than 8,388,608 bytes "
        r"\(still open at line 5",
    ):
        prepare(parse_uri("d.csv", "f", tmp_path), SourceAccess(), "w")


def test_a_csv_record_of_too_many_fields_names_its_line(tmp_path: Path) -> None:
    many = ",".join(["x"] * (limits.DATASET_CSV_FIELDS_MAX + 1))
    (tmp_path / "d.csv").write_text(f'id,q\n1,a\n2,"b\n",{many}\n')
    with pytest.raises(ConfigError, match=r"d\.csv line 3: a CSV record of 10,003 fields"):
        prepare(parse_uri("d.csv", "f", tmp_path), SourceAccess(), "w")
    (tmp_path / "h.csv").write_text(many + "\n")
    with pytest.raises(ConfigError, match=r"h\.csv line 1: a CSV record of 10,001 fields"):
        prepare(parse_uri("h.csv", "f", tmp_path), SourceAccess(), "w")


def test_a_memory_error_while_parsing_csv_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d.csv").write_text("id,q\n1,a\n")

    def exhausted(lines: Any) -> Any:
        next(lines)
        raise MemoryError

    def reader(lines: Any) -> Any:
        return iter(lambda: exhausted(lines), None)

    monkeypatch.setattr("evalkube.sources.formats.csv.reader", reader)
    with pytest.raises(ConfigError, match=r"d\.csv line 1: a CSV record too large to parse"):
        prepare(parse_uri("d.csv", "f", tmp_path), SourceAccess(), "w")
