"""examples/model-backed through `evalkube run`: ctx calls go through the model bridge.

The only fake is the paid provider: a real HTTP server on loopback speaking the Responses
and Embeddings API shapes (tests/integration/proxy/fake_upstream.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.integration.proxy.fake_upstream import FakeUpstream, Scripted

pytestmark = pytest.mark.timeout(180)

EVALKUBE = str(Path(sys.executable).parent / "evalkube")
KEY = "sk-test-model-backed-0123456789"


def _verdict(verdict: str, number: int) -> Scripted:
    text = json.dumps({"verdict": verdict, "rationale": f"reason {number}"})
    return Scripted(
        body={
            "id": f"resp_judge_{number}",
            "object": "response",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
        }
    )


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_model_backed_example_end_to_end(tmp_path: Path) -> None:
    with FakeUpstream() as upstream:
        run = yaml.safe_load((EXAMPLES / "model-backed/run.yaml").read_text())
        run["spec"]["providers"]["openai"]["baseURL"] = upstream.base_url
        run["spec"]["embeddingModel"] = "openai:text-embedding-3-small"
        run_file = tmp_path / "run.yaml"
        run_file.write_text(yaml.safe_dump(run))
        upstream.then(_verdict("correct", 1), _verdict("incorrect", 2), _verdict("correct", 3))
        out = tmp_path / "out.json"
        db = tmp_path / "r.db"
        done = subprocess.run(
            [
                EVALKUBE,
                "run",
                str(EXAMPLES / "model-backed/suite.yaml"),
                str(run_file),
                "--sandbox",
                "process",
                "--db",
                str(db),
                "--output",
                str(out),
                "-q",
            ],
            env={**os.environ, "OPENAI_API_KEY": KEY},
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        received = list(upstream.received)
    results = {r["task"]: r for r in json.loads(out.read_text())["results"]}
    assert results["llm_judge"]["metrics"] == {"judge_score": pytest.approx(2 / 3)}
    assert results["llm_judge"]["counts"]["valid"] == 3
    assert results["llm_judge"]["model_calls"] == {"judge": 3}
    # the fake embeds a text as [len(text), 1.0]
    pairs = [
        ("It is blue.", "The sky is blue."),
        ("They meow.", "Cats meow."),
        ("Water that froze.", "Frozen water."),
    ]
    expected = sum(_cosine([len(a), 1.0], [len(b), 1.0]) for a, b in pairs) / 3
    assert results["embedding_similarity"]["metrics"]["semantic_similarity"] == pytest.approx(
        expected
    )
    assert results["embedding_similarity"]["model_calls"] == {"embedding": 3}
    # the key reached the provider, and the forced flags and `auto` resolution were applied
    judge_calls = [r for r in received if r.path.endswith("/responses")]
    assert len(judge_calls) == 3
    for call in judge_calls:
        assert call.headers.get("Authorization") == f"Bearer {KEY}"
        assert call.body["model"] == "gpt-4.1-mini"
        assert (call.body["stream"], call.body["store"], call.body["background"]) == (
            False,
            True,
            False,
        )
    # every judged sample records its response id for audit
    samples = subprocess.run(
        [
            EVALKUBE,
            "samples",
            json.loads(out.read_text())["run_id"],
            "--db",
            str(db),
            "--task",
            "llm_judge",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    views = json.loads(samples.stdout)
    assert sorted(v["judge"]["response_id"] for v in views) == [
        "resp_judge_1",
        "resp_judge_2",
        "resp_judge_3",
    ]
    assert all(v["model_calls"]["response_ids"] for v in views)
    assert KEY not in samples.stdout
