"""A ``grade_batch`` grader's model calls belong to no one sample; they are still counted in
the run's ``modelCalls`` (they used to be taken from the bridge and dropped).

A real ``evalkube run`` subprocess; the judge provider is a real HTTP server on loopback
speaking the Responses API.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_run_outcomes import evalkube, runs, write_suite
from tests.integration.proxy.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.timeout(120)]

BATCH_JUDGE = """
def grade_batch(samples, ctx):
    for n in range(3):
        ctx.responses_create(input=f"judge the batch, pass {n}: {len(samples)} samples")
    return {"metrics": {"judged": 1.0}, "samples": []}
"""


def test_a_batch_graders_judge_calls_are_counted_in_the_run(tmp_path: Path) -> None:
    with FakeUpstream() as judge:
        suite, run = write_suite(tmp_path, base_url=judge.base_url, precomputed=True)
        suite.write_text(
            suite.read_text().replace(
                "grader: {type: python, file: grader.py}",
                "grader: {type: python, file: grader.py, contract: batch, "
                "modelAccess: gateway}\n    metrics: [judged]",
            )
        )
        run.write_text(
            run.read_text().replace("  generation:", "  judgeModel: openai:judge-1\n  generation:")
        )
        (tmp_path / "grader.py").write_text(BATCH_JUDGE)
        done = evalkube(tmp_path, "run", str(suite), str(run))
        seen = len(judge.received)
    assert done.returncode == 0, done.stderr
    assert seen == 3
    [(_run_id, phase, _version, summary)] = runs(tmp_path)
    assert phase == "Succeeded"
    [result] = json.loads(summary)["results"]
    assert result["metrics"]["judged"] == 1.0
    assert result["model_calls"] == {"judge": 3}, result
