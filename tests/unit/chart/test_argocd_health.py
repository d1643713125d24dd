"""The chart's Argo CD health checks, run by a real Lua 5.1 interpreter (as Argo CD's
gopher-lua does) on EvalRun/EvalSuite objects shaped as the operator writes them, including
the gate's ``Passed`` condition and ``status.gate``. Objects the operator itself wrote on the
control plane go through the same scripts in tests/integration/cluster/test_argocd_health.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.support.argocd import GITOPS_DOC, argocd_cm, doc_block, health, scripts


def cond(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def evalrun(phase: str | None, *conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "nightly", "namespace": "team-a", "generation": 1},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["gpt"]},
    }
    if phase is not None:
        body["status"] = {"phase": phase, "conditions": list(conditions), **status}
    return body


SUCCEEDED = cond("Succeeded", "True", "Completed", "5 units completed")
GATE = {
    "passed": False,
    "checks": [
        {
            "name": "min qa/gpt/exact_match",
            "passed": False,
            "value": 0.62,
            "threshold": 0.8,
            "message": "0.62 < 0.8",
        },
        {"name": "max error rate", "passed": True, "value": 0.0, "threshold": 0.05},
        {
            "name": "baseline qa/gpt/exact_match",
            "passed": False,
            "value": -0.11,
            "threshold": -0.02,
            "message": "dropped 0.11 vs nightly-41",
        },
    ],
}


@pytest.mark.parametrize(
    ("obj", "status", "message"),
    [
        pytest.param(evalrun(None), "Progressing", "Waiting for the evalkube operator", id="new"),
        pytest.param(evalrun("Pending"), "Progressing", "Pending", id="pending"),
        pytest.param(
            evalrun("Running", units={"total": 5, "succeeded": 2, "running": 3}),
            "Progressing",
            "Running: 2 of 5 units succeeded",
            id="running",
        ),
        pytest.param(
            evalrun("Succeeded", SUCCEEDED, summary="qa/gpt exact_match=0.800"),
            "Healthy",
            "qa/gpt exact_match=0.800",
            id="succeeded-no-gate",
        ),
        pytest.param(
            evalrun("Succeeded", SUCCEEDED, cond("Passed", "True", "NoGate", "no gate")),
            "Healthy",
            "",
            id="succeeded-nogate-reason",
        ),
        pytest.param(
            evalrun(
                "Succeeded",
                SUCCEEDED,
                cond("Passed", "True", "GatePassed", "3 checks passed"),
                gate={"passed": True, "checks": []},
            ),
            "Healthy",
            "Gate passed: 3 checks passed",
            id="gate-passed",
        ),
        pytest.param(
            evalrun(
                "Succeeded",
                SUCCEEDED,
                cond("Passed", "False", "GateFailed", "2 of 3 checks failed"),
                gate=GATE,
            ),
            "Degraded",
            "Gate failed: min qa/gpt/exact_match: 0.62 < 0.8; "
            "baseline qa/gpt/exact_match: dropped 0.11 vs nightly-41",
            id="gate-failed",
        ),
        pytest.param(
            evalrun("Succeeded", SUCCEEDED, cond("Passed", "False", "GateFailed", "min qa: 0.1")),
            "Degraded",
            "Gate failed: min qa: 0.1",
            id="gate-failed-condition-only",
        ),
        pytest.param(
            evalrun("Succeeded", SUCCEEDED, cond("Passed", "Unknown", "Evaluating", "baseline")),
            "Progressing",
            "gate evaluating: baseline",
            id="gate-evaluating",
        ),
        pytest.param(
            evalrun(
                "Failed",
                cond(
                    "Succeeded", "False", "UnitsFailed", "unit qa.gpt.00001: BackoffLimitExceeded"
                ),
            ),
            "Degraded",
            "Failed: unit qa.gpt.00001: BackoffLimitExceeded",
            id="failed",
        ),
        pytest.param(evalrun("Exploded"), "Unknown", "Unknown phase Exploded", id="unknown"),
    ],
)
def test_evalrun_health(obj: dict[str, Any], status: str, message: str) -> None:
    got = health("EvalRun", obj)
    assert got["status"] == status, got
    assert message in got["message"], got


def evalsuite(phase: str | None, generation: int = 1, observed: int = 1, message: str = ""):
    body: dict[str, Any] = {"metadata": {"name": "qa", "generation": generation}, "spec": {}}
    if phase is not None:
        body["status"] = {
            "phase": phase,
            "observedGeneration": observed,
            "suiteVersion": None,
            "conditions": [cond("Ready", str(phase == "Ready"), phase, message)],
        }
    return body


@pytest.mark.parametrize(
    ("obj", "status", "message"),
    [
        pytest.param(evalsuite(None), "Progressing", "Waiting", id="new"),
        pytest.param(
            evalsuite("Ready", message="3 programs checked"), "Healthy", "3 programs", id="ready"
        ),
        pytest.param(
            evalsuite("Invalid", message="task qa: template: unknown variable"),
            "Degraded",
            "Invalid: task qa: template: unknown variable",
            id="invalid",
        ),
        pytest.param(
            evalsuite("Ready", generation=3, observed=2),
            "Progressing",
            "generation 3 (checked 2)",
            id="stale",
        ),
    ],
)
def test_evalsuite_health(obj: dict[str, Any], status: str, message: str) -> None:
    got = health("EvalSuite", obj)
    assert got["status"] == status, got
    assert message in got["message"], got


def test_gitops_doc_patch_is_generated_from_the_lua_files() -> None:
    """docs/gitops.md's argocd-cm patch is exactly what the Lua files say (regenerate with
    ``python -m tests.support.argocd``)."""
    block = doc_block(GITOPS_DOC.read_text())
    assert block == argocd_cm()
    data = yaml.safe_load(block)["data"]
    assert data == scripts()
    assert set(data) == {
        "resource.customizations.health.evalkube.io_EvalRun",
        "resource.customizations.health.evalkube.io_EvalSuite",
    }


def test_gitops_doc_sync_hook_example_is_a_valid_evalrun() -> None:
    from evalkube.models import EvalRunSpec, validate_spec

    text = GITOPS_DOC.read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    (hook,) = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "EvalRun"]
    annotations = hook["metadata"]["annotations"]
    assert annotations["argocd.argoproj.io/hook"] == "PostSync"
    assert annotations["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation"
    spec = validate_spec(EvalRunSpec, hook["spec"])
    assert spec.gate is not None
