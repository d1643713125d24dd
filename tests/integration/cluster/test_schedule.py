"""EvalSchedule on the real control plane: the operator creates the scheduled EvalRun (owned,
labelled, named per scheduled time), holds the next one back while it runs (Forbid), prunes
the history, reports status, and the scheduled run's scores are the baseline of a later gate.

The operator runs with its schedule clock 90 s ahead (``EVALKUBE_SCHEDULE_CLOCK_OFFSET_SECONDS``),
so an every-minute schedule is due as soon as it exists; units are played as in test_gate.py.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    OperatorUrl,
    module_operator,
    play_jobs,
    play_to_the_end,
    run,
    suite,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

API = "evalkube.io/v1alpha1"


operator = module_operator(schedule_clock_offset_seconds="90")


def schedule(ns: str, name: str = "nightly", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "EvalSchedule",
        # Argo CD's tracking label: it must not reach the runs (Argo CD would prune them)
        "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/instance": "qa"}},
        "spec": {
            "schedule": "* * * * *",
            "timeZone": "Europe/Berlin",
            "runTemplate": {
                "metadata": {"labels": {"team": "qa"}},
                "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 10},
            },
            **spec,
        },
    }


def scheduled_runs(cp: ControlPlane, ns: str, name: str = "nightly") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.kubectl_json(
        "get", "evalruns", "-n", ns, "-l", f"evalkube.io/schedule={name}"
    )["items"]
    return items


def schedule_status(cp: ControlPlane, ns: str, name: str = "nightly") -> dict[str, Any]:
    status: dict[str, Any] = (
        cp.kubectl_json("get", "evalschedule", name, "-n", ns).get("status") or {}
    )
    return status


def scheduled_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Scheduled"), {})


def test_a_schedule_creates_its_runs_and_feeds_the_gate_baseline(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    cp.apply(schedule(ns, successfulRunsHistoryLimit=0))
    owner = cp.kubectl_json("get", "evalschedule", "nightly", "-n", ns)["metadata"]

    [first] = cp.wait_for(lambda: scheduled_runs(cp, ns), timeout=60, what="the scheduled run")
    meta = first["metadata"]
    scheduled_at = meta["annotations"]["evalkube.io/scheduled-at"]
    minutes = int(datetime.fromisoformat(scheduled_at.replace("Z", "+00:00")).timestamp()) // 60
    assert meta["name"] == f"nightly-{minutes}"
    assert meta["labels"] == {"team": "qa", "evalkube.io/schedule": "nightly"}
    [ref] = meta["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "EvalSchedule",
        "nightly",
        owner["uid"],
        True,
    )
    assert first["spec"] == {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 10}
    status = cp.wait_for(
        lambda: (s := schedule_status(cp, ns)).get("active") and s,
        timeout=30,
        what="the schedule's status",
    )
    assert status["lastScheduleTime"] == scheduled_at
    assert status["active"] == [{"name": meta["name"], "uid": meta["uid"]}]
    assert status["nextScheduleTime"] > scheduled_at

    # the next minute comes while the first run is active: Forbid holds it back
    held = cp.wait_for(
        lambda: (
            scheduled_condition(s := schedule_status(cp, ns)).get("reason")
            == "ConcurrencyForbidden"
            and s
        ),
        timeout=90,
        what="the next scheduled time held back",
    )
    assert scheduled_condition(held)["status"] == "False"
    assert [r["metadata"]["name"] for r in scheduled_runs(cp, ns)] == [meta["name"]]

    # the first run succeeds; with successfulRunsHistoryLimit 0 it is deleted, the held-back
    # time gets its run, and the schedule remembers when the last run succeeded
    played: set[str] = set()

    def moved_on() -> dict[str, Any] | None:
        play_jobs(cp, ns, meta["name"], operator, tmp_path, played)
        names = [r["metadata"]["name"] for r in scheduled_runs(cp, ns)]
        status = schedule_status(cp, ns)
        if meta["name"] in names or len(names) != 1 or not status.get("lastSuccessfulTime"):
            return None
        return status if [a["name"] for a in status.get("active") or []] == names else None

    after = cp.wait_for(moved_on, timeout=180, what="the first run pruned and the next one made")
    # a real time (when the run finished); scheduled times are on the operator's moved clock
    assert after["lastSuccessfulTime"] >= owner["creationTimestamp"]
    assert after["lastScheduleTime"] > scheduled_at
    assert cp.kubectl("get", "evalrun", meta["name"], "-n", ns, check=False).returncode != 0
    cp.kubectl("patch", "evalschedule", "nightly", "-n", ns, "--type=merge", "-p",
               '{"spec": {"suspend": true}}')  # fmt: skip

    # a gated run's lastSucceeded baseline is the scheduled run (its EvalRun is gone, its
    # scores are in the store); the second scheduled run has not finished
    candidate = run(ns, "candidate")
    candidate["spec"]["gate"] = {"baseline": {"lastSucceeded": True}}
    cp.apply(candidate)
    gated = play_to_the_end(cp, ns, "candidate", operator, tmp_path)
    assert gated["gate"]["baseline"].startswith(f"{ns}.{meta['name']}."), gated["gate"]
    assert gated["gate"]["passed"] is True


def test_the_api_server_rejects_a_bad_schedule(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl
) -> None:
    cp, ns = control_plane, cluster_namespace
    bad = schedule(ns, "bad", concurrencyPolicy="Queue")
    bad["spec"]["runTemplate"]["spec"].pop("suiteRef")
    out = cp.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert out.returncode != 0
    assert "spec.concurrencyPolicy" in out.stderr
    assert "spec.runTemplate.spec.suiteRef" in out.stderr


def test_an_invalid_schedule_reports_the_field_in_its_ready_condition(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(schedule(ns, "typo", schedule="0 25 * * *"))  # the API server cannot parse cron

    def ready() -> dict[str, Any] | None:
        conditions = schedule_status(cp, ns, "typo").get("conditions") or []
        return next((c for c in conditions if c["type"] == "Ready"), None)

    condition = cp.wait_for(ready, timeout=30, what="the Ready condition")
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert "spec.schedule: '0 25 * * *' is not a valid cron schedule" in condition["message"]
    assert scheduled_runs(cp, ns, "typo") == []
