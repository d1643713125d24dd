"""The embedded default: run a whole suite on this machine, unit by unit, into the store.

Creates (or resumes) a run record, plans units, runs each shard and aggregate unit through
the same :mod:`evalkube.engine.runner` a work-unit pod uses, then aggregates per task x
model from the store. Interrupted runs keep every recorded sample; ``resume`` skips done
units and already-recorded samples.
"""

from __future__ import annotations

import functools
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import groupby, islice
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from evalkube import limits
from evalkube.engine.driver import has_model_access, plan_run
from evalkube.engine.loading import (
    LoadedSuite,
    count_dataset_rows,
    iter_dataset,
    load_files,
    suite_version,
)
from evalkube.engine.runtime import TaskRuntime, suite_criteria
from evalkube.engine.session import UnitSession
from evalkube.engine.unit_context import BridgeControl, NoProgress, Progress, UnitFailed
from evalkube.engine.validate import check_programs
from evalkube.grading import TaskAggregate
from evalkube.grading.run_results import aggregate_results, declared_metrics, expected_metrics
from evalkube.local.parallel import ParallelRun, choose_workers, run_parallel
from evalkube.local.preflight import pays, preflight
from evalkube.models import EvalRunSpec, EvalSuite, ObjectMeta, TaskModelResult
from evalkube.models.errors import ConfigError
from evalkube.models.snapshot import RunSnapshot, SnapshotLocal, SnapshotRun, SnapshotSuite
from evalkube.sandbox import SandboxBackend
from evalkube.sources import SourceAccess, SourcePin, check_pinned
from evalkube.store import ResultStore, RunRecord
from evalkube.util.gctune import relaxed_gc


@dataclass
class RunSummary:
    """What ``evalkube run`` prints and writes with ``--output``."""

    run_id: str
    suite: str
    suite_version: str
    sandbox: str
    phase: str
    results: list[TaskModelResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    reloads: list[dict[str, str]] = field(default_factory=list)
    """Suite versions taken from disk by ``--resume --reload``: ``{"from", "to", "at"}``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "suite": self.suite,
            "suite_version": self.suite_version,
            "sandbox": self.sandbox,
            "phase": self.phase,
            "seconds": round(self.seconds, 3),
            "problems": self.problems,
            **({"reloads": self.reloads} if self.reloads else {}),
            "results": [
                {
                    "task": r.task,
                    "model": r.model,
                    "metrics": r.metrics,
                    "counts": r.counts.model_dump(),
                    **(
                        {"criteria": {k: v.model_dump() for k, v in r.criteria.items()}}
                        if r.criteria
                        else {}
                    ),
                    "model_calls": r.model_calls,
                    **({"error": r.error} if r.error else {}),
                }
                for r in self.results
            ],
        }


class ModelAccess(BridgeControl, Protocol):
    """The model bridge a run's graders reach through ``ctx``, closed when the run ends."""

    def close(self) -> None: ...


BridgeFactory = Callable[[EvalRunSpec], ModelAccess]


class LocalEngine:
    """Runs suites in this process, grading in sandboxes of ``backend``."""

    def __init__(
        self,
        store: ResultStore,
        backend: SandboxBackend,
        *,
        progress: Progress | None = None,
        bridge_factory: BridgeFactory | None = None,
        workers: int | None = 1,
        max_error_rate: float | None = limits.MAX_ERROR_RATE_DEFAULT,
    ) -> None:
        self.store = store
        self.backend = backend
        self.progress = progress or NoProgress()
        self.bridge_factory = bridge_factory
        #: Unit processes for shard units (``None``: as many as pay off, see
        #: :func:`evalkube.local.parallel.choose_workers`).
        self.workers = workers
        #: How many the last run used.
        self.last_workers = 1
        #: A task x model whose calls or samples fail at this rate stops the run
        #: (:class:`~evalkube.engine.guard.ErrorGuard`); ``None``: never.
        self.max_error_rate = max_error_rate
        #: The run being started or resumed (set before anything can fail).
        self.run_id: str | None = None
        #: Suite versions taken from disk by the last ``resume(..., reload=True)``.
        self.reloads: list[dict[str, str]] = []

    def start(
        self,
        loaded: LoadedSuite,
        spec: EvalRunSpec,
        run_id: str | None = None,
        *,
        probe: bool = False,
    ) -> RunSummary:
        """Start a new run of ``loaded`` with ``spec``; a run that calls models is checked
        first (:func:`~evalkube.local.preflight.preflight`, ``probe``: one call per
        provider), and nothing is recorded when a check fails."""
        check_programs(loaded)
        for task in loaded.suite.spec.tasks:
            TaskRuntime.build(loaded, task)
        if probe or pays(loaded, spec):
            preflight(loaded, spec, self.backend, probe=probe)
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        run_id = self.run_id = run_id or f"{loaded.name}-{stamp}-{secrets.token_hex(3)}"
        snapshot = _snapshot(run_id, loaded, spec).to_wire()
        record = RunRecord(run_id, loaded.name, loaded.version, snapshot, self.backend.describe())
        self.store.create_run(record)
        return self._execute(run_id, loaded, spec, resuming=False)

    def resume(self, run_id: str, *, reload: bool = False) -> RunSummary:
        """Continue an interrupted or failed run from what the store holds: with the copy of
        the suite saved when it started, or (``reload``) with the suite files on disk now,
        recording the change of suite version on the run."""
        record = self.store.get_run(run_id)
        if record is None:
            raise ConfigError(
                f"run {run_id!r} is not in the store {self.store.location}; list its runs with "
                "`evalkube runs` (and --db to read another store)"
            )
        if record.phase == "Succeeded":
            raise ConfigError(f"run {run_id!r} already succeeded; nothing to resume")
        self.run_id = run_id
        saved = _saved_snapshot(record)
        spec = saved.run_spec
        loaded = self._reload(record, saved) if reload else _saved_suite(record, saved)
        self.store.set_run_phase(run_id, "Running", sandbox=self.backend.describe())
        try:
            return self._execute(run_id, loaded, spec, resuming=True)
        except (ConfigError, UnitFailed) as exc:
            if reload:
                raise
            raise type(exc)(
                f"{exc}\n(this is the copy of the suite saved when run {run_id} started, not "
                f"the files on disk; once they are fixed, take them with "
                f"`evalkube run --resume {run_id} --reload`)"
            ) from None

    def _reload(self, record: RunRecord, saved: RunSnapshot) -> LoadedSuite:
        """The run's suite loaded again from its file; the new version recorded on the run."""
        spec = saved.run_spec
        suite_file = saved.local.suite_file if saved.local else None
        if not suite_file:
            raise ConfigError(
                f"run {record.run_id!r} does not name its suite file (started by an older "
                "evalkube); --reload cannot find it: start a new run"
            )
        loaded, _ = load_files(Path(suite_file), None)
        check_programs(loaded)
        for task in loaded.suite.spec.tasks:
            TaskRuntime.build(loaded, task)
        if pays(loaded, spec):
            preflight(loaded, spec, self.backend)
        reloads = list(saved.local.reloads if saved.local else [])
        if loaded.version != record.suite_version:
            at = datetime.now(UTC).isoformat(timespec="seconds")
            reloads.append({"from": record.suite_version, "to": loaded.version, "at": at})
            snapshot = _snapshot(record.run_id, loaded, spec, reloads)
            self.store.update_run_suite(record.run_id, loaded.version, snapshot.to_wire())
        self.reloads = reloads
        return loaded

    def _execute(
        self, run_id: str, loaded: LoadedSuite, spec: EvalRunSpec, *, resuming: bool
    ) -> RunSummary:
        """Run the units; whatever happens the run ends in a terminal phase: ``Succeeded``,
        ``Interrupted`` (Ctrl-C: resume it) or ``Failed`` with the reason (resume it once the
        cause is fixed). Recorded samples are kept in every case."""
        try:
            with relaxed_gc():
                return self._execute_units(run_id, loaded, spec, resuming=resuming)
        except KeyboardInterrupt:
            self._end(run_id, "Interrupted", "interrupted; resume with --resume")
            raise
        except BaseException as exc:
            self._end(run_id, "Failed", f"{type(exc).__name__}: {exc}")
            raise

    def _end(self, run_id: str, phase: str, reason: str) -> None:
        try:
            self.store.finish_run(run_id, phase, {"reason": reason[:2000]})
        except Exception as exc:  # the store itself may be what failed: keep the first error
            print(f"evalkube: could not record the run as {phase}: {exc}", file=sys.stderr)

    def _execute_units(
        self, run_id: str, loaded: LoadedSuite, spec: EvalRunSpec, *, resuming: bool
    ) -> RunSummary:
        started = time.perf_counter()
        runtimes = {task.id: TaskRuntime.build(loaded, task) for task in loaded.suite.spec.tasks}
        row_counts = {task.id: count_dataset_rows(loaded, task) for task in loaded.suite.spec.tasks}
        units = plan_run(loaded.suite.spec, row_counts, spec)
        done = self.store.done_units(run_id) if resuming else set()
        # Aggregates computed while samples stream by: exact when this process graded every
        # sample once (a fresh run without grade_batch updates); otherwise read back.
        live: dict[tuple[str, str], TaskAggregate] = {}
        criteria_of = suite_criteria(loaded.suite.spec)
        use_live = not resuming and not any(unit.kind == "aggregate" for unit in units)
        needs_bridge = any(has_model_access(t) for t in loaded.suite.spec.tasks)
        self.progress.planned([unit for unit in units if unit.unit_id not in done])
        pending = [
            i for i, unit in enumerate(units) if unit.kind == "shard" and unit.unit_id not in done
        ]
        pending_samples = sum(units[i].stop - units[i].start for i in pending)
        workers = 1 if needs_bridge else choose_workers(self.workers, pending_samples, len(pending))
        self.last_workers = workers
        # only runs that pay for model calls stop early; a free one shows every failure
        max_error_rate = self.max_error_rate if pays(loaded, spec) else None
        open_session = functools.partial(
            UnitSession,
            run_id,
            loaded,
            spec,
            self.store,
            self.backend,
            runtimes,
            resuming=resuming,
            max_error_rate=max_error_rate,
        )
        if workers > 1:
            job = ParallelRun(open_session, run_id, self.store, units, use_live)
            live.update(run_parallel(job, pending, workers, self.progress))  # live was empty
            done |= {units[i].unit_id for i in pending}
        bridge = self.bridge_factory(spec) if needs_bridge and self.bridge_factory else None
        close_bridge = bridge.close if bridge is not None else None
        with open_session(
            bridge=bridge, close_bridge=close_bridge, progress=self.progress
        ) as session:
            writer = session.writer
            assert writer is not None
            # units come task by task, model by model (plan_run)
            for (task_id, _), group in groupby(units, key=lambda u: (u.task_id, u.model)):
                rows: Iterator[dict[str, Any]] = iter(())
                position = -1
                for unit in group:
                    if unit.unit_id in done:
                        continue
                    if unit.kind == "aggregate":
                        session.drive_unit(unit, None)
                        self.store.mark_unit_done(run_id, unit.unit_id)
                        continue
                    if position != unit.start:  # a shard after skipped ones: seek
                        rows = iter_dataset(loaded, runtimes[task_id].task, skip=unit.start)
                    shard = list(islice(rows, unit.stop - unit.start))
                    position = unit.start + len(shard)
                    session.drive_unit(unit, shard, live if use_live else None)
                    writer.then(functools.partial(self.store.mark_unit_done, run_id, unit.unit_id))
            writer.flush()
        results = aggregate_results(
            self.store,
            run_id,
            live if use_live else None,
            expected_metrics(loaded.suite.spec, criteria_of),
            criteria_of=criteria_of,
            declared=declared_metrics(loaded.suite.spec, criteria_of),
        )
        pairs = [(t.id, m) for t in loaded.suite.spec.tasks for m in spec.models]
        order = {pair: i for i, pair in enumerate(pairs)}
        results.sort(key=lambda r: order.get((r.task, r.model), len(order)))
        summary = RunSummary(
            run_id,
            loaded.name,
            loaded.version,
            self.backend.describe(),
            "Succeeded",
            results,
            [
                f"task {r.task_id!r} · {r.model}: {p}"
                for r in self.store.task_results(run_id)
                for p in r.problems
            ],
            time.perf_counter() - started,
            list(self.reloads) if resuming else [],
        )
        self.store.forget_answers(run_id)  # its samples hold every answer now
        self.store.finish_run(run_id, summary.phase, summary.to_json())
        return summary


def _snapshot(
    run_id: str,
    loaded: LoadedSuite,
    spec: EvalRunSpec,
    reloads: list[dict[str, str]] | None = None,
) -> RunSnapshot:
    """What a run keeps of its suite and spec, so that ``--resume`` runs the same code."""
    return RunSnapshot(
        run=SnapshotRun(run_id=run_id),
        suite=SnapshotSuite(name=loaded.name, spec=loaded.suite.spec, version=loaded.version),
        run_spec=spec,
        sources={f"{t}/{k}": v for (t, k), v in loaded.sources.items()},
        local=SnapshotLocal(
            base_dir=str(loaded.base_dir),
            suite_file=str(loaded.suite_file) if loaded.suite_file else None,
            # the objects its uri sources named, as pinned: --resume reads these bytes or fails
            pins={key: pin.model_dump(mode="json") for key, pin in loaded.pins.items()},
            reloads=reloads or [],
        ),
    )


def _saved_snapshot(record: RunRecord) -> RunSnapshot:
    """The run's stored snapshot, or a clear error where it is not one ``--resume`` can use."""
    try:
        saved = RunSnapshot.model_validate(record.spec)
    except ValidationError as exc:
        raise ConfigError(
            f"run {record.run_id!r}: its stored snapshot does not parse ({exc.error_count()} "
            f"problems, first: {exc.errors()[0]['msg']}); start a new run"
        ) from None
    if saved.local is None:
        raise ConfigError(
            f"run {record.run_id!r} ran in a cluster (EvalRun {saved.run.namespace}/"
            f"{saved.run.name}); resume it there, not with `evalkube run --resume`"
        )
    return saved


def _saved_suite(record: RunRecord, saved: RunSnapshot) -> LoadedSuite:
    """The suite as saved when the run started (its datasets are read from disk)."""
    assert saved.local is not None
    suite = EvalSuite(metadata=ObjectMeta(name=saved.suite.name), spec=saved.suite.spec)
    loaded = LoadedSuite(suite, Path(saved.local.base_dir))
    for key, source in saved.sources.items():
        task_id, kind = key.split("/", 1)
        loaded.sources[(task_id, kind)] = source
    storage = saved.run_spec.storage
    loaded.access = SourceAccess(s3=storage.s3 if storage else None)
    loaded.pins = {k: SourcePin.model_validate(v) for k, v in saved.local.pins.items()}
    loaded.saved_run = record.run_id
    for key, pin in loaded.pins.items():
        check_pinned(pin, loaded.access, f"tasks[{key.replace('/', '].', 1)}.uri")
    loaded.version = suite_version(loaded)
    if loaded.version != record.suite_version:
        raise ConfigError(
            f"run {record.run_id!r}: its dataset or output files changed since it started "
            f"({record.suite_version[:19]} -> {loaded.version[:19]}); take the files on disk "
            f"with `evalkube run --resume {record.run_id} --reload`, or start a new run"
        )
    return loaded
