"""The files a tracked run carries: every sample's view as JSONL, and the results as JSON."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from evalkube import limits
from evalkube.models import TaskModelResult
from evalkube.store import ResultStore
from evalkube.store.views import sample_view
from evalkube.tracking.mlflow_log import Artifact

SAMPLES = "samples.jsonl"
RESULTS = "results.json"


def write_samples(store: ResultStore, run_id: str, path: Path) -> None:
    """Every sample's view (what ``evalkube samples --format jsonl`` writes), one a line,
    streamed a page at a time, up to :data:`~evalkube.limits.MLFLOW_SAMPLES_BYTES`."""
    size = 0
    with path.open("w", encoding="utf-8", errors="backslashreplace") as out:
        for record in store.iter_pages(run_id, page_size=500):
            line = json.dumps(sample_view(record), ensure_ascii=False) + "\n"
            size += len(line.encode("utf-8", "backslashreplace"))
            if size > limits.MLFLOW_SAMPLES_BYTES:
                break
            out.write(line)


def run_artifacts(
    store: ResultStore, run_id: str, results: Sequence[TaskModelResult]
) -> list[Artifact]:
    """``samples.jsonl`` and ``results.json`` (the aggregates as the EvalRun status holds them)."""

    def results_json(path: Path) -> None:
        wire = [r.to_wire() for r in results]
        path.write_text(json.dumps(wire, indent=2, ensure_ascii=False), encoding="utf-8")

    return [
        Artifact(SAMPLES, functools.partial(write_samples, store, run_id)),
        Artifact(RESULTS, results_json),
    ]
