"""``RunReconciler`` without a cluster: a fake kube client (:mod:`.fake_kube`), a real SQLite
store and a fresh metrics registry. Each test drives passes as kopf would (the returned status
merged into the EvalRun) and plays the cluster by editing the fake's Jobs.

These pin the reconciler's observable behaviour (Jobs, status, events, metrics) so its
structure can change underneath them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from prometheus_client import CollectorRegistry

from evalkube import limits
from evalkube.controller import names
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunRegistry
from evalkube.controller.run_decisions import JobState
from evalkube.controller.run_reconciler import (
    STATUS_REFUSALS_BEFORE_FAILING,
    RunReconciler,
    retry_wait,
)
from evalkube.controller.settings import OperatorSettings
from evalkube.engine.plan import SEQ_STRIDE
from evalkube.models import EvalRunStatus
from evalkube.store import ResultStore, SampleRecord

from .fake_kube import FakeKube, LiveJobIndex

NS = "team"
EXACT = (
    "def grade(sample, item):\n"
    "    return float(sample['output_text'].strip() == item['target'].strip())\n"
)
ROWS = [{"q": f"{i}?", "a": str(i), "out": str(i) if i % 5 else "wrong"} for i in range(25)]


def suite(grader: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "qa", "namespace": NS},
        "spec": {
            "tasks": [
                {
                    "id": "qa",
                    "dataset": {"rows": ROWS},
                    "prompt": "{{ item.q }}",
                    "target": "{{ item.a }}",
                    "outputs": {"column": "out"},
                    "grader": grader
                    or {"type": "python", "source": EXACT, "metricId": "exact_match"},
                }
            ]
        },
    }


def run(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "nightly", "namespace": NS, "uid": "uid-1", "generation": 1},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 10, **spec},
    }


class Harness:
    """A reconciler over a fake cluster; :meth:`step` is one kopf pass."""

    def __init__(self, tmp: Path, parallelism: int = 2, **settings: Any) -> None:
        self.kube = FakeKube()
        self.store = ResultStore.open(f"sqlite:///{tmp / 'results.db'}")
        self.metrics = OperatorMetrics(CollectorRegistry())
        self.events: list[tuple[str, str, str]] = []
        self.reconciler = RunReconciler(
            self.kube,  # type: ignore[arg-type]
            self.store,
            RunRegistry(),
            self.metrics,
            OperatorSettings(parallelism=parallelism, runtime_class=None, **settings),
            lambda body, kind, reason, message: self.events.append((kind, reason, message)),
        )
        self.reconciler.jobs = LiveJobIndex(self.kube)

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kube.put(manifest)

    @property
    def body(self) -> dict[str, Any]:
        found = self.kube.objects[("EvalRun", NS, "nightly")]
        return found

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    def step(self, *, index: Any = None) -> dict[str, Any] | None:
        """One pass; the status it returned is merged into the EvalRun (as kopf patches it).
        The Job index is current, unless the test passes an older one as ``index``."""
        live = self.reconciler.jobs
        self.reconciler.jobs = live if index is None else index
        try:
            new = asyncio.run(self.reconciler.reconcile(self.body))
        finally:
            self.reconciler.jobs = live
        if new is None:
            return None
        wire = new.to_wire()
        self.body.setdefault("status", {}).update(wire)
        return wire

    def jobs(self) -> dict[str, dict[str, Any]]:
        """The run's Jobs by unit id."""
        return {
            job["metadata"]["annotations"][names.ANNOTATION_UNIT_ID]: job
            for job in self.kube.of_kind("Job")
            if job["metadata"]["labels"].get(names.LABEL_RUN) == "nightly"
        }

    def run_id(self) -> str:
        return names.run_id(NS, "nightly", "uid-1")

    def finish_unit(self, unit: str, score: float = 1.0, extra_names: int = 0) -> None:
        """What a unit's pod does: record its samples, report it done; its Job completes (if
        it has one). ``extra_names``: score names of each sample's own besides exact_match."""
        task, model, shard = unit.split(".")
        start = int(shard) * 10
        self.store.record_samples(
            [
                SampleRecord(
                    self.run_id(),
                    f"{unit}.{i}",
                    task,
                    model,
                    int(shard) * SEQ_STRIDE + i - start,  # as a runner numbers them
                    "valid",
                    scores={
                        "exact_match": score,
                        **{f"flood_{i}_{n:05d}_{'x' * 20}": 1.0 for n in range(extra_names)},
                    },
                )
                for i in range(start, min(start + 10, len(ROWS)))
            ]
        )
        self.store.mark_unit_done(self.run_id(), unit, {"kind": "shard", "seconds": 1})
        if unit in self.jobs():  # a unit done before its Job was created needs none
            self.set_job_condition(unit, "Complete")

    def set_job_condition(self, unit: str, kind: str, reason: str = "", message: str = "") -> None:
        job = self._job(unit)
        job["status"] = {
            "conditions": [{"type": kind, "status": "True", "reason": reason, "message": message}]
        }

    def _job(self, unit: str) -> dict[str, Any]:
        name = self.jobs()[unit]["metadata"]["name"]
        return self.kube.objects[("Job", NS, name)]

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == kind)

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    h = Harness(tmp_path)
    h.apply(suite())
    return h


UNITS = ["qa.precomputed.00000", "qa.precomputed.00001", "qa.precomputed.00002"]


def test_first_pass_snapshots_the_suite_and_creates_jobs_up_to_parallelism(
    harness: Harness,
) -> None:
    harness.apply(run())
    harness.step()
    assert sorted(harness.jobs()) == UNITS[:2]
    snapshot = harness.kube.objects[("ConfigMap", NS, names.snapshot_name("nightly"))]
    assert "snapshot.json" in snapshot["data"]
    assert harness.kube.of_kind("NetworkPolicy"), "the run's NetworkPolicy is created"
    assert harness.kube.of_kind("Secret"), "the run's token Secret is created"
    # one status patch before the pass's own (which counts the Jobs just created): the digests
    # of the token (after its Secret, before any Job can use it; never the token) and of the
    # snapshot (before the snapshot exists)
    job_names = [harness.jobs()[unit]["metadata"]["name"] for unit in UNITS[:2]]
    assert harness.kube.writes == [
        ("create", "Secret", names.token_secret_name("nightly")),
        ("status", "ingestTokenSha256", "snapshotSha256"),
        ("create", "ConfigMap", names.snapshot_name("nightly")),
        ("create", "NetworkPolicy", names.network_policy_name("nightly")),
        *(("create", "Job", name) for name in job_names),
    ]
    status = harness.status
    EvalRunStatus.model_validate({k: v for k, v in status.items() if k != "kopf"})
    assert status["phase"] == "Running"
    assert status["units"] == {
        "total": 3,
        "succeeded": 0,
        "running": 2,
        "failed": 0,
        "pending": 1,
        "queued": 0,
    }
    assert status["suiteVersion"].startswith("sha256:")
    assert (harness.condition("Ready")["status"], harness.condition("Ready")["reason"]) == (
        "True",
        "Running",
    )
    assert harness.gauge("evalkube_jobs_created_total") == 2
    # one event names the units the pass started
    started = [e for e in harness.events if e[1] == "UnitStarted"]
    assert [message.split(":")[0] for _, _, message in started] == ["started 2 units"]
    for unit, name in zip(UNITS[:2], job_names, strict=True):
        assert f"{unit} ({name})" in started[0][2]
    # a second pass with nothing changed creates nothing and patches nothing
    patches = harness.gauge("evalkube_status_patches_total")
    assert harness.step() is None
    assert sorted(harness.jobs()) == UNITS[:2]
    assert harness.status["units"]["running"] == 2
    assert harness.step() is None
    assert harness.gauge("evalkube_status_patches_total") == patches


def test_jobs_the_index_has_not_shown_yet_are_not_created_twice(harness: Harness) -> None:
    """kopf's Job index lags the creates: a pass before it shows the new Jobs must neither
    create them again nor start more units than ``parallelism`` allows."""
    harness.apply(run())
    before = harness.kube.job_index()
    harness.step()
    harness.step(index=before)
    assert sorted(harness.jobs()) == UNITS[:2]
    assert harness.gauge("evalkube_jobs_created_total") == 2
    assert harness.status["units"]["running"] == 2
    # once the index has shown a Job, the index alone counts: a Job deleted by hand is re-created
    harness.step()
    name = harness.jobs()[UNITS[0]]["metadata"]["name"]
    del harness.kube.objects[("Job", NS, name)]
    harness.step()
    assert sorted(harness.jobs()) == UNITS[:2]
    assert harness.gauge("evalkube_jobs_created_total") == 3


def test_a_done_unit_frees_its_slot_for_the_next_job(harness: Harness) -> None:
    harness.apply(run())
    harness.step()
    harness.finish_unit(UNITS[0])
    harness.step()
    assert sorted(harness.jobs()) == UNITS
    assert harness.status["units"]["succeeded"] == 1
    assert harness.status["phase"] == "Running"


def test_a_failed_job_fails_its_unit_and_the_run_with_the_reason(harness: Harness) -> None:
    harness.apply(run())
    harness.step()
    harness.set_job_condition(
        UNITS[0], "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    )
    harness.finish_unit(UNITS[1])
    harness.step()
    harness.finish_unit(UNITS[2])
    harness.step()
    status = harness.status
    assert status["phase"] == "Failed"
    assert status["units"]["failed"] == 1
    ready, succeeded = harness.condition("Ready"), harness.condition("Succeeded")
    assert (ready["status"], ready["reason"]) == ("False", "UnitsFailed")
    assert (succeeded["status"], succeeded["reason"]) == ("False", "UnitsFailed")
    assert f"unit {UNITS[0]}: BackoffLimitExceeded" in succeeded["message"]
    assert ("Warning", "RunFailed") in [e[:2] for e in harness.events]
    # the units that did complete still have their results
    assert [r["task"] for r in status["results"]] == ["qa"]


def test_suspended_jobs_count_as_queued_with_the_kueue_queue_named(harness: Harness) -> None:
    harness.apply(run(queueName="evals"))
    harness.step()
    for unit in UNITS[:2]:
        harness._job(unit)["spec"]["suspend"] = True
    harness.step()
    assert harness.status["units"]["queued"] == 2
    assert harness.status["units"]["running"] == 2
    ready = harness.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Queued")
    assert "2 of 3 work-unit Jobs are suspended" in ready["message"]
    assert "LocalQueue 'evals'" in ready["message"]


def test_finishing_writes_results_summary_conditions_gate_and_metrics(harness: Harness) -> None:
    harness.apply(run(gate={"thresholds": [{"task": "qa", "metric": "exact_match", "min": 0.75}]}))
    harness.step()
    harness.finish_unit(UNITS[0], 1.0)
    harness.finish_unit(UNITS[1], 0.5)
    harness.step()
    harness.finish_unit(UNITS[2], 1.0)
    assert harness.step() is not None
    status = harness.status
    EvalRunStatus.model_validate({k: v for k, v in status.items() if k != "kopf"})
    assert status["phase"] == "Succeeded"
    assert status["completedAt"]
    [result] = status["results"]
    assert (result["task"], result["model"]) == ("qa", "precomputed")
    assert result["metrics"]["exact_match"] == pytest.approx(20 / 25)
    assert status["summary"] == "0.800 mean of 1"
    assert (harness.condition("Succeeded")["status"], harness.condition("Ready")["reason"]) == (
        "True",
        "Completed",
    )
    assert status["gate"]["passed"] is True
    passed = harness.condition("Passed")
    assert (passed["status"], passed["reason"]) == ("True", "GatePassed")
    assert harness.gauge(
        "evalkube_score",
        namespace=NS,
        suite="qa",
        task="qa",
        model="precomputed",
        metric="exact_match",
    ) == pytest.approx(0.8)
    assert harness.gauge("evalkube_gate_passed", namespace=NS, suite="qa", run="nightly") == 1
    assert harness.gauge("evalkube_samples_total", namespace=NS, suite="qa", status="valid") == 25
    assert harness.gauge("evalkube_runs", phase="Succeeded") == 1
    assert harness.store.get_run(harness.run_id()).phase == "Succeeded"  # type: ignore[union-attr]
    assert ("Normal", "RunSucceeded") in [e[:2] for e in harness.events]
    # a finished run is left alone
    assert harness.step() is None


def _finish_with_score_flood(harness: Harness, names_per_sample: int) -> None:
    """Every unit done, each sample with ``names_per_sample`` score names of its own (what a
    grader flooding score names would have stored, had nothing capped them)."""
    harness.step()
    for unit in UNITS:
        harness.finish_unit(unit, extra_names=names_per_sample)


def test_a_score_name_flood_leaves_a_bounded_status_and_no_series(harness: Harness) -> None:
    """Samples carrying 75,000 score names in all: the status reports the declared metric and
    63 others (the rest counted as omitted), fits the API server's request limit, and only the
    declared metric becomes a Prometheus series."""
    harness.apply(run())
    harness.kube.status_bytes_max = 1_500_000  # etcd's default request limit
    _finish_with_score_flood(harness, names_per_sample=3_000)
    asyncio.run(harness.reconciler.advance(NS, "nightly"))
    status = harness.status
    assert status["phase"] == "Succeeded", status.get("conditions")
    [result] = status["results"]
    assert len(result["metrics"]) == limits.METRICS_PER_RESULT
    assert result["metrics"]["exact_match"] == 1.0
    assert result["metricsOmitted"] >= limits.METRIC_NAMES_TRACKED - limits.METRICS_PER_RESULT
    series = [
        s.labels["metric"]
        for family in harness.metrics.registry.collect()
        if family.name == "evalkube_score"
        for s in family.samples
    ]
    assert series == ["exact_match"]


def test_a_status_the_api_server_refuses_ends_the_run_failed_with_the_reason(
    harness: Harness,
) -> None:
    """A finished run's status refused for good (HTTP 422) ends the run ``Failed`` with the
    refusal named and its results in the store, instead of leaving it ``Running``."""
    harness.apply(run())
    _finish_with_score_flood(harness, names_per_sample=1)
    harness.kube.refuse_status = 422
    with pytest.raises(ApiError):  # the refused patch, then the reduced one refused too
        asyncio.run(harness.reconciler.advance(NS, "nightly"))
    assert harness.reconciler._phases[(NS, "nightly")] == "Running"
    harness.kube.refuse_status = None
    harness.kube.refuse_results = True  # the status with results is too large, without fits
    asyncio.run(harness.reconciler.advance(NS, "nightly"))
    status = harness.status
    assert status["phase"] == "Failed"
    assert harness.condition("Succeeded")["reason"] == "StatusRejected"
    assert "request is too large" in harness.condition("Succeeded")["message"]
    assert "results" not in status or status["results"] == []
    stored = harness.store.get_run(harness.run_id())
    assert stored is not None
    assert stored.phase == "Failed"
    assert ("Warning", "StatusRejected") in [e[:2] for e in harness.events]


def test_transient_refusals_are_retried_then_end_the_run(harness: Harness) -> None:
    """A ``503`` on the final status keeps the run ``Running`` for the next pass; after
    three refusals in a row it ends ``Failed`` with the reason (never ``Running`` forever)."""
    harness.apply(run())
    _finish_with_score_flood(harness, names_per_sample=1)
    harness.kube.refuse_status = 503
    for _ in range(STATUS_REFUSALS_BEFORE_FAILING - 1):
        with pytest.raises(ApiError):
            asyncio.run(harness.reconciler.advance(NS, "nightly"))
        assert harness.reconciler._phases[(NS, "nightly")] == "Running"
    harness.kube.refuse_status = None
    harness.kube.refuse_results = True
    asyncio.run(harness.reconciler.advance(NS, "nightly"))
    assert harness.status["phase"] == "Failed"
    assert "request is too large" in harness.condition("Succeeded")["message"]


def test_an_invalid_suite_fails_the_run_with_the_reason_and_creates_nothing(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)
    harness.apply(suite({"type": "python", "source": "def not_grade(sample, item):\n    pass\n"}))
    harness.apply(run())
    harness.step()
    status = harness.status
    assert status["phase"] == "Failed"
    ready = harness.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSuite")
    assert "grade" in ready["message"]
    assert harness.condition("Succeeded")["reason"] == "InvalidSuite"
    assert harness.jobs() == {}
    assert ("Warning", "InvalidSuite") in [e[:2] for e in harness.events]


def test_a_missing_suite_keeps_the_run_pending_until_it_appears(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.apply(run())
    harness.step()
    assert harness.status["phase"] == "Pending"
    assert harness.condition("Ready")["reason"] == "SuiteNotFound"
    harness.apply(suite())
    harness.step()
    assert harness.status["phase"] == "Running"
    assert sorted(harness.jobs()) == UNITS[:2]


# -- the run's daemon: drive, wake, unit_done --------------------------------------------------
async def _settle(until: Any) -> None:
    """Let the daemon run until ``until()`` holds (awaited, with a bound)."""
    for _ in range(3000):
        if until():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the daemon's pass never happened")


@contextlib.asynccontextmanager
async def _daemon(harness: Harness) -> AsyncIterator[asyncio.Task[None]]:
    """The run's daemon, as kopf runs it; cancelled at the end as kopf cancels a stopped one."""
    task = asyncio.create_task(harness.reconciler.drive(NS, "nightly"))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert (NS, "nightly") not in harness.reconciler._wakeups


def _passes(harness: Harness) -> float:
    return harness.gauge("evalkube_reconcile_passes_total") or 0


def test_advance_reads_the_run_afresh_and_patches_its_status(harness: Harness) -> None:
    harness.apply(run())
    asyncio.run(harness.reconciler.advance(NS, "nightly"))
    assert harness.status["phase"] == "Running"
    assert sorted(harness.jobs()) == UNITS[:2]
    patched = [p for p in harness.kube.status_patches if "phase" in p[2]]
    assert len(patched) == 1
    # a deleted run: nothing to do, nothing written
    asyncio.run(harness.reconciler.advance(NS, "gone"))
    assert all(p[1] != "gone" for p in harness.kube.status_patches)


def test_a_unit_report_creates_the_next_job_without_waiting_for_a_timer(
    harness: Harness,
) -> None:
    harness.apply(run())

    async def scenario() -> None:
        async with _daemon(harness):
            await _settle(lambda: len(harness.kube.of_kind("Job")) == 2)
            harness.store.mark_unit_done(harness.run_id(), UNITS[0], {})
            entry = harness.reconciler.registry.get(NS, "nightly")
            assert entry is not None
            harness.reconciler.unit_done(entry, UNITS[0])  # what the ingest server calls
            await _settle(lambda: len(harness.kube.of_kind("Job")) == 3)

    asyncio.run(scenario())
    assert sorted(harness.jobs()) == UNITS
    assert harness.status["units"]["succeeded"] == 1


def test_wake_ups_during_a_pass_add_up_to_one_more_pass(harness: Harness) -> None:
    harness.apply(run())
    original = harness.kube.run
    release = asyncio.Event()

    async def held_run(namespace: str, name: str) -> dict[str, Any] | None:
        await release.wait()
        return await original(namespace, name)

    harness.kube.run = held_run  # type: ignore[method-assign]

    async def scenario() -> None:
        async with _daemon(harness):
            await asyncio.sleep(0)  # the first pass is waiting to read the run
            for _ in range(5):
                harness.reconciler.wake(NS, "nightly")
            release.set()
            await _settle(lambda: _passes(harness) == 2)
            for _ in range(50):  # give a wrongly queued third pass every chance to run
                await asyncio.sleep(0)
            assert _passes(harness) == 2

    asyncio.run(scenario())
    assert harness.gauge("evalkube_jobs_created_total") == 2


def test_the_daemon_of_a_finished_run_ends_and_its_job_events_cost_nothing(
    harness: Harness,
) -> None:
    harness.apply(run())
    harness.step()
    for unit in UNITS[:2]:
        harness.finish_unit(unit)
    harness.step()
    harness.finish_unit(UNITS[2])

    async def scenario() -> None:
        await asyncio.wait_for(harness.reconciler.drive(NS, "nightly"), 30)

    asyncio.run(scenario())  # the last pass finished the run, and the daemon returned
    assert harness.status["phase"] == "Succeeded"
    harness.kube.run = None  # type: ignore[assignment,method-assign]  # any read would fail
    harness.reconciler.wake(NS, "nightly")


def test_a_run_blocked_pending_is_looked_at_again_until_its_suite_appears(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)
    harness.reconciler.settings = harness.reconciler.settings.model_copy(
        update={"retry_interval": 0.001}
    )
    harness.apply(run())

    async def scenario() -> None:
        async with _daemon(harness):
            await _settle(lambda: harness.status.get("phase") == "Pending")
            harness.apply(suite())  # no event of the run's own follows
            await _settle(lambda: harness.kube.of_kind("Job"))

    asyncio.run(scenario())
    assert harness.status["phase"] == "Running"
    assert sorted(harness.jobs()) == UNITS[:2]


def test_the_first_pass_takes_the_run_kopf_delivered_and_later_passes_read_it(
    harness: Harness,
) -> None:
    """A new run's first pass uses the body kopf started its daemon with (one read less per
    new run); a daemon started again in the same process (kopf paused and resumed it) reads
    the run, since kopf's copy may not show the status this operator wrote yet."""
    harness.apply(run())
    reads: list[str] = []
    original = harness.kube.run

    async def counted(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(name)
        return await original(namespace, name)

    harness.kube.run = counted  # type: ignore[method-assign]
    delivered = copy.deepcopy(harness.body)

    async def first_daemon() -> None:
        task = asyncio.create_task(harness.reconciler.drive(NS, "nightly", delivered))
        await _settle(lambda: len(harness.kube.of_kind("Job")) == 2 and _passes(harness) == 1)
        harness.reconciler.wake(NS, "nightly")
        await _settle(lambda: _passes(harness) == 2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(first_daemon())
    assert reads == ["nightly"]  # the woken pass only
    assert harness.status["units"]["running"] == 2

    async def second_daemon() -> None:
        async with _daemon_with(harness, delivered):  # kopf's stale copy: no status at all
            await _settle(lambda: _passes(harness) == 3)

    asyncio.run(second_daemon())
    assert reads == ["nightly", "nightly"]
    assert harness.gauge("evalkube_jobs_created_total") == 2
    assert len(harness.kube.of_kind("Secret")) == 1
    # the digests, then the first pass's status; the passes after it had nothing to write
    statuses = [w for w in harness.kube.writes if w[0] == "status"]
    assert len(statuses) == 2
    assert statuses[0] == ("status", "ingestTokenSha256", "snapshotSha256")


@contextlib.asynccontextmanager
async def _daemon_with(harness: Harness, body: dict[str, Any]) -> AsyncIterator[None]:
    task = asyncio.create_task(harness.reconciler.drive(NS, "nightly", body))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_only_job_events_that_change_what_a_pass_reads_wake_the_run(harness: Harness) -> None:
    """The Job controller writes each Job's status as its Pods come and go; a pass reads only
    the Job's state (active, queued, finished), so only a new state, a Job the operator did not
    create, or a deleted Job wakes the run."""
    harness.apply(run())
    harness.step()
    woken: list[str] = []
    harness.reconciler.wake = lambda namespace, name: woken.append(name)  # type: ignore[method-assign]
    job = harness.jobs()[UNITS[0]]["metadata"]["name"]
    active, done = JobState("active"), JobState("succeeded")
    harness.reconciler.job_changed(NS, "nightly", job, active)  # its own ADDED event
    harness.reconciler.job_changed(NS, "nightly", job, active)  # its Pod counted
    assert woken == []
    harness.reconciler.job_changed(NS, "nightly", job, done)
    harness.reconciler.job_changed(NS, "nightly", job, done)
    assert woken == ["nightly"]
    harness.reconciler.job_changed(NS, "nightly", "made-by-hand", active)
    harness.reconciler.job_changed(NS, "nightly", job, None)  # deleted
    assert woken == ["nightly"] * 3
    harness.reconciler.forget(NS, "nightly")
    assert not harness.reconciler._job_states


def test_a_job_create_that_fails_is_retried_by_the_next_pass(harness: Harness) -> None:
    """A create cut short (a timeout in a burst) leaves the unit without a Job: the next pass
    creates it, instead of counting it running forever."""
    harness.apply(run())
    original = harness.kube.create
    calls = 0

    async def flaky(manifest: Any) -> bool:
        nonlocal calls
        if manifest["kind"] == "Job":
            calls += 1
            if calls == 2:
                raise TimeoutError("pool timeout")
        return await original(manifest)

    harness.kube.create = flaky  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        harness.step()
    assert sorted(harness.jobs()) == UNITS[:1]
    assert [e[2] for e in harness.events if e[1] == "UnitStarted"] == [
        f"started 1 unit: {UNITS[0]} ({harness.jobs()[UNITS[0]]['metadata']['name']})"
    ]
    harness.step()
    assert sorted(harness.jobs()) == UNITS[:2]
    assert harness.status["units"]["running"] == 2


def test_failed_passes_are_retried_soon_and_then_less_often() -> None:
    assert retry_wait(False, 0, 2.0, 60.0) == 60.0
    assert retry_wait(True, 0, 2.0, 60.0) == 2.0
    assert [retry_wait(False, n, 2.0, 60.0) for n in (1, 2, 3, 5, 6, 100)] == [
        2.0,
        4.0,
        8.0,
        32.0,
        60.0,
        60.0,
    ]


KOPF_CONTEXT: contextvars.ContextVar[str] = contextvars.ContextVar("kopf_context")


def test_a_pass_a_unit_report_starts_posts_events_in_kopfs_context(harness: Harness) -> None:
    """kopf posts events through context variables its daemons run with; the ingest server's
    requests do not have them, and need not: they only wake the daemon, which makes the pass."""
    seen: list[str] = []
    harness.reconciler.event = lambda body, kind, reason, message: seen.append(
        KOPF_CONTEXT.get("none")
    )
    harness.apply(run())

    async def scenario() -> None:
        KOPF_CONTEXT.set("kopf")  # the daemon's task copies this context, as kopf's do
        async with _daemon(harness):
            await _settle(lambda: len(harness.kube.of_kind("Job")) == 2)
            harness.store.mark_unit_done(harness.run_id(), UNITS[0], {})
            entry = harness.reconciler.registry.get(NS, "nightly")
            assert entry is not None
            contextvars.Context().run(harness.reconciler.unit_done, entry, UNITS[0])  # aiohttp's
            await _settle(lambda: len(harness.kube.of_kind("Job")) == 3)

    asyncio.run(scenario())
    assert seen
    assert set(seen) == {"kopf"}


def test_the_egress_grant_is_issued_first_and_refreshed_at_half_its_lifetime(
    tmp_path: Path,
) -> None:
    """No key: the run waits ``Pending``. A grant past half its lifetime is minted again; a key
    that went missing meanwhile only warns, as the current grant still serves."""
    harness = Harness(tmp_path)
    key = tmp_path / "grant-key"
    harness.reconciler.settings = harness.reconciler.settings.model_copy(
        update={
            "egress_via_gateway": True,
            "egress_grant_key_file": str(key),
            "egress_grant_ttl_seconds": 600,
            "ingest_url": "http://10.96.0.5:8080",
            "egress_gateway_url": "http://10.96.0.6:3128",
        }
    )
    harness.apply(suite())
    harness.apply(run(providers={"openai": {"baseURL": "https://api.openai.com/v1"}}))
    harness.step()
    assert harness.status["phase"] == "Pending"
    assert harness.condition("Ready")["reason"] == "EgressKeyUnavailable"
    assert harness.jobs() == {}
    key.write_text("k" * 32 + "\n")
    harness.step()
    assert harness.status["phase"] == "Running"
    secret = ("Secret", NS, names.egress_grant_secret_name("nightly"))
    assert harness.kube.objects[secret]["stringData"]["grant"].startswith("v1.")
    setup = harness.reconciler._setups["uid-1"]
    first_expiry = setup.grant_expires
    assert first_expiry >= time.time() + 590

    setup.grant_expires = first_expiry - 200  # not yet half its lifetime
    harness.kube.objects[secret]["stringData"]["grant"] = "old"
    harness.step()
    assert harness.kube.objects[secret]["stringData"]["grant"] == "old"

    setup.grant_expires = first_expiry - 400  # past half its lifetime
    key.unlink()
    harness.step()
    assert harness.status["phase"] == "Running"
    assert ("Warning", "EgressKeyUnavailable") in [e[:2] for e in harness.events]
    assert harness.kube.objects[secret]["stringData"]["grant"] == "old"

    key.write_text("k" * 32 + "\n")
    harness.step()
    assert harness.kube.objects[secret]["stringData"]["grant"].startswith("v1.")
    assert setup.grant_expires >= first_expiry
