"""Run one unit inside a work-unit pod (``evalkube unit``): the runner container's job.

Reads the run's snapshot (a ConfigMap volume), plans the same units the operator planned
(both call :meth:`Snapshot.units`, i.e. :func:`~evalkube.engine.driver.plan_run`), drives the
requested unit with the same driver as ``evalkube run`` (which owns model access: budgets and
execution tokens on the proxy sidecar through its control socket), grading in the grader
container (through its socket) and recording through the operator's ingest API, then reports
the unit done. Exit code 0 only when every sample is stored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkube.engine.answers import AnswerLog
from evalkube.engine.candidates import candidate_source
from evalkube.engine.driver import BridgeControl, drive_unit, plan_run
from evalkube.engine.loading import LoadedSuite
from evalkube.engine.plan import Unit
from evalkube.engine.runner import UnitContext, UnitReport
from evalkube.engine.runtime import TaskRuntime
from evalkube.gctune import relaxed_gc
from evalkube.models import EvalRunSpec, EvalSuite, ObjectMeta
from evalkube.models.errors import ConfigError
from evalkube.models.snapshot import RunSnapshot
from evalkube.sandbox import SandboxBackend
from evalkube.store.remote import RemoteStore


@dataclass
class Snapshot:
    """A run's snapshot as the runner loads it."""

    run_id: str
    namespace: str
    name: str
    loaded: LoadedSuite
    spec: EvalRunSpec
    row_counts: dict[str, int]

    def units(self) -> list[Unit]:
        """The run's units: the operator creates a Job for each, the runner runs one."""
        return plan_run(self.loaded.suite.spec, self.row_counts, self.spec)

    def unit(self, unit_id: str) -> Unit:
        for unit in self.units():
            if unit.unit_id == unit_id:
                return unit
        raise ConfigError(f"unit {unit_id!r} is not part of run {self.namespace}/{self.name}")


def load_snapshot(path: Path, datasets_dir: Path | None = None) -> Snapshot:
    """Read the snapshot the operator wrote (:class:`~evalkube.models.snapshot.RunSnapshot`)."""
    return parse_snapshot(
        RunSnapshot.model_validate_json(path.read_bytes()), path.parent, datasets_dir
    )


def parse_snapshot(
    doc: RunSnapshot, base_dir: Path = Path("."), datasets_dir: Path | None = None
) -> Snapshot:
    """A :class:`Snapshot` of the run's snapshot document: its suite loaded, datasets located."""
    suite = EvalSuite(metadata=ObjectMeta(name=doc.suite.name), spec=doc.suite.spec)
    loaded = LoadedSuite(suite, base_dir, version=doc.suite.version)
    for key, source in doc.sources.items():
        task_id, kind = key.split("/", 1)
        loaded.sources[(task_id, kind)] = source
    counts: dict[str, int] = {}
    for task_id, dataset in doc.datasets.items():
        counts[task_id] = dataset.rows
        if dataset.config_map and dataset.key and datasets_dir is not None:
            loaded.dataset_paths[task_id] = datasets_dir / dataset.config_map / dataset.key
    run = doc.run
    return Snapshot(run.run_id, run.namespace, run.name, loaded, doc.run_spec, counts)


def rows_of(snapshot: Snapshot, unit: Unit) -> list[dict[str, Any]]:
    """The dataset rows of a shard unit."""
    from evalkube.engine.loading import shard_rows

    task = snapshot.loaded.task(unit.task_id)
    return shard_rows(snapshot.loaded, task, unit.start, unit.stop)


def run_pod_unit(
    snapshot: Snapshot,
    unit_id: str,
    *,
    store: RemoteStore,
    backend: SandboxBackend,
    bridge: BridgeControl | None = None,
    bridge_control: str | None = None,
) -> UnitReport:
    """Run ``unit_id`` and report it done to the operator.

    ``bridge``: the proxy sidecar (its control listener), which the driver configures for the
    unit; ``bridge_control``: the same listener's address, for candidate generation.
    """
    unit = snapshot.unit(unit_id)
    runtime = TaskRuntime.build(snapshot.loaded, snapshot.loaded.task(unit.task_id))
    answers = AnswerLog(store, snapshot.run_id, grader_calls=False)
    ctx = UnitContext(
        run_id=snapshot.run_id,
        runtime=runtime,
        store=store,
        backend=backend,
        source=candidate_source(
            unit.model, runtime.task, snapshot.spec, snapshot.loaded.base_dir, bridge_control
        ),
        resuming=True,  # a retried Job skips what an earlier attempt recorded
        # and takes back the candidates it paid for (and retries failed calls)
        answers=answers,
    )
    started = time.perf_counter()
    try:
        with relaxed_gc():
            rows = rows_of(snapshot, unit) if unit.kind == "shard" else None
            report = drive_unit(ctx, unit, rows, bridge)
    finally:
        answers.close()  # every answer that arrived is kept
    store.mark_unit_done(
        unit.unit_id,
        {
            "kind": unit.kind,
            "samples": report.samples,
            "skipped": report.skipped,
            "restarts": report.restarts,
            "seconds": round(time.perf_counter() - started, 3),
            # the sidecar's refusals (its metrics are never scraped in a Pod)
            "budgetRefused": bridge.budget().get("refused") or {} if bridge is not None else {},
        },
    )
    return report
