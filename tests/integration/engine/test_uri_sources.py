"""``evalkube run``'s engine over ``uri`` sources on this machine: the same scores from a
Parquet, a gzip or zstd JSONL and a CSV copy of one dataset as from the JSONL file, shards
that read only their rows, and a ``--resume`` that refuses a source changed since the run
pinned it (naming it) instead of mixing two versions of the data."""

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
import yaml
import zstandard

from evalkube.engine import load_files, resolve_run_spec
from evalkube.local import LocalEngine
from evalkube.models import ConfigError
from evalkube.sandbox import ProcessBackend
from evalkube.store import ResultStore

EXACT = "def grade(sample, item):\n    return float(sample['output_text'] == item['a'])\n"
ROWS = [{"id": f"r{i}", "a": str(i % 10), "out": str(i % 7)} for i in range(2_500)]


def write(folder: Path, name: str) -> None:
    path = folder / name
    lines = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=300)
    elif name.endswith(".csv"):
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=["id", "a", "out"])
        writer.writeheader()
        writer.writerows(ROWS)
        path.write_text(text.getvalue())
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    else:
        path.write_bytes(lines)


def run_suite(folder: Path, dataset: dict[str, Any], store: ResultStore) -> dict[str, Any]:
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "uri"},
        "spec": {
            "tasks": [
                {
                    "id": "qa",
                    "dataset": {**dataset, "idField": "id"},
                    "outputs": {"column": "out"},
                    "grader": {"type": "python", "source": EXACT},
                }
            ]
        },
    }
    run = {
        "kind": "EvalRun",
        "metadata": {"name": "r"},
        "spec": {"models": ["precomputed"], "shardSize": 400},
    }
    (folder / "suite.yaml").write_text(yaml.safe_dump_all([suite, run]))
    loaded, run_file = load_files(folder / "suite.yaml", None)
    spec = resolve_run_spec(loaded, run_file, None)
    summary = LocalEngine(store, ProcessBackend()).start(loaded, spec)
    return summary.to_json()


@pytest.mark.parametrize("name", ["d.parquet", "d.jsonl.gz", "d.jsonl.zst", "d.csv", "d.jsonl"])
def test_every_format_scores_as_the_jsonl_path(tmp_path: Path, name: str) -> None:
    write(tmp_path, "base.jsonl")
    write(tmp_path, name)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        base = run_suite(tmp_path, {"path": "base.jsonl"}, store)
        other = run_suite(tmp_path, {"uri": name}, store)
        samples = sorted(s.row_id for s in store.iter_samples(other["run_id"]))
    finally:
        store.close()
    assert other["phase"] == "Succeeded"
    assert other["results"][0]["metrics"] == base["results"][0]["metrics"]
    assert other["results"][0]["counts"] == base["results"][0]["counts"]
    assert samples == sorted(r["id"] for r in ROWS)  # each row once: 7 shards of 400, no overlap
    assert other["suite_version"] != base["suite_version"]


def test_resume_refuses_a_source_changed_since_the_run_pinned_it(tmp_path: Path) -> None:
    write(tmp_path, "d.parquet")
    store = ResultStore.open(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        summary = run_suite(tmp_path, {"uri": "d.parquet"}, store)
        store.finish_run(summary["run_id"], "Failed", {"reason": "as if it had stopped"})
        pq.write_table(pa.Table.from_pylist(ROWS[:10]), tmp_path / "d.parquet")
        engine = LocalEngine(store, ProcessBackend())
        with pytest.raises(
            ConfigError,
            match=r"tasks\[qa\].dataset.uri: file://.*d.parquet changed since the run pinned it",
        ):
            engine.resume(summary["run_id"])
    finally:
        store.close()


def test_outputs_in_row_order_are_read_by_range(tmp_path: Path) -> None:
    """Outputs whose record i is row i's are marked aligned when pinned, and a unit's source
    then reads its own range of them; shuffled ones are not, and are read whole."""
    from evalkube.engine.candidates import PrecomputedSource

    write(tmp_path, "d.parquet")
    records = [{"id": r["id"], "output_text": r["out"]} for r in ROWS]
    (tmp_path / "in-order.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    shuffled = records[1:] + records[:1]
    (tmp_path / "shuffled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shuffled))
    for name, aligned in (("in-order.jsonl", True), ("shuffled.jsonl", False)):
        suite = {
            "apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite", "metadata": {"name": "o"},
            "spec": {"tasks": [{"id": "qa", "dataset": {"uri": "d.parquet", "idField": "id"},
                                "outputs": {"uri": name},
                                "grader": {"type": "python", "source": EXACT}}]},
        }  # fmt: skip
        (tmp_path / "o.yaml").write_text(yaml.safe_dump(suite))
        loaded, _ = load_files(tmp_path / "o.yaml", None)
        task = loaded.task("qa")
        assert loaded.pin(task, "outputs").aligned is aligned
        source = PrecomputedSource(task, None, loaded, rows_range=(400, 800))
        indexed = source._by_id or {}
        assert len(indexed) == (400 if aligned else len(ROWS))
        rows = ROWS[400:800]
        found = source.candidates(rows, [r["id"] for r in rows], [None] * len(rows))
        assert [c.output_text for c in found] == [r["out"] for r in rows]
