"""Suites the engine tests write: two tasks over the same rows, one grader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_two_task_suite(
    folder: Path, *, dataset: dict[str, Any], grader: str, shard_size: int, name: str
) -> tuple[Path, Path]:
    """``suite.yaml`` with tasks ``one`` and ``two`` (regex extraction of 0-2 from column
    ``out``, target ``item.a``) and ``run.yaml`` for model ``precomputed``."""
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": name},
        "spec": {
            "tasks": [
                {
                    "id": task,
                    "dataset": dataset,
                    "prompt": "{{ item.n }}",
                    "target": "{{ item.a }}",
                    "extraction": {"type": "regex", "pattern": "([0-2])"},
                    "outputs": {"column": "out"},
                    "grader": {"type": "python", "source": grader, "metricId": "exact"},
                }
                for task in ("one", "two")
            ]
        },
    }
    path = folder / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    run = folder / "run.yaml"
    run.write_text(
        yaml.safe_dump(
            {
                "kind": "EvalRun",
                "metadata": {"name": "r"},
                "spec": {"models": ["precomputed"], "shardSize": shard_size},
            }
        )
    )
    return path, run
