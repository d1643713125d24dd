"""Reconcile one EvalRun: observe the cluster and the store, decide, act, report status.

Each unfinished run has a kopf daemon (``handlers.run_daemon``) that runs
:meth:`RunReconciler.drive`: one pass at a time, each reading the run afresh (but the first
of a run this process has not seen, which takes the run kopf delivered), so a pass never acts
on a status an earlier pass already replaced. Events that change one of its Jobs' state and
its units' done reports (through the ingest server) wake it. The decisions are
:func:`evalkube.controller.run_decisions.decide`; this module does the I/O around them and patches
the status only when it changed (status patches grow with unit transitions, never with
samples).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from lightkube import ApiError

from evalkube import limits
from evalkube.controller import egress_grants, manifests, names
from evalkube.controller.kube import EvalRunResource, Kube
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.controller.results import record_done_units, run_aggregates
from evalkube.controller.run_decisions import (
    Decision,
    JobIndex,
    JobState,
    decide,
    failed_units_message,
    job_state,
    permanent_refusal,
    refused_status,
    summary_line,
)
from evalkube.controller.settings import OperatorSettings
from evalkube.controller.snapshot import build_snapshot, check_cluster_suite, image_policy
from evalkube.controller.tracking import RunTracking
from evalkube.controller.wakeups import Wakeups, sleep
from evalkube.engine.driver import grader_calls_models, judges_call_models
from evalkube.engine.plan import Unit
from evalkube.engine.runtime import suite_criteria
from evalkube.engine.snapshot import PREPARE_UNIT, Prepared, Snapshot, parse_snapshot
from evalkube.grading.criteria import Criterion
from evalkube.grading.gate import gate_message, gate_run
from evalkube.grading.run_results import aggregate_results, declared_metrics, expected_metrics
from evalkube.models import (
    Condition,
    ConfigError,
    EvalRunSpec,
    EvalRunStatus,
    EvalSuiteSpec,
    GateSpec,
    GateStatus,
    SpecError,
    TaskModelResult,
    TaskSpec,
    validate_spec,
)
from evalkube.models.run import Phase
from evalkube.models.snapshot import RunSnapshot
from evalkube.models.status import (
    cap_message,
    condition,
    list_message,
    merge_conditions,
    now_rfc3339,
    read_status,
    same_status,
)
from evalkube.sources import parse_uri
from evalkube.store import ResultStore, RunRecord
from evalkube.util import jsonfast

FINAL_PHASES = ("Succeeded", "Failed")
#: Refused patches of a finished run's status, in a row, after which the run ends ``Failed``
#: even when the refusals looked transient (``5xx`` without a reason).
STATUS_REFUSALS_BEFORE_FAILING = 3
#: The EvalRun status field holding the SHA-256 of the run's ingest token (never the token).
TOKEN_DIGEST_FIELD = "ingestTokenSha256"
SNAPSHOT_DIGEST_FIELD = "snapshotSha256"
#: Seconds a resolved ClusterIP of the ingest or gateway Service is reused.
SERVICE_IP_CACHE_SECONDS = 300.0
EventSink = Callable[[Mapping[str, Any], str, str, str], None]
_log = logging.getLogger(__name__)


@dataclass
class _Setup:
    snapshot: RunSnapshot
    entry: RunEntry
    parsed: Snapshot
    units: list[Unit] | None
    """The run's plan: the very list the pod's runner plans from the same snapshot (``None``
    until the run's ``uri`` sources are pinned: their row counts decide it)."""
    grant_expires: int = 0
    """When the run's egress grant expires (unix seconds; 0 until one is issued)."""
    unseen: dict[str, JobState] = field(default_factory=dict)
    """Units whose Job this operator created and the Job index has not shown yet, with the
    state it was created in."""
    deadline_warned: set[str] = field(default_factory=set)
    """Tasks whose capped Job deadline this operator has warned about (``DeadlineCapped``)."""
    recorded_here: bool = False
    """This pass put the run into the store: no runner can have reported to it yet."""

    @property
    def spec(self) -> EvalRunSpec:
        return self.snapshot.run_spec

    @functools.cached_property
    def criteria_of(self) -> dict[str, tuple[Criterion, ...]]:
        """The suite's criteria per task (pass/fail counts of the aggregates)."""
        return suite_criteria(self.snapshot.suite.spec)


class RunReconciler:
    """Everything the run handlers need, shared by all runs of the operator."""

    def __init__(
        self,
        kube: Kube,
        store: ResultStore,
        registry: RunRegistry,
        metrics: OperatorMetrics,
        settings: OperatorSettings,
        event: EventSink | None = None,
    ) -> None:
        self.kube = kube
        self.store = store
        self.registry = registry
        self.metrics = metrics
        self.settings = settings
        self.event = _capped(event or (lambda body, kind, reason, message: None))
        self.tracking = RunTracking(kube, store, settings, self.event)
        self._phases: dict[tuple[str, str], Phase] = {}
        #: What ``_setup`` found per EvalRun uid: the snapshot and the token never change, so
        #: timer passes skip re-reading them (rebuilt from the cluster after a restart).
        self._setups: dict[str, _Setup] = {}
        self._gated_runs: dict[tuple[str, str], str] = {}
        """(namespace, suite) -> the run whose gate ``evalkube_gate_passed`` shows."""
        #: What ``_unit_settings`` resolved, and when.
        self._unit_settings_cache: tuple[float, OperatorSettings] | None = None
        self._status_refusals: dict[tuple[str, str], int] = {}
        """Status patches the API server refused per run, in a row (see ``_status_refused``)."""
        self._wakeups = Wakeups()
        """Runs whose kopf daemon is driving them."""
        self.jobs: JobIndex = {}
        """``(namespace, run) -> (unit id, JobState)`` of every work-unit Job: kopf's index
        (``handlers.unit_jobs``), kept current by the Job watch, so a pass lists no Jobs."""
        self._job_states: dict[tuple[str, str, str], JobState] = {}
        """``(namespace, run, Job) -> JobState`` last known of each work-unit Job: what the
        operator created it as, then what its events showed (see :meth:`job_changed`)."""
        self._seen: dict[tuple[str, str], str] = {}
        """``(namespace, name) -> uid`` of each run a pass of this process has read."""

    async def drive(self, namespace: str, name: str, body: Mapping[str, Any] | None = None) -> None:
        """Drive the run until it is finished: the body of its kopf daemon, so its passes are
        serialized by construction and kopf stops it when the run is deleted.

        ``body``: the run as kopf delivered it when it started the daemon; the first pass uses
        it instead of reading the run again when no pass of this operator has touched the run
        yet (see :meth:`_first_body`).

        A pass follows every :meth:`wake` (those during a pass coalesce into one after it);
        without one, the next pass comes after ``retry_interval`` while the run is blocked
        ``Pending`` or its last pass failed (doubling with each failure in a row, up to
        ``reconcile_interval``) and after ``reconcile_interval`` otherwise, for an event that
        was missed.
        """
        key = (namespace, name)
        first = self._first_body(body)
        failures = 0
        with self._wakeups.held(key) as wakeup:
            while True:
                wakeup.clear()
                try:
                    await self.advance(namespace, name, first)
                    failures = 0
                except Exception:  # the daemon goes on: its next pass may succeed
                    failures += 1
                    _log.exception("a pass over EvalRun %s/%s failed", namespace, name)
                first = None
                phase = self._phases.get(key)
                if phase in FINAL_PHASES:
                    return
                wait = retry_wait(
                    phase == "Pending",
                    failures,
                    self.settings.retry_interval,
                    self.settings.reconcile_interval,
                )
                await sleep(wakeup, wait)

    def wake(self, namespace: str, name: str) -> None:
        """Ask for a pass over the run (one of its Jobs changed, or a unit reported done)."""
        self._wakeups.wake((namespace, name))

    def job_changed(self, namespace: str, run: str, job: str, state: JobState | None) -> None:
        """A work-unit Job's event (``state`` ``None``: the Job is gone): a pass over its run
        when the Job is new to the operator, its state changed (finished, suspended,
        admitted) or it was deleted. Events that change nothing a pass reads (the Job
        controller counting its Pods) wake nothing."""
        key = (namespace, run, job)
        if state is None:
            self._job_states.pop(key, None)
        elif self._job_states.get(key) == state:
            return
        else:
            self._job_states[key] = state
        self.wake(namespace, run)

    def unit_done(self, entry: RunEntry, unit: str) -> None:
        """A unit reported done (``ApiServer.on_unit_done``): its slot is free now."""
        self.wake(entry.namespace, entry.name)

    def _first_body(self, body: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A copy of the body kopf started the run's daemon with, when the first pass may use
        it: no pass of this operator process has seen the run (its uid) yet, so no status this
        operator wrote can be missing from it (kopf's body comes from its watch, which lists
        afresh when the operator starts). Otherwise ``None``: the pass reads the run."""
        meta = (body or {}).get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if body is None or not meta.get("uid") or self._seen.get(key) == meta["uid"]:
            return None
        return copy.deepcopy(dict(body))

    async def advance(
        self, namespace: str, name: str, body: Mapping[str, Any] | None = None
    ) -> None:
        """One pass over the run as the API server holds it now (or ``body``, the run as kopf
        just delivered it, for a first pass); the status patched if it changed."""
        if body is None:
            body = await self.kube.run(namespace, name)
        if body is not None:
            meta = body["metadata"]
            self._seen[(meta["namespace"], meta["name"])] = meta["uid"]
            old_phase = read_status(EvalRunStatus, body.get("status")).phase
            new = await self.reconcile(body)
            if new is not None:
                try:
                    await self.kube.patch_status(EvalRunResource, namespace, name, new.to_wire())
                except ApiError as exc:
                    await self._status_refused(body, new, old_phase, exc)
            self.metrics.passes.inc()

    async def _status_refused(
        self, body: Mapping[str, Any], new: EvalRunStatus, old_phase: Phase, exc: ApiError
    ) -> None:
        """The API server refused a status patch. A finished run whose status it refuses for
        good (too large, invalid: ``413``/``422``, a ``500`` that says so, or any refusal
        :data:`STATUS_REFUSALS_BEFORE_FAILING` passes in a row) ends ``Failed`` with the
        reason and without its results, which stay in the store: it must never stay
        ``Running`` with nothing reported. Otherwise the pass is undone (the run keeps its
        phase here) and the refusal raised, for the next pass to retry."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        refusals = self._status_refusals[key] = self._status_refusals.get(key, 0) + 1
        if new.phase not in FINAL_PHASES or not (
            permanent_refusal(exc) or refusals >= STATUS_REFUSALS_BEFORE_FAILING
        ):
            self._phases[key] = old_phase
            raise exc
        failed = refused_status(new, exc, meta.get("generation"))
        self.event(body, "Warning", "StatusRejected", failed.conditions[-1].message)
        try:
            await self.kube.patch_status(EvalRunResource, *key, failed.to_wire())
        except ApiError:
            self._phases[key] = old_phase
            raise
        self._phases[key] = failed.phase
        self._export_phases()
        entry = self.registry.get(*key)
        if entry is not None:  # the store keeps the results the status could not hold
            wire = {"results": [r.to_wire() for r in new.results]}
            await asyncio.to_thread(self.store.finish_run, entry.run_id, "Failed", wire)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted run from the registry, the ``evalkube_runs`` gauge and the caches."""
        self.registry.forget(namespace, name)
        self._phases.pop((namespace, name), None)
        self._seen.pop((namespace, name), None)
        self._export_phases()
        for uid, setup in list(self._setups.items()):
            if (setup.entry.namespace, setup.entry.name) == (namespace, name):
                del self._setups[uid]
        for key in [k for k in self._job_states if k[:2] == (namespace, name)]:
            del self._job_states[key]

    def _export_phases(self) -> None:
        counts = Counter(self._phases.values())
        for phase in get_args(Phase):
            self.metrics.runs.labels(phase).set(counts[phase])

    async def reconcile(self, body: Mapping[str, Any]) -> EvalRunStatus | None:
        """One pass; returns the status to patch, or ``None`` when it is unchanged (ignoring
        condition timestamps)."""
        meta = body["metadata"]
        old = read_status(EvalRunStatus, body.get("status"))
        new = await self._reconcile(body, old)
        phase = self._phases[(meta["namespace"], meta["name"])] = (new or old).phase
        self._export_phases()
        if phase in FINAL_PHASES:  # a finished run is never set up again
            self._setups.pop(meta["uid"], None)
        if new is None or same_status(new, old):
            return None
        self.metrics.status_patches.inc()
        return new

    async def _reconcile(self, body: Mapping[str, Any], old: EvalRunStatus) -> EvalRunStatus | None:
        meta = body["metadata"]
        if old.phase in FINAL_PHASES:
            # serve a finished run's samples after a restart (read-only: no token is accepted)
            if self.registry.get(meta["namespace"], meta["name"]) is None:
                self.registry.register(_spec_entry(body, token_digest=""))
            self.tracking.resume(body, old)  # MLflow logging a restart cut short
            return None
        generation = meta.get("generation")
        try:
            setup = self._setups.get(meta["uid"]) or await self._setup(body)
            await self._refresh_grant(body, setup)
            unit_settings = await self._unit_settings()
            units = setup.units
            if units is None:
                units = await self._prepared(body, setup, unit_settings)
        except _Blocked as blocked:
            failed = blocked.phase == "Failed"
            if old.phase != blocked.phase:
                kind = "Warning" if failed else "Normal"
                self.event(body, kind, blocked.reason, blocked.message)
            conditions = [
                condition(type_, False, blocked.reason, blocked.message, generation)
                for type_ in (("Ready", "Succeeded") if failed else ("Ready",))
            ]
            return old.model_copy(
                update={
                    "phase": blocked.phase,
                    "observed_generation": generation,
                    "conditions": merge_conditions(old.conditions, conditions),
                    "completed_at": now_rfc3339() if failed else old.completed_at,
                }
            )
        done, reported = await self._store_progress(setup, units)

        def decided() -> Decision:
            decision = decide(
                units, self._observed_jobs(setup), done, self.settings.parallelism, reported
            )
            decision.failed = explain_failures(
                decision.failed, units, setup.snapshot.suite.spec, self.settings
            )
            return decision

        decision = decided()
        if decision.create:
            await self._create_jobs(body, setup, decision, unit_settings)
            decision = decided()  # the status counts the Jobs just created
        new = old.model_copy(
            update={
                "phase": decision.phase,
                "observed_generation": generation,
                "suite_version": setup.parsed.version,
                "units": decision.counts(),
                "started_at": old.started_at or now_rfc3339(),
            }
        )
        conditions = [condition("Ready", True, "Running", "work units are running", generation)]
        if decision.queued:
            queue = setup.spec.queue_name
            message = f"{decision.queued} of {decision.total} work-unit Jobs are suspended, " + (
                f"waiting for Kueue to admit them from LocalQueue {queue!r}"
                if queue
                else "not by evalkube; set their spec.suspend to false to go on"
            )
            conditions = [condition("Ready", False, "Queued", message, generation)]
        if decision.complete:
            conditions = await self._finish(body, new, setup, decision)
        new.conditions = merge_conditions(old.conditions, conditions)
        return new

    async def _store_progress(
        self, setup: _Setup, units: list[Unit]
    ) -> tuple[set[str], dict[str, str]]:
        """The units done and those whose runner reported them failed, in one trip to the
        store's thread (a burst of new runs queues on it); none asked for a run this pass
        recorded."""
        if setup.recorded_here:
            setup.recorded_here = False
            return set(), {}
        store, run_id = self.store, setup.entry.run_id

        def read() -> tuple[set[str], dict[str, str]]:
            done = store.done_units(run_id)
            # each unit's samples are read once, when it is done (never all of them at the end)
            record_done_units(store, run_id, units, done, setup.criteria_of)
            return done, store.failed_units(run_id)

        return await asyncio.to_thread(read)

    def _observed_jobs(self, setup: _Setup) -> dict[str, JobState]:
        """The run's Jobs as the Job index shows them, plus those created here that it has not
        shown yet (a pass right after a create must not create them again)."""
        jobs = dict(self.jobs.get((setup.entry.namespace, setup.entry.name), ()))
        for unit in setup.unseen.keys() & jobs.keys():
            del setup.unseen[unit]
        return {**setup.unseen, **jobs}

    async def resolve_run(self, namespace: str, name: str) -> RunEntry | None:
        """A run from durable state (the EvalRun and its token Secret), for an API request
        that reaches a replica which has not reconciled the run (a standby, or any replica
        right after a restart). Finished runs are read-only: their entry accepts no token."""
        body = await self.kube.run(namespace, name)
        if body is None:
            return None
        status = read_status(EvalRunStatus, body.get("status"))
        if status.phase in FINAL_PHASES:
            return _spec_entry(body, token_digest="")
        if not status.ingest_token_sha256:
            return None
        return _spec_entry(body, status.ingest_token_sha256)

    # -- setup: suite snapshot, token, network policy, store record ----------------------------
    async def _setup(self, body: Mapping[str, Any]) -> _Setup:
        """Set the run up, or find what an earlier pass or operator set up; cached."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            spec = validate_spec(EvalRunSpec, dict(body.get("spec") or {}), prefix="spec")
        except SpecError as exc:
            raise _Blocked("Failed", "InvalidSpec", "; ".join(exc.problems)) from None
        if spec.suite_ref is None:
            raise _Blocked("Failed", "InvalidSpec", "spec.suiteRef.name is required in a cluster")
        suite_name = spec.suite_ref.name
        run_id = names.run_id(namespace, name, meta["uid"])
        status = read_status(EvalRunStatus, body.get("status"))
        token_digest = status.ingest_token_sha256 or ""
        # a new run (Pending, no snapshot recorded): no snapshot of ours can exist, so none is
        # read; one someone else made shows up as the create's conflict (_create_snapshot)
        snapshot_data = (
            None
            if status.phase == "Pending" and status.snapshot_sha256 is None
            else await self.kube.config_map_data(namespace, names.snapshot_name(name))
        )
        if snapshot_data is None:
            suite = await self.kube.suite(namespace, suite_name)
            if suite is None:
                missing = f"EvalSuite {suite_name!r} does not exist in {namespace}"
                raise _Blocked("Pending", "SuiteNotFound", missing)
            check = await check_cluster_suite(
                self.kube, namespace, suite["spec"], image_policy(self.settings)
            )
            if not check.ok:
                raise _Blocked("Failed", "InvalidSuite", "; ".join(check.problems))
            snapshot = _pin_shard_size(
                build_snapshot(body, run_id, suite_name, check), self.settings
            )
            token_digest = await self._create_snapshot(body, snapshot, token_digest)
            taken = f"snapshot of suite {suite_name} at {check.version[:19]}"
            self.event(body, "Normal", "Snapshot", taken)
        else:
            # the run is pinned to its snapshot: runners plan units from the snapshot's spec,
            # so an edit of the EvalRun's spec mid-run must not change the operator's plan
            text = snapshot_data.get("snapshot.json") or ""
            if problem := snapshot_not_ours(body, text):
                raise _Blocked("Failed", "SnapshotNotOurs", problem)
            snapshot = RunSnapshot.model_validate_json(text)
        if not token_digest:  # a pass that stopped between the Secret and the status
            token_digest = await self._new_ingest_token(body, {})
        entry = RunEntry(namespace, name, run_id, snapshot.suite.name, token_digest)
        self.registry.register(entry)
        await self.kube.create(manifests.network_policy(body, snapshot.run_spec, self.settings))
        record = RunRecord(
            run_id,
            snapshot.suite.name,
            snapshot.suite.version,
            snapshot.to_wire(),
            "pod (gVisor)" if self.settings.runtime_class else "pod",
        )
        recorded = await asyncio.to_thread(_record_run, self.store, record)
        parsed = parse_snapshot(snapshot)
        units = parsed.units() if parsed.pinned else None
        setup = self._setups[meta["uid"]] = _Setup(snapshot, entry, parsed, units)
        setup.recorded_here = recorded and units is not None  # (a prepare pod reports first)
        return setup

    async def _create_snapshot(
        self, body: Mapping[str, Any], snapshot: RunSnapshot, token_digest: str
    ) -> str:
        """Create the run's snapshot ConfigMap; the digest of the run's ingest token (made
        here too when ``token_digest`` is empty). One larger than a ConfigMap holds fails the
        run (``SnapshotTooLarge``, naming what takes the room), and so does the API server
        refusing it for what it is (``413``/``422``): a pass must not retry it forever.

        Both digests go into the status in one patch, after the token's Secret and before the
        snapshot: a ConfigMap of this name that someone else made (before the run, or in a race
        with this create) then differs from the recorded snapshot, and is never run."""
        manifest = manifests.snapshot_config_map(body, snapshot)
        size = manifests.config_map_bytes(manifest)
        if size > limits.SNAPSHOT_CONFIGMAP_BYTES:
            raise _Blocked("Failed", "SnapshotTooLarge", snapshot_too_large(snapshot, size))
        text = manifest["data"]["snapshot.json"]
        recorded = {SNAPSHOT_DIGEST_FIELD: digest(text)}
        if token_digest:
            await self._patch_status(body, recorded)
        else:
            token_digest = await self._new_ingest_token(body, recorded)
        try:
            created = await self.kube.create(manifest)
        except ApiError as exc:
            if not permanent_refusal(exc):
                raise
            refusal = str(getattr(exc.status, "message", "") or exc)[:500]
            message = f"the API server refused the run's snapshot ConfigMap: {refusal}; "
            raise _Blocked(
                "Failed", "SnapshotTooLarge", message + snapshot_too_large(snapshot, size)
            ) from None
        if not created:  # one of this name exists: run it only if it is exactly this snapshot
            meta = body["metadata"]
            found = await self.kube.config_map_data(meta["namespace"], manifest["metadata"]["name"])
            theirs = (found or {}).get("snapshot.json") or ""
            if digest(theirs) != recorded[SNAPSHOT_DIGEST_FIELD]:
                # not ours, whatever its content says: the message of one made before the run
                problem = snapshot_not_ours({**body, "status": {"phase": "Pending"}}, theirs)
                raise _Blocked("Failed", "SnapshotNotOurs", problem or "")
        return token_digest

    async def _patch_status(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = body["metadata"]
        await self.kube.patch_status(EvalRunResource, meta["namespace"], meta["name"], status)

    async def _new_ingest_token(self, body: Mapping[str, Any], also: dict[str, Any]) -> str:
        """Make the run's ingest token: written into its Secret (created or overwritten: no Job
        exists yet), then its SHA-256 into the status, with ``also``; that digest.

        The operator never reads a Secret (RBAC: create and patch only): it keeps the token's
        SHA-256 in ``status.ingestTokenSha256``, written before any Job can use the token and
        right away (not with the pass's status), so a restart finds it even if the pass stops
        early. A pass that finds none (a new run, or one that stopped between the Secret and
        the status) makes a new token."""
        token = secrets.token_urlsafe(32)
        await self.kube.create_or_update_secret(manifests.token_secret(body, token))
        await self._patch_status(body, {**also, TOKEN_DIGEST_FIELD: digest(token)})
        return digest(token)

    # -- sources: the prepare Job pins the run's uri sources, then units are planned ----------
    async def _prepared(
        self, body: Mapping[str, Any], setup: _Setup, unit_settings: OperatorSettings
    ) -> list[Unit]:
        """The run's plan once its prepare pod reported the pins of its ``uri`` sources (a
        ``Pending`` run until then, with the prepare Job created); ``Failed`` naming the
        source when it could not be pinned."""
        run_id = setup.entry.run_id
        report = (await asyncio.to_thread(self.store.done_unit_infos, run_id)).get(PREPARE_UNIT)
        if report is not None:
            if "error" in report:
                raise _Blocked("Failed", "SourceUnavailable", str(report["error"]))
            try:
                setup.parsed.apply_pins(Prepared.from_wire(report))
                setup.units = setup.parsed.units()
            except (ValueError, ConfigError) as exc:
                raise _Blocked("Failed", "SourceUnavailable", f"prepare report: {exc}") from None
            pinned = ", ".join(
                f"{k} {p.rows:,} rows" for k, p in sorted(setup.parsed.loaded.pins.items())
            )
            self.event(body, "Normal", "SourcesPinned", pinned[:1000])
            return setup.units
        job = self._observed_jobs(setup).get(PREPARE_UNIT)
        if job is not None and job.phase in ("failed", "succeeded"):
            why = job.reason if job.phase == "failed" else "it completed without reporting"
            raise _Blocked("Failed", "SourceUnavailable", f"the run's prepare Job failed: {why}")
        if job is None:
            manifest = manifests.prepare_job(
                body,
                spec=setup.spec,
                settings=unit_settings,
                sources=source_mounts(setup.parsed.loaded.suite.spec.tasks),
            )
            if await self._create_job(setup, PREPARE_UNIT, manifest):
                self.event(body, "Normal", "Preparing", f"started {manifest['metadata']['name']}")
        keys = ", ".join(f"{t.id}/{part}" for t, part in setup.parsed.loaded.uri_sources())
        raise _Blocked(
            "Pending", "Preparing", f"pinning the run's sources ({keys}) before its units start"
        )

    # -- egress: the run's grant and the URLs pods use without DNS ------------------------------
    async def _refresh_grant(self, body: Mapping[str, Any], setup: _Setup) -> None:
        """Mint the run's egress grant into its Secret (created, or updated in place: running
        pods' proxies re-read the mounted file): the first one, and a fresh one once half of
        the current one's lifetime has passed (which still serves until it expires)."""
        if not self.settings.egress_via_gateway:
            return
        left = setup.grant_expires - time.time()
        if left > self.settings.egress_grant_ttl_seconds / 2:
            return
        try:
            hosts = egress_grants.grant_hosts(setup.spec, setup.snapshot.suite.spec)
        except ValueError as exc:
            raise _Blocked("Failed", "InvalidSpec", f"spec.providers: {exc}") from None
        path = Path(self.settings.egress_grant_key_file)
        try:
            key = await asyncio.to_thread(egress_grants.read_signing_key, path)
        except (OSError, ValueError) as exc:
            message = (
                f"cannot sign the run's egress grant: {exc}; the operator needs the grant key "
                f"Secret mounted at {path} (Helm: egress.*)"
            )
            if left <= 0:
                raise _Blocked("Pending", "EgressKeyUnavailable", message) from None
            self.event(body, "Warning", "EgressKeyUnavailable", message)
            return
        meta = body["metadata"]
        expires = int(time.time()) + self.settings.egress_grant_ttl_seconds
        grant = egress_grants.mint_grant(
            key, meta["namespace"], meta["name"], meta["uid"], hosts, expires
        )
        await self.kube.create_or_update_secret(manifests.egress_grant_secret(body, grant))
        setup.grant_expires = expires

    async def _unit_settings(self) -> OperatorSettings:
        """The settings work-unit Jobs are built with: with the egress gateway, the ingest and
        gateway URLs point at their Services' ClusterIPs (the pods cannot resolve names)."""
        if not self.settings.egress_via_gateway:
            return self.settings
        cached = self._unit_settings_cache
        if cached is not None and time.monotonic() - cached[0] < SERVICE_IP_CACHE_SECONDS:
            return cached[1]
        update: dict[str, str] = {}
        for setting in ("ingest_url", "egress_gateway_url", "policy_canary_url"):
            url = getattr(self.settings, setting)
            service = egress_grants.service_of(url) if url else None
            if service is None:
                continue  # unset, an IP already (or a name the pods cannot resolve: documented)
            ip = await self.kube.service_cluster_ip(*service)
            if ip is None:
                raise _Blocked(
                    "Pending",
                    "ServiceNotFound",
                    f"Service {service[0]}/{service[1]} (EVALKUBE_{setting.upper()}={url}) has "
                    "no ClusterIP; work-unit pods have no DNS, so it must exist first",
                )
            update[setting] = egress_grants.with_host(url, ip)
        settings = self.settings.model_copy(update=update)
        self._unit_settings_cache = (time.monotonic(), settings)
        return settings

    async def _create_jobs(
        self,
        body: Mapping[str, Any],
        setup: _Setup,
        decision: Decision,
        unit_settings: OperatorSettings,
    ) -> None:
        """Create the Jobs of ``decision.create``; one ``UnitStarted`` event names those
        created (also when a create failed after some were)."""
        started: list[str] = []
        try:
            for unit in decision.create:
                job = self._unit_job(body, setup, unit, unit_settings)
                if await self._create_job(setup, unit.unit_id, job):
                    started.append(f"{unit.unit_id} ({job['metadata']['name']})")
        finally:
            if started:
                head = f"started {len(started)} unit{'s' if len(started) > 1 else ''}"
                message = list_message(head, started, limits.EVENT_MESSAGE_CHARS)
                self.event(body, "Normal", "UnitStarted", message)

    def _unit_job(
        self, body: Mapping[str, Any], setup: _Setup, unit: Unit, unit_settings: OperatorSettings
    ) -> dict[str, Any]:
        """The Job of ``unit`` (a ``DeadlineCapped`` warning the first time a task's deadline
        is capped)."""
        task = setup.parsed.loaded.task(unit.task_id)
        dataset_ref = task.dataset.config_map_ref
        sources = source_mounts([task])
        timeouts = _task_timeouts(task)
        deadline = manifests.unit_deadline(unit, *timeouts, unit_settings)
        if deadline.capped and unit.task_id not in setup.deadline_warned:
            setup.deadline_warned.add(unit.task_id)
            why = deadline.explain(self.settings)
            capped = f"task {unit.task_id!r}: unit {unit.unit_id}: {why}"
            self.event(body, "Warning", "DeadlineCapped", capped)
        return manifests.unit_job(
            body,
            unit,
            spec=setup.spec,
            settings=unit_settings,
            dataset_config_maps=[(dataset_ref.name, dataset_ref.key)] if dataset_ref else [],
            timeout_seconds=timeouts[0],
            preprocess_timeout=timeouts[1],
            model_access=grader_calls_models(task),
            runner_model_access=judges_call_models(task),
            grader_environment=next((g.environment for _, g in task.grader_programs()), None),
            sources=sources,
            task_id=unit.task_id if sources else None,
        )

    async def _create_job(self, setup: _Setup, unit_id: str, job: Mapping[str, Any]) -> bool:
        """Create the Job of a unit; ``False`` when it existed already. Either way the unit
        counts as having a Job until kopf's index shows it (a pass right after must not create
        it again); a create that failed leaves the unit without one, for the next pass. The
        state it is created in is recorded, so its own ADDED event wakes no pass."""
        meta = job["metadata"]
        key = (meta["namespace"], setup.entry.name, meta["name"])
        state = job_state(job)
        self._job_states[key] = state
        try:
            created = await self.kube.create(job)
        except BaseException:
            self._job_states.pop(key, None)
            raise
        if created:
            self.metrics.jobs_created.inc()
        else:  # not made by this pass: whatever its events show next is news
            self._job_states.pop(key, None)
        setup.unseen[unit_id] = state
        return created

    async def _finish(
        self, body: Mapping[str, Any], new: EvalRunStatus, setup: _Setup, decision: Decision
    ) -> list[Condition]:
        """Every unit is over: aggregate, gate, record and export the run; its conditions."""
        generation = body["metadata"].get("generation")
        run_id, suite_spec = setup.entry.run_id, setup.snapshot.suite.spec
        criteria_of = setup.criteria_of
        expected = expected_metrics(suite_spec, criteria_of)
        declared = declared_metrics(suite_spec, criteria_of)
        # O(units): the units' aggregates merged (None: they missed samples; read them all)
        merged = await asyncio.to_thread(
            run_aggregates, self.store, run_id, setup.units or [], criteria_of
        )
        outcome = await asyncio.to_thread(
            functools.partial(aggregate_results, criteria_of=criteria_of, declared=declared),
            self.store,
            run_id,
            merged,
            expected,
        )
        new.results = outcome
        new.summary = summary_line({f"{r.task}/{r.model}": r.metrics for r in outcome})
        new.completed_at = now_rfc3339()
        if decision.failed:
            failures = (decision.failed, decision.total, body["metadata"]["name"])
            message = failed_units_message(*failures, limits.STATUS_MESSAGE_CHARS)
            conditions = [
                condition(type_, False, "UnitsFailed", message, generation)
                for type_ in ("Ready", "Succeeded")
            ]
            short = failed_units_message(*failures, limits.EVENT_MESSAGE_CHARS)
            self.event(body, "Warning", "RunFailed", short)
        else:
            completed = f"{decision.total} units completed"
            conditions = [
                condition("Ready", True, "Completed", "all units completed", generation),
                condition("Succeeded", True, "Completed", completed, generation),
            ]
            self.event(body, "Normal", "RunSucceeded", f"{completed}; {new.summary}")
            if setup.spec.gate is not None:
                new.gate = await self._gate(setup.spec.gate, setup.entry, outcome)
                message = gate_message(new.gate)
                reason = "GatePassed" if new.gate.passed else "GateFailed"
                # the Passed condition is what Argo CD's health check reads
                conditions.append(condition("Passed", new.gate.passed, reason, message, generation))
                if not new.gate.passed:
                    self.event(body, "Warning", "GateFailed", message)
        wire = [r.to_wire() for r in outcome]
        await asyncio.to_thread(self.store.finish_run, run_id, decision.phase, {"results": wire})
        # every unit is over: its samples hold the answers pods kept for a retried Job
        await asyncio.to_thread(self.store.forget_answers, run_id)
        infos = await asyncio.to_thread(self.store.done_unit_infos, run_id)
        self._export_metrics(setup.entry, outcome, budget_refusals(infos.values()), declared)
        conditions += self.tracking.finished(body, setup.spec, new, run_id, setup.entry.suite)
        return conditions

    async def _gate(
        self, gate: GateSpec, entry: RunEntry, results: list[TaskModelResult]
    ) -> GateStatus:
        """The gate of a run that succeeded: a named baseline is an EvalRun of the same
        namespace; ``lastSucceeded`` the latest earlier Succeeded run of the suite there."""
        namespace, suite = entry.namespace, entry.suite
        baseline_id, problem = None, None
        if gate.baseline is not None and gate.baseline.run is not None:
            other = await self.kube.run(namespace, gate.baseline.run)
            if other is None:
                problem = f"baseline EvalRun {namespace}/{gate.baseline.run} not found"
            else:
                baseline_id = names.run_id(namespace, gate.baseline.run, other["metadata"]["uid"])
        status = await asyncio.to_thread(
            gate_run,
            self.store,
            gate,
            entry.run_id,
            results,
            suite=suite,
            baseline_id=baseline_id,
            baseline_problem=problem,
            id_prefix=f"{namespace}.",
        )
        previous = self._gated_runs.get((namespace, suite), entry.name)
        if previous != entry.name:
            # one series per suite: an alert on an old failed run must clear when a newer passes
            self.metrics.gate_passed.remove(namespace, suite, previous)
        self._gated_runs[(namespace, suite)] = entry.name
        self.metrics.gate_passed.labels(namespace, suite, entry.name).set(1 if status.passed else 0)
        for check in status.checks:
            if check.kind == "baseline" and check.metric and check.value is not None:
                self.metrics.baseline_delta.labels(
                    namespace, suite, check.task, check.model, check.metric
                ).set(check.value)
        return status

    def _export_metrics(
        self,
        entry: RunEntry,
        results: list[TaskModelResult],
        refused: Mapping[str, int],
        declared: Mapping[str, Sequence[str]],
    ) -> None:
        """The run's Prometheus series: scores of the declared metrics only (a grader's other
        score names cannot create series), sample counts, model calls, budget refusals."""
        namespace, suite = entry.namespace, entry.suite
        for scope, count in refused.items():
            self.metrics.budget_refusals.labels(namespace, suite, scope).inc(count)
        for result in results:
            exported = set(declared.get(result.task, ()))
            for metric, value in result.metrics.items():
                if metric not in exported:
                    continue
                self.metrics.score.labels(namespace, suite, result.task, result.model, metric).set(
                    value
                )
            for status_name in ("valid", "invalid", "errored"):
                if amount := getattr(result.counts, status_name):
                    self.metrics.samples.labels(namespace, suite, status_name).inc(amount)
            for purpose, count in result.model_calls.items():
                self.metrics.model_calls.labels(namespace, suite, purpose).inc(count)


def retry_wait(pending: bool, failures: int, retry: float, reconcile: float) -> float:
    """Seconds a run's daemon waits for an event before its next pass: ``retry`` while the
    run is blocked ``Pending``; after ``failures`` failed passes in a row, ``retry`` doubled
    with each but the first, at most ``reconcile`` (a pass cut short in a burst, say by a
    timeout, is not left for a whole ``reconcile``); ``reconcile`` otherwise."""
    if failures:
        return float(min(retry * 2 ** min(failures - 1, 16), reconcile))
    return retry if pending else reconcile


def _capped(sink: EventSink) -> EventSink:
    """``sink`` with every message capped at :data:`~evalkube.limits.EVENT_MESSAGE_CHARS`."""

    def post(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        sink(body, kind, reason, cap_message(message, limits.EVENT_MESSAGE_CHARS))

    return post


class _Blocked(Exception):
    """The run cannot proceed now (``Pending``) or at all (``Failed``)."""

    def __init__(self, phase: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.phase, self.reason, self.message = phase, reason, message


def source_mounts(tasks: Iterable[TaskSpec]) -> manifests.SourceMounts:
    """What reading the ``uri`` sources of ``tasks`` takes: their claims, and whether any is
    an object store or https:// host."""
    claims: set[str] = set()
    remote = False
    for task in tasks:
        specs = [task.dataset, task.outputs]
        for uri, fmt in ((s.uri, s.format) for s in specs if s is not None and s.uri):
            source = parse_uri(uri, f"tasks[{task.id}]", base_dir=None, fmt=fmt)
            if source.scheme == "pvc":
                claims.add(source.claim_path[0])
            else:
                remote = True
    return manifests.SourceMounts(tuple(sorted(claims)), remote)


def snapshot_not_ours(body: Mapping[str, Any], text: str) -> str | None:
    """Why the run's snapshot ConfigMap is not the one the operator wrote, if it is not.

    Its name is predictable and tenants create ConfigMaps: one made before the run (or
    deleted and made again) would choose the run's graders, tasks and images past every
    check of the suite. The operator records the snapshot's SHA-256 in the run's status
    before creating it. A run without one was either started by an older operator (it has a
    phase, and its snapshot names the run's uid) or never had a snapshot made for it.
    """
    status = read_status(EvalRunStatus, body.get("status"))
    name = names.snapshot_name(body["metadata"]["name"])
    redo = "Delete it and the EvalRun, and create the EvalRun again"
    if status.snapshot_sha256 is not None:
        if digest(text) == status.snapshot_sha256:
            return None
        return (
            f"ConfigMap {name} is not the snapshot the operator wrote for this run (its "
            f"SHA-256 differs from status.snapshotSha256): someone else made or replaced it. "
            + redo
        )
    try:
        uid = RunSnapshot.model_validate_json(text).run.uid
    except ValueError:
        uid = None
    if status.phase != "Pending" and uid == body["metadata"]["uid"]:
        return None  # started by an operator that did not record digests yet
    return f"ConfigMap {name} existed before the operator made this run's snapshot. " + redo


def snapshot_too_large(snapshot: RunSnapshot, size: int) -> str:
    """Why a snapshot does not fit a ConfigMap, what takes the room, and what to do."""
    parts: list[tuple[int, str]] = []
    for task in snapshot.suite.spec.tasks:
        if task.dataset.rows is not None:
            rows = len(jsonfast.dumps(task.dataset.rows))
            parts.append((rows, f"task {task.id!r} inline dataset.rows: {rows:,} bytes"))
    for key, (source, _filename) in snapshot.sources.items():
        parts.append((len(source.encode()), f"{key} source: {len(source.encode()):,} bytes"))
    largest = "; ".join(text for _, text in sorted(parts, reverse=True)[:3])
    return (
        f"the run's snapshot is {size:,} bytes, more than a ConfigMap holds "
        f"({limits.SNAPSHOT_CONFIGMAP_BYTES:,} bytes); the largest parts: {largest or 'none'}. "
        "Move large datasets out of the suite: to an object store or a volume (dataset.uri: "
        "s3://, pvc://, https:// with sha256) or a ConfigMap of their own "
        "(dataset.configMapRef), then apply a new EvalRun"
    )


def _task_timeouts(task: TaskSpec) -> tuple[int, int]:
    """Seconds one row of ``task`` may take at most: its graders' and its preprocessor's."""
    return (
        sum(g.timeout_seconds for g in task.criteria),
        task.preprocess.timeout_seconds if task.preprocess else 0,
    )


def explain_failures(
    failed: Mapping[str, str],
    units: Sequence[Unit],
    suite: EvalSuiteSpec,
    settings: OperatorSettings,
) -> dict[str, str]:
    """Failure reasons with what a Job's deadline was made of for units that ran out of it
    (``DeadlineExceeded``), so the reason says which of ``shardSize`` and ``timeoutSeconds``
    to change."""
    if not any(why.startswith("DeadlineExceeded") for why in failed.values()):
        return dict(failed)
    by_id = {unit.unit_id: unit for unit in units}
    tasks = {task.id: task for task in suite.tasks}
    out = {}
    for unit_id, why in failed.items():
        unit = by_id.get(unit_id)
        if why.startswith("DeadlineExceeded") and unit is not None and unit.task_id in tasks:
            deadline = manifests.unit_deadline(unit, *_task_timeouts(tasks[unit.task_id]), settings)
            why = f"{why} ({deadline.explain(settings)})"
        out[unit_id] = why
    return out


def _pin_shard_size(snapshot: RunSnapshot, settings: OperatorSettings) -> RunSnapshot:
    """The snapshot with the run's shard size resolved: its own ``shardSize``, else the
    operator's ``EVALKUBE_SHARD_SIZE``. Resolved once, into the snapshot, so the operator's plan
    and every pod's (both :func:`~evalkube.engine.driver.plan_run` of the snapshot) stay the
    same whatever the operator's setting becomes later."""
    if snapshot.run_spec.shard_size is not None:
        return snapshot
    run_spec = snapshot.run_spec.model_copy(update={"shard_size": settings.shard_size})
    return snapshot.model_copy(update={"run_spec": run_spec})


def _record_run(store: ResultStore, record: RunRecord) -> bool:
    """Put the run into the store unless it is there; whether this call put it there."""
    if store.get_run(record.run_id) is not None:
        return False
    try:
        store.create_run(record)
    except Exception:  # another replica or an earlier pass created it
        if store.get_run(record.run_id) is None:
            raise
        return False
    return True


def _spec_entry(body: Mapping[str, Any], token_digest: str) -> RunEntry:
    """The registry entry of a run read back from the cluster, with the suite its spec names."""
    meta = body["metadata"]
    suite = ((body.get("spec") or {}).get("suiteRef") or {}).get("name", "")
    run_id = names.run_id(meta["namespace"], meta["name"], meta["uid"])
    return RunEntry(meta["namespace"], meta["name"], run_id, suite, token_digest)


def budget_refusals(unit_infos: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Model calls the run's Pods' proxies refused, by scope, summed over what each unit's
    runner reported (a report without them, or with a malformed entry, adds nothing)."""
    total: dict[str, int] = {}
    for info in unit_infos:
        refused = info.get("budgetRefused")
        if not isinstance(refused, Mapping):
            continue
        for scope, count in refused.items():
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                total[str(scope)] = total.get(str(scope), 0) + count
    return total
