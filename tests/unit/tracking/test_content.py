"""What a run becomes in MLflow: every key MLflow would refuse (a grader's score names are
untrusted) is made valid and unique, values are cut to MLflow's caps, nothing non-finite is
logged; and the experiment a cluster run goes to."""

from __future__ import annotations

import math
import posixpath
import re

from evalkube import limits
from evalkube.controller.tracking import experiment_name
from evalkube.models import EvalRunSpec, GateStatus, SampleCounts, TaskModelResult
from evalkube.models.tracking import MlflowTrackingSpec
from evalkube.tracking import RunFacts, describe
from evalkube.tracking.content import key
from evalkube.tracking.mlflow_log import shown_uri

VALID = re.compile(r"^[/\w.\- :]*$")  # MLflow's own rule for param and metric names


def valid(name: str) -> bool:
    """As MLflow's validation accepts a key: its characters, and a normalised path."""
    norm = posixpath.normpath(name)
    return bool(VALID.match(name)) and norm == name and not norm.startswith(("..", "/"))


def facts(metrics: dict[str, float], **spec: object) -> RunFacts:
    return RunFacts(
        run_id="r1",
        suite="qa",
        suite_version="sha256:abc",
        phase="Succeeded",
        spec=EvalRunSpec.model_validate({"models": ["precomputed"], **spec}),
        results=[
            TaskModelResult(
                task="qa",
                model="openai:gpt-4.1-mini",
                metrics=metrics,
                counts=SampleCounts(samples=3, valid=2, invalid=1),
                model_calls={"judge": 3},
            )
        ],
        gate=GateStatus(passed=False),
    )


def test_hostile_score_names_become_valid_unique_keys() -> None:
    hostile = {
        "../../etc/passwd": 1.0,
        "a//b": 2.0,
        "/root": 3.0,
        "<script>alert(1)</script>": 4.0,
        "<script>alert(2)</script>": 5.0,  # reduces to the same key as the one above
        "x" * 300: 6.0,
        "ok": 7.0,
        "nan": math.nan,
        "inf": math.inf,
    }
    content = describe(facts(hostile))
    assert all(valid(name) for name in content.metrics), content.metrics
    assert all(len(name) <= limits.MLFLOW_KEY_CHARS for name in content.metrics)
    scores = sorted(v for k, v in content.metrics.items() if "/count/" not in k)
    # every finite score kept once (collisions renamed, not overwritten); NaN and inf dropped;
    # the judge calls and the gate outcome beside them
    assert scores == [0.0, 1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert content.metrics["qa/openai:gpt-4.1-mini/ok"] == 7.0
    assert content.metrics["qa/openai:gpt-4.1-mini/count/invalid"] == 1
    assert content.metrics["qa/openai:gpt-4.1-mini/model_calls/judge"] == 3
    assert content.metrics["gate_passed"] == 0.0


def test_params_carry_the_run_and_are_cut_to_mlflows_cap() -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 100}}
             for i in range(100)]  # fmt: skip
    content = describe(
        facts({"score": 1.0}, generation={"temperature": 0.3, "tools": tools},
              gate={"thresholds": [{"metric": "score", "min": 0.5}]})
    )  # fmt: skip
    params = content.params
    assert params["generation.temperature"] == "0.3"
    assert len(params["generation.tools"]) == limits.MLFLOW_PARAM_CHARS
    assert params["gate"] == '{"thresholds": [{"metric": "score", "min": 0.5}]}'
    assert params["suite_version"] == "sha256:abc"
    assert "judge_model" not in params  # unset fields are left out, not logged empty
    assert content.tags["evalkube.gate"] == "failed"
    assert content.tags["mlflow.runName"] == "r1"


def test_key_parts_that_are_paths_are_neutralised() -> None:
    assert key("..", ".", "") == "_/_/_"
    assert key("t", "m:x", "a b") == "t/m:x/a b"


def test_a_schedules_runs_share_an_experiment() -> None:
    spec = MlflowTrackingSpec(tracking_uri="http://m:5000")
    scheduled = {"metadata": {"namespace": "ml", "labels": {"evalkube.io/schedule": "nightly"}}}
    assert experiment_name(spec, scheduled, "qa") == "evalkube/ml/nightly"
    assert experiment_name(spec, {"metadata": {"namespace": "ml"}}, "qa") == "evalkube/ml/qa"
    named = MlflowTrackingSpec(tracking_uri="http://m:5000", experiment="mine")
    assert experiment_name(named, scheduled, "qa") == "mine"


def test_a_password_in_the_tracking_uri_is_never_shown() -> None:
    assert shown_uri("http://me:s3cret@mlflow:5000/x") == "http://me:***@mlflow:5000/x"
    assert shown_uri("https://mlflow.example") == "https://mlflow.example"
    assert "s3cret" not in shown_uri("http://me:s3cret@[::1")  # does not parse
