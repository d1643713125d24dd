"""Ctrl-C during candidate generation, then `--resume`: no model call is ever made twice.

`evalkube run` runs as a real subprocess against a fake OpenAI Responses server on loopback
(the only fake: paid models cannot be called here) that answers slowly and counts every
call by its prompt. The run is interrupted with SIGINT while the first (only) shard is still
generating, which on the code before model answers were recorded as they arrived lost every
answer: resume then called the model again for each of them.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.interrupting import SlowUpstream, stop_after_calls, write_inputs

pytestmark = [pytest.mark.timeout(240)]

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
ROWS = 240
#: Seconds each answer takes: with 8 calls at a time, generation takes ~3 s.
DELAY = 0.1
KEY = "sk-test-interrupt-0123456789"

GRADER = """
def grade(sample, item):
    return 1.0 if sample["output_text"] == "echo: " + item["q"] else 0.0
"""


def make_suite(directory: Path, base_url: str, shard_size: int) -> tuple[Path, Path]:
    write_inputs(directory, ({"id": f"r{n}", "q": f"question {n}"} for n in range(ROWS)), GRADER)
    suite = directory / "suite.yaml"
    suite.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalSuite\nmetadata: {name: gen}\nspec:\n"
        "  tasks:\n"
        "  - id: echo\n"
        "    dataset: {path: rows.jsonl, idField: id}\n"
        "    prompt: '{{ item.q }}'\n"
        "    grader: {type: python, file: grader.py}\n"
    )
    run = directory / "run.yaml"
    run.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalRun\nmetadata: {name: gen}\nspec:\n"
        "  models: ['openai:gpt-test']\n"
        f"  providers: {{openai: {{baseURL: '{base_url}', apiKeyEnv: TEST_KEY}}}}\n"
        "  generation: {concurrency: 8}\n"
        f"  shardSize: {shard_size}\n"
    )
    return suite, run


def env() -> dict[str, str]:
    out = {**os.environ, "NO_COLOR": "1", "TEST_KEY": KEY}
    out.pop("EVALKUBE_DB", None)
    return out


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db, timeout=5) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.parametrize(
    ("workers", "shard_size"),
    [(1, ROWS), (2, ROWS // 4)],
    ids=["one-process", "two-unit-processes"],
)
def test_ctrl_c_during_generation_repeats_no_model_call(
    tmp_path: Path, workers: int, shard_size: int
) -> None:
    db = tmp_path / "results.db"
    with SlowUpstream(DELAY) as upstream:
        suite, run = make_suite(tmp_path, upstream.base_url, shard_size)
        process = subprocess.Popen(
            [EVALKUBE, "run", str(suite), str(run), "--sandbox", "process", "--db", str(db),
             f"--workers={workers}"],
            cwd=tmp_path,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        stderr = stop_after_calls(
            process,
            upstream,
            ROWS // 3,
            lambda p: os.killpg(p.pid, signal.SIGINT),  # a terminal's Ctrl-C: the whole group
            what="run",
            timeout=60,
        )
        assert process.returncode == 130, stderr
        assert "Traceback" not in stderr
        calls_before = len(upstream.received)
        assert calls_before < ROWS, "interrupt the run during generation, not after it"
        ((run_id, phase),) = query(db, "SELECT run_id, phase FROM evalkube_runs")
        assert phase == "Interrupted"
        assert f"--resume {run_id}" in stderr
        # every answer that arrived is kept, although no sample was graded yet
        kept = query(db, "SELECT count(*) FROM evalkube_answers")[0][0]
        assert kept == calls_before
        if workers == 1:
            assert query(db, "SELECT count(*) FROM evalkube_samples")[0][0] == 0

        done = subprocess.run(
            [EVALKUBE, "run", "--resume", str(run_id), "--sandbox", "process", "--db", str(db),
             "--output", str(tmp_path / "out.json"), f"--workers={workers}"],
            cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        prompts = collections.Counter(r.body["input"] for r in upstream.received)

    assert sum(prompts.values()) == ROWS
    assert [p for p, n in prompts.items() if n > 1] == []
    output = json.loads((tmp_path / "out.json").read_text())
    assert output["phase"] == "Succeeded"
    (result,) = output["results"]
    assert result["counts"] == {"samples": ROWS, "valid": ROWS, "invalid": 0, "errored": 0}
    assert result["metrics"] == {"score": 1.0}
    assert result["model_calls"] == {"candidate": ROWS}
    assert query(db, "SELECT count(*) FROM evalkube_answers")[0][0] == 0  # dropped once stored


def test_kill_during_generation_repeats_at_most_the_calls_in_flight(tmp_path: Path) -> None:
    # A crash lets no call finish: only the (at most 8) calls in flight are made again.
    db = tmp_path / "results.db"
    with SlowUpstream(DELAY) as upstream:
        suite, run = make_suite(tmp_path, upstream.base_url, ROWS)
        process = subprocess.Popen(
            [EVALKUBE, "run", str(suite), str(run), "--sandbox", "process", "--db", str(db)],
            cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        stop_after_calls(process, upstream, ROWS // 3, subprocess.Popen.kill, what="run")
        ((run_id,),) = query(db, "SELECT run_id FROM evalkube_runs")
        kept = query(db, "SELECT count(*) FROM evalkube_answers")[0][0]
        assert kept >= ROWS // 3 - 8
        done = subprocess.run(
            [EVALKUBE, "run", "--resume", str(run_id), "--sandbox", "process", "--db", str(db),
             "--output", str(tmp_path / "out.json")],
            cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        prompts = collections.Counter(r.body["input"] for r in upstream.received)
    repeated = sum(n - 1 for n in prompts.values())
    assert len(prompts) == ROWS
    assert repeated <= 8, f"{repeated} calls made again; at most the 8 in flight may be"
    (result,) = json.loads((tmp_path / "out.json").read_text())["results"]
    assert result["counts"]["valid"] == ROWS
    assert result["metrics"] == {"score": 1.0}
