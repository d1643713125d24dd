"""A model's outputs cannot touch another model's results (``evalkube run``, end to end).

Model outputs are executed by graders (and a model under training may learn to attack its
grader): here the grader patches its worker while grading model A's first sample, so that
every later answer of that worker says 99. Model B's samples are graded by a sandbox of
their own and keep their true scores. (Later samples of model A share A's sandbox: a
grader influences at most its own task x model.) The provider is a fake on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.proxy.fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(180)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")

GRADER = """
import gc

def grade(sample, item):
    if sample["model"] == "fake:model-a" and item["q"] == "q0":
        worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
        encode = worker._encode_results
        worker._encode_results = lambda start, answers: encode(
            start, [dict(a, value=99.0) for a in answers]
        )
    return 1.0 if sample["output_text"].startswith("echo: ") else 0.0
"""


@pytest.mark.parametrize("sandbox", ["process", "gvisor"])
def test_a_patched_worker_never_grades_another_models_samples(tmp_path: Path, sandbox: str) -> None:
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "cross"},
        "spec": {
            "tasks": [
                {
                    "id": "qa",
                    "dataset": {"rows": [{"q": f"q{i}"} for i in range(6)]},
                    "prompt": "{{ item.q }}",
                    "grader": {"type": "python", "source": GRADER},
                }
            ]
        },
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    with FakeUpstream() as upstream:
        run = {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalRun",
            "metadata": {"name": "cross"},
            "spec": {
                "models": ["fake:model-a", "fake:model-b"],
                "shardSize": 2,
                "providers": {"fake": {"baseURL": upstream.base_url, "apiKeyEnv": "FAKE_KEY"}},
            },
        }
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
        done = subprocess.run(
            [
                EVALKUBE, "run", "suite.yaml", "run.yaml", "--sandbox", sandbox,
                "--db", f"sqlite:///{tmp_path / 'r.db'}", "--output", "out.json",
            ],
            cwd=tmp_path,
            env={**os.environ, "FAKE_KEY": "sk-fake-0123456789"},
            capture_output=True,
            text=True,
            timeout=150,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = {r["model"]: r for r in json.loads((tmp_path / "out.json").read_text())["results"]}
    assert results["fake:model-b"]["metrics"] == {"score": 1.0}  # untouched
    assert results["fake:model-b"]["counts"]["valid"] == 6
    # model A's own later samples (its shards share its sandbox) were rewritten
    assert results["fake:model-a"]["metrics"]["score"] > 1.0
