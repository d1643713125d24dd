"""Restart safety on the real control plane: stop the operator mid-run, start it again.

The operator (KopfRunner, in-process) is stopped while units are in flight and started again
on the same store file and port. Its state comes from the cluster (Jobs by deterministic
name) and the store (samples by deterministic id, units reported done), so the second
operator finishes the run without a duplicate Job, a lost or duplicated sample, or a
regraded unit, and the scores are exact.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    READ,
    SENTIMENT,
    _free_port,
    _jobs,
    _play_unit,
    annotate_pods,
    finished,
    install_crds,
    metric,
    run_manifest,
    run_status,
    run_unit,
    running_operator,
    suite,
)

from evalkube.controller import names
from evalkube.store import ResultStore

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]


def test_operator_restart_mid_run_loses_and_duplicates_nothing(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    store_file = tmp_path / "results.db"
    port = _free_port()
    cp.apply(suite(ns))
    units = [f"qa.precomputed.{i:05d}" for i in range(5)] + [
        "sentiment.precomputed.00000",
        "sentiment.precomputed.00001",
        "sentiment.precomputed.batch",
    ]
    seen_uids: dict[str, str] = {}

    def record_uids(jobs: dict[str, dict[str, Any]]) -> None:
        for unit, job in jobs.items():
            uid = job["metadata"]["uid"]
            assert seen_uids.setdefault(unit, uid) == uid, f"the Job of {unit} was re-created"

    # -- first operator: parallelism 2, two units in flight when it stops ----------------------
    # (a pass of its own every second: a Job event that changes no Job's state wakes no pass)
    with running_operator(cp, store_file, port, parallelism="2", reconcile_interval="1") as url:
        cp.apply(run_manifest(ns))
        cp.wait_for(lambda: len(_jobs(cp, ns)) >= 2, timeout=30, what="2 Jobs")
        # the cap holds over later passes: await one
        passes = metric(url, "evalkube_reconcile_passes_total")
        cp.wait_for(
            lambda: metric(url, "evalkube_reconcile_passes_total") > passes,
            timeout=30,
            what="a later pass",
        )
        jobs = _jobs(cp, ns)
        assert sorted(jobs) == units[:2]
        record_uids(jobs)
        _play_unit(cp, ns, jobs[units[0]], url, tmp_path)
        cp.wait_for(lambda: len(_jobs(cp, ns)) == 3, timeout=30, what="Job 3")
        record_uids(_jobs(cp, ns))
        # the second unit's runner records everything and reports done; its Pod is still up
        secret = cp.kubectl_json("get", "secret", names.token_secret_name("nightly"), "-n", ns)
        token = base64.b64decode(secret["data"]["token"]).decode()
        snapshot = tmp_path / "snapshot.json"
        snapshot.write_text(
            cp.kubectl_json("get", "configmap", "nightly-snapshot", "-n", ns)["data"][
                "snapshot.json"
            ]
        )
        assert "5 samples recorded" in run_unit(url, snapshot, units[1], token)
        cp.wait_for(
            lambda: len(_jobs(cp, ns)) == 4, timeout=30, what="Job 4 (unit 2 reported done)"
        )
        created_first = metric(url, "evalkube_jobs_created_total")
        assert created_first == 4
    record_uids(_jobs(cp, ns))

    # -- while it is down: a Pod finishes, the run's status loses its unit counts, and someone
    # edits the run's spec (the run stays pinned to its snapshot: same units, same plan)
    annotate_pods(cp, ns, names.job_name("nightly", units[1]), "true")
    cp.kubectl(
        "patch",
        "evalrun",
        "nightly",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"units": None}}),
    )
    cp.kubectl(
        "patch", "evalrun", "nightly", "-n", ns, "--type=merge", "-p", '{"spec":{"shardSize":7}}'
    )

    # -- second operator, same store and port ---------------------------------------------------
    with running_operator(cp, store_file, port, parallelism="2") as url:
        cp.wait_for(
            lambda: (run_status(cp, ns).get("units") or {}).get("succeeded") == 2,
            timeout=30,
            what="status rebuilt from the cluster and the store",
        )
        # a Pod retried after the restart re-runs a finished unit: nothing is regraded
        replay = run_unit(url, snapshot, units[0], token)
        assert "0 samples recorded, 5 already recorded" in replay, replay
        played = {units[0], units[1]}
        deadline = time.monotonic() + 240
        while (status := finished(cp, ns)) is None:
            assert time.monotonic() < deadline, run_status(cp, ns)
            jobs = _jobs(cp, ns)
            record_uids(jobs)
            unfinished = [u for u in jobs if u not in played]
            assert len(unfinished) <= 2, f"parallelism 2 exceeded: {sorted(unfinished)}"
            for unit in sorted(unfinished):
                _play_unit(cp, ns, jobs[unit], url, tmp_path)
                played.add(unit)
            time.sleep(0.3)
        created_second = metric(url, "evalkube_jobs_created_total")
        assert metric(url, 'evalkube_runs{phase="Succeeded"}') >= 1

    assert status["phase"] == "Succeeded", status
    assert created_first + created_second == len(units)
    jobs = _jobs(cp, ns)
    record_uids(jobs)
    assert sorted(jobs) == sorted(units)
    assert sorted(j["metadata"]["name"] for j in jobs.values()) == sorted(
        names.job_name("nightly", u) for u in units
    )
    results = {r["task"]: r for r in status["results"]}
    assert results["qa"]["metrics"] == {"exact_match": pytest.approx(0.8)}
    assert results["qa"]["counts"] == {"samples": 25, "valid": 25, "invalid": 0, "errored": 0}
    assert results["sentiment"]["metrics"]["macro_f1"] == pytest.approx(0.655556, abs=1e-6)
    assert results["sentiment"]["counts"]["samples"] == 6
    assert status["units"] == {
        "total": 8,
        "succeeded": 8,
        "running": 0,
        "failed": 0,
        "pending": 0,
        "queued": 0,
    }
    # -- a third operator still serves the finished run's samples, and takes no more ingest ----
    with running_operator(cp, store_file, port) as url:
        base = f"{url}/api/v1/namespaces/{ns}/evalruns/nightly"
        api = f"{url.api}/api/v1/namespaces/{ns}/evalruns/nightly"
        page = cp.wait_for(
            lambda: (
                (r := httpx.get(f"{api}/samples", params={"limit": 100}, headers=READ)).status_code
                == 200
                and r.json()
            ),
            timeout=30,
            what="the samples API of the finished run",
        )
        assert page
        assert len(page["samples"]) == 31
        late = httpx.post(
            f"{base}/samples",
            json={"samples": []},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert late.status_code == 401

    store = ResultStore.open(f"sqlite:///{store_file}")
    try:
        (run,) = store.list_runs()
        samples = list(store.iter_samples(run.run_id))
        assert len(samples) == 31
        assert len({s.sample_id for s in samples}) == 31
        by_task = sorted((s.task_id, s.target) for s in samples)
        assert by_task == sorted(
            [("qa", str(i)) for i in range(25)] + [("sentiment", r["label"]) for r in SENTIMENT]
        )
        assert store.done_units(run.run_id) == set(units)
        assert run.phase == "Succeeded"
    finally:
        store.close()
