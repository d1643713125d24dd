"""A run's snapshot as both sides read it: the operator to plan a run's units and Jobs, the
work-unit pod's runner to run one of them.

Both parse the one stored document (:class:`~evalkube.models.snapshot.RunSnapshot`) through
:func:`parse_snapshot` and plan with :meth:`Snapshot.units` (that is,
:func:`~evalkube.engine.driver.plan_run`), so the operator's plan and every pod's plan agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalkube.engine.driver import plan_run
from evalkube.engine.loading import LoadedSuite
from evalkube.engine.plan import Unit
from evalkube.models import EvalRunSpec, EvalSuite, ObjectMeta
from evalkube.models.errors import ConfigError
from evalkube.models.snapshot import RunSnapshot
from evalkube.sources import PVC_ROOT, SourceAccess, SourcePin, identity_digest

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
    if run.namespace is None or run.name is None:
        raise ConfigError(
            f"run {run.run_id!r} was started by `evalkube run`, not in a cluster: it has no "
            "EvalRun to plan Jobs for (resume it with `evalkube run --resume`)"
        )
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
