"""A JSONL dataset's row index: a unit in the middle of the dataset seeks to its shard (rows
counted once at planning) and reads exactly the rows a read from the start would give."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalkube.engine import loading
from evalkube.engine.loading import (
    ROW_INDEX_EVERY,
    LoadedSuite,
    count_dataset_rows,
    shard_rows,
)
from evalkube.models import ConfigError, EvalSuite

ROWS = 3 * ROW_INDEX_EVERY + 100


def _line(i: int) -> str:
    # rows of different lengths, a blank line now and then: offsets are not a multiple of
    # anything, and line numbers run ahead of row numbers
    return json.dumps({"i": i, "text": "x" * (i % 7)}) + ("\n\n" if i % 500 == 3 else "\n")


def _suite(folder: Path) -> LoadedSuite:
    suite = EvalSuite.model_validate(
        {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalSuite",
            "metadata": {"name": "rows"},
            "spec": {
                "tasks": [
                    {
                        "id": "t",
                        "dataset": {"path": "rows.jsonl"},
                        "target": "{{ item.i }}",
                        "grader": {"type": "python", "source": "def grade(s, i): return 1.0"},
                    }
                ]
            },
        }
    )
    return LoadedSuite(suite, folder)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(_line(i) for i in range(ROWS)))
    return path


@pytest.fixture
def lines_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The numbers of the lines the loader reads (counted or skipped rows included)."""
    read: list[int] = []
    original = loading.bounded_lines

    def spy(*args: Any) -> Iterator[tuple[int, bytes]]:
        for number, line in original(*args):
            read.append(number)
            yield number, line

    monkeypatch.setattr(loading, "bounded_lines", spy)
    return read


def _indexed(folder: Path) -> LoadedSuite:
    loaded = _suite(folder)
    assert count_dataset_rows(loaded, loaded.suite.spec.tasks[0]) == ROWS
    return loaded


STARTS = [0, 1, ROW_INDEX_EVERY - 1, ROW_INDEX_EVERY, ROW_INDEX_EVERY + 1, 2 * ROW_INDEX_EVERY + 7]


@pytest.mark.parametrize("start", [*STARTS, ROWS - 5])
def test_a_shard_read_through_the_index_is_the_shard_read_from_the_start(
    dataset: Path, start: int
) -> None:
    indexed = _indexed(dataset.parent)
    task = indexed.suite.spec.tasks[0]
    stop = min(start + 1_500, ROWS)
    rows = shard_rows(indexed, task, start, stop)
    assert [row["i"] for row in rows] == list(range(start, stop))
    assert rows == shard_rows(_suite(dataset.parent), task, start, stop)  # no index: a scan


def test_a_unit_in_the_middle_reads_from_the_nearest_indexed_row_not_from_the_start(
    dataset: Path, lines_read: list[int]
) -> None:
    indexed = _indexed(dataset.parent)
    task = indexed.suite.spec.tasks[0]
    lines_read.clear()
    start = 3 * ROW_INDEX_EVERY + 10
    shard_rows(indexed, task, start, start + 20)
    assert len(lines_read) < 40  # 10 skipped, 20 read, and the blank lines among them
    lines_read.clear()
    shard_rows(_suite(dataset.parent), task, start, start + 20)
    assert len(lines_read) > start  # without the index: every line before the shard


def test_after_a_seek_a_bad_row_is_named_by_its_line_in_the_file(dataset: Path) -> None:
    lines = dataset.read_text().splitlines(keepends=True)
    bad = next(n for n, line in enumerate(lines) if line.startswith('{"i": 2100,'))
    lines[bad] = '{"i": oops}\n'
    dataset.write_text("".join(lines))
    indexed = _indexed(dataset.parent)
    with pytest.raises(ConfigError, match=rf"line {bad + 1}\b"):
        shard_rows(indexed, indexed.suite.spec.tasks[0], 2 * ROW_INDEX_EVERY, ROWS)


def test_a_dataset_changed_after_counting_is_read_from_the_start(
    dataset: Path, lines_read: list[int]
) -> None:
    indexed = _indexed(dataset.parent)
    task = indexed.suite.spec.tasks[0]
    dataset.write_text(_line(-1) + dataset.read_text())  # one row more in front
    rows = shard_rows(indexed, task, 2 * ROW_INDEX_EVERY, 2 * ROW_INDEX_EVERY + 3)
    assert [row["i"] for row in rows] == [2 * ROW_INDEX_EVERY - 1 + n for n in range(3)]
    assert len(lines_read) > 2 * ROW_INDEX_EVERY


def test_an_edit_that_keeps_size_and_time_but_moves_a_row_start_is_read_from_the_start(
    dataset: Path,
) -> None:
    """The index is checked against the file's identity (device, inode, size, modification
    time) and a line end just before the offset: a same-size edit with the time put back
    moves the start of row ROW_INDEX_EVERY one byte back (read from there, its line would
    lose its ``{``), which the line end check catches."""
    indexed = _indexed(dataset.parent)
    task = indexed.suite.spec.tasks[0]
    info = dataset.stat()
    text = dataset.read_text()
    text = text.replace('{"i": 1, "text": "x"}', '{"i": 1, "text": ""}', 1)
    text = text.replace('{"i": 2000, "text": "xxxxx"}', '{"i": 2000, "text": "xxxxxx"}', 1)
    dataset.write_text(text)
    os.utime(dataset, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert dataset.stat().st_size == info.st_size
    rows = shard_rows(indexed, task, ROW_INDEX_EVERY, ROW_INDEX_EVERY + 3)
    assert [row["i"] for row in rows] == [ROW_INDEX_EVERY + n for n in range(3)]
