"""A kill while model-backed graders call the judge, then `--resume`: the judge's answers
that arrived are kept and given back, so only the call in flight is made again.

Graded samples are stored a chunk at a time; before the graders' answers were kept as they
arrived, a kill lost every judge answer since the last chunk and resume paid for them again.
`evalkube run` is a real subprocess; the judge is a fake OpenAI Responses server on loopback
that answers slowly and counts calls by their input.
"""

from __future__ import annotations

import collections
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.interrupting import SlowUpstream, stop_after_calls, write_inputs

pytestmark = [pytest.mark.timeout(240)]

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
ROWS = 80
DELAY = 0.05

GRADER = """
def grade(sample, item, ctx):
    first = ctx.responses_create(input="judge " + sample["output_text"])
    second = ctx.responses_create(input="again " + sample["output_text"])
    text = first["output"][0]["content"][0]["text"] + second["output"][0]["content"][0]["text"]
    expected = "echo: judge " + item["out"] + "echo: again " + item["out"]
    return 1.0 if text == expected else 0.0
"""


def test_kill_while_judging_then_resume_repeats_only_the_call_in_flight(tmp_path: Path) -> None:
    write_inputs(tmp_path, ({"id": f"r{n}", "out": f"answer {n}"} for n in range(ROWS)), GRADER)
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalSuite\nmetadata: {name: judged}\nspec:\n"
        "  tasks:\n"
        "  - id: judged\n"
        "    dataset: {path: rows.jsonl, idField: id}\n"
        "    outputs: {column: out}\n"
        "    grader: {type: python, contract: model_backed, file: grader.py}\n"
    )
    db = tmp_path / "r.db"
    env = {**os.environ, "NO_COLOR": "1", "JUDGE_KEY": "sk-test-judge"}
    env.pop("EVALKUBE_DB", None)
    with SlowUpstream(DELAY) as upstream:
        run = tmp_path / "run.yaml"
        run.write_text(
            "apiVersion: evalkube.io/v1alpha1\nkind: EvalRun\nmetadata: {name: judged}\n"
            "spec:\n  models: [precomputed]\n  judgeModel: openai:judge-1\n"
            f"  providers: {{openai: {{baseURL: '{upstream.base_url}', apiKeyEnv: JUDGE_KEY}}}}\n"
        )
        command = [EVALKUBE, "run", "--sandbox", "process", "--db", str(db)]
        process = subprocess.Popen(
            [*command, str(suite), str(run)], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        stop_after_calls(process, upstream, ROWS // 2, subprocess.Popen.kill, what="graders")
        with sqlite3.connect(db) as conn:
            ((run_id,),) = conn.execute("SELECT run_id FROM evalkube_runs").fetchall()
            (stored,) = conn.execute("SELECT count(*) FROM evalkube_samples").fetchone()
        assert stored == 0  # a kill before the first chunk was stored: all lost before
        calls_before = len(upstream.received)
        assert calls_before < 2 * ROWS
        out = tmp_path / "out.json"
        done = subprocess.run(
            [*command, "--resume", str(run_id), "--output", str(out)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        inputs = collections.Counter(r.body["input"] for r in upstream.received)

    assert len(inputs) == 2 * ROWS
    repeated = {text: n for text, n in inputs.items() if n > 1}
    assert len(repeated) <= 1, repeated  # one sample in flight, one call of it in flight
    (result,) = json.loads(out.read_text())["results"]
    assert result["counts"] == {"samples": ROWS, "valid": ROWS, "invalid": 0, "errored": 0}
    assert result["metrics"] == {"score": 1.0}
    assert result["model_calls"] == {"judge": 2 * ROWS}  # replayed answers count as theirs
