"""Run one unit inside a work-unit pod (``evalkube unit``): the runner container's job.

Reads the run's snapshot (a ConfigMap volume), plans the same units the operator planned
(both call :meth:`Snapshot.units`, i.e. :func:`~evalkube.engine.driver.plan_run`), drives the
requested unit with the same driver as ``evalkube run`` (which owns model access: budgets and
execution tokens on the proxy sidecar through its control socket), grading in the grader
container (through its socket) and recording through the operator's ingest API, then reports
the unit done. Exit code 0 only when every sample is stored.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalkube import limits
from evalkube.engine.answers import AnswerLog
from evalkube.engine.candidates import candidate_source
from evalkube.engine.driver import BridgeControl, drive_unit, plan_run
from evalkube.engine.loading import LoadedSuite
from evalkube.engine.plan import Unit
from evalkube.engine.runner import UnitContext, UnitFailed, UnitReport
from evalkube.engine.runtime import TaskRuntime
from evalkube.gctune import relaxed_gc
from evalkube.models import EvalRunSpec, EvalSuite, ObjectMeta
from evalkube.models.errors import ConfigError
from evalkube.models.snapshot import RunSnapshot
from evalkube.sandbox import SandboxBackend
from evalkube.sources import PVC_ROOT, SourceAccess, SourcePin, identity_digest
from evalkube.store.remote import RemoteStore

#: The unit id the run's prepare pod reports its pins under (``manifests.prepare_job``): never
#: a planned unit's id, which starts with a task id (no ``@`` in those).
PREPARE_UNIT = "@prepare"


@dataclass
class Snapshot:
    """A run's snapshot as the runner loads it."""

    run_id: str
    namespace: str
    name: str
    loaded: LoadedSuite
    spec: EvalRunSpec
    row_counts: dict[str, int | None]
    """Rows per task; ``None`` for a ``uri`` dataset until the run's pins are applied."""

    @property
    def pinned(self) -> bool:
        """Whether every task's row count is known (its ``uri`` sources pinned)."""
        return all(count is not None for count in self.row_counts.values())

    def apply_pins(self, prepared: Prepared) -> None:
        """Take the pins (and row counts) the run's prepare pod reported."""
        self.loaded.pins.update(prepared.pins)
        for task_id, rows in prepared.rows.items():
            if task_id in self.row_counts and self.row_counts[task_id] is None:
                self.row_counts[task_id] = rows

    @property
    def version(self) -> str:
        """The version the run executes: the suite's, and the bytes its pins name."""
        if not self.loaded.pins:
            return self.loaded.version
        pins = [self.loaded.pins[key] for key in sorted(self.loaded.pins)]
        digest = hashlib.sha256(f"{self.loaded.version}\0{identity_digest(pins)}".encode())
        return "sha256:" + digest.hexdigest()

    def units(self) -> list[Unit]:
        """The run's units: the operator creates a Job for each, the runner runs one."""
        unknown = sorted(task for task, count in self.row_counts.items() if count is None)
        if unknown:
            raise ConfigError(
                f"run {self.namespace}/{self.name}: the uri sources of tasks {unknown} are not "
                "pinned yet (the run's prepare pod reports them)"
            )
        counts = {task: count or 0 for task, count in self.row_counts.items()}
        return plan_run(self.loaded.suite.spec, counts, self.spec)

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
    counts: dict[str, int | None] = {}
    for task_id, dataset in doc.datasets.items():
        counts[task_id] = dataset.rows
        if dataset.config_map and dataset.key and datasets_dir is not None:
            loaded.dataset_paths[task_id] = datasets_dir / dataset.config_map / dataset.key
    run = doc.run
    storage = doc.run_spec.storage
    # a pod reads only what the prepare pod pinned, and a local path never
    loaded.access = SourceAccess(s3=storage.s3 if storage else None, pvc_root=PVC_ROOT)
    loaded.local_sources = False
    return Snapshot(run.run_id, run.namespace, run.name, loaded, doc.run_spec, counts)


@dataclass
class Prepared:
    """What the run's prepare pod reported: each task's row count and each source's pin."""

    rows: dict[str, int] = field(default_factory=dict)
    pins: dict[str, SourcePin] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": "prepare",
            "rows": self.rows,
            "pins": {key: pin.model_dump(mode="json") for key, pin in self.pins.items()},
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Prepared:
        """A report read back (raises ``ValueError`` when it is malformed)."""
        rows = data.get("rows")
        pins = data.get("pins")
        if not isinstance(rows, dict) or not isinstance(pins, dict):
            raise ValueError("a prepare report has `rows` and `pins` objects")
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in rows.values()
        ):
            raise ValueError("`rows` maps task ids to row counts")
        try:
            parsed = {str(k): SourcePin.model_validate(v) for k, v in pins.items()}
        except ValidationError as exc:
            raise ValueError(f"malformed pin: {exc.errors()[0]['msg']}") from None
        return cls({str(k): v for k, v in rows.items()}, parsed)

    def for_task(self, task_id: str) -> Prepared:
        """The row counts, and only ``task_id``'s pins (what one unit's pod needs)."""
        mine = {k: p for k, p in self.pins.items() if k.split("/", 1)[0] == task_id}
        return Prepared(dict(self.rows), mine)


def prepare_sources(snapshot: Snapshot) -> dict[str, Any]:
    """The prepare pod's report (``evalkube prepare``): every ``uri`` source of the suite
    pinned, with each task's row count; or the first source that could not be, named."""
    loaded = snapshot.loaded
    prepared = Prepared()
    loaded.prepares = True
    try:
        for task, part in loaded.uri_sources():
            pin = prepared.pins[f"{task.id}/{part}"] = loaded.pin(task, part)
            if part == "dataset":
                prepared.rows[task.id] = pin.rows
    except ConfigError as exc:
        return {"kind": "prepare", "error": str(exc)[: limits.ERROR_MESSAGE_CHARS]}
    return prepared.to_wire()


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
    task_id: str | None = None,
) -> UnitReport:
    """Run ``unit_id`` and report it done to the operator.

    ``bridge``: the proxy sidecar (its control listener), which the driver configures for the
    unit; ``bridge_control``: the same listener's address, for candidate generation;
    ``task_id``: the unit's task, whose source pins it fetches (``None``: every task's).
    """
    if snapshot.loaded.uri_sources():
        # the row counts and this unit's task's pins, as the prepare pod reported them
        snapshot.apply_pins(Prepared.from_wire(store.prepared(task_id)))
    unit = snapshot.unit(unit_id)
    runtime = TaskRuntime.build(snapshot.loaded, snapshot.loaded.task(unit.task_id))
    answers = AnswerLog(store, snapshot.run_id, grader_calls=False)
    ctx = UnitContext(
        run_id=snapshot.run_id,
        runtime=runtime,
        store=store,
        backend=backend,
        source=candidate_source(
            unit.model,
            runtime.task,
            snapshot.spec,
            snapshot.loaded,
            bridge_control,
            (unit.start, unit.stop) if unit.kind == "shard" else None,
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
    except UnitFailed as exc:  # for good: its reason is the unit's, in the run's status
        store.mark_unit_failed(unit.unit_id, str(exc))
        raise
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
