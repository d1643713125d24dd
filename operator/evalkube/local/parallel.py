"""Shard units on several processes, so that a local run uses every core.

A unit's runner is Python under one GIL: one process grades at most about 35k exact-match
samples/s however many cores the machine has. With ``workers > 1`` the local engine forks
that many unit processes. Each takes shard units from a queue and runs them exactly as the
sequential engine does (:func:`~evalkube.engine.runner.run_shard`, one sandbox per task and
one sample writer per process, samples into the same store); the parent only hands out
units, draws progress and merges the aggregates of finished units.

A unit counts as done when its process has committed its samples and marked it done (on
that process's writer thread, behind the samples). Ctrl-C reaches every process of the
foreground group: each closes its sandboxes and commits what it graded, the parent waits
for them and the run can be resumed. The first failing unit stops the others after their
current unit; its error is raised in the parent with the same type as in a sequential run.

Fork, not spawn: the children inherit the loaded suite, compiled templates, the backend
and the store's engine (whose pooled connections they drop, as SQLAlchemy asks after a
fork) instead of re-importing and re-loading everything.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from types import FrameType
from typing import Any

from evalkube.engine.candidates import ignore_repeated_interrupts
from evalkube.engine.guard import RunAborted
from evalkube.engine.loading import shard_rows
from evalkube.engine.plan import Unit
from evalkube.engine.session import UnitSession
from evalkube.engine.unit_context import NoProgress, Progress, UnitFailed
from evalkube.grading import TaskAggregate
from evalkube.models.errors import ConfigError
from evalkube.sandbox import SandboxError
from evalkube.store import ResultStore, StoreError
from evalkube.util.process import signal_on_parent_death

#: Below this many samples per extra process, forking and one more sandbox cold start per
#: task (about 0.3 s under gVisor, the time of grading some 10k samples) cost more than the
#: second core gains: ``auto`` stays sequential.
MIN_SAMPLES_PER_WORKER = 10_000
#: Seconds the parent waits for an interrupted child to clean up before killing it.
CHILD_EXIT_SECONDS = 60.0

#: Errors a unit process reports by kind and the parent raises again, as a sequential run
#: would have raised them.
_ERRORS: tuple[tuple[str, type[Exception]], ...] = (
    ("unit", UnitFailed),
    ("config", ConfigError),
    ("sandbox", SandboxError),
    ("store", StoreError),
    ("aborted", RunAborted),
)


@dataclass
class ParallelRun:
    """What the unit processes share (inherited through fork, never pickled)."""

    session: Callable[..., UnitSession]
    """Opens the run's :class:`UnitSession` in a unit process (given its ``progress``)."""
    run_id: str
    store: ResultStore
    units: list[Unit]
    live: bool
    """Count per-unit aggregates for the parent to merge (a fresh run without grade_batch)."""


def choose_workers(requested: int | None, pending_samples: int, shard_units: int) -> int:
    """How many unit processes to use (``None``: as many as pay off on this machine)."""
    if requested is not None:
        return max(1, min(requested, shard_units))
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, shard_units, pending_samples // MIN_SAMPLES_PER_WORKER))


class _EventProgress(NoProgress):
    """The child's :class:`Progress`: forwards unit events to the parent (the run's planner)."""

    def __init__(self, events: Any) -> None:
        self.events = events

    def unit_started(self, unit: Unit, total: int) -> None:
        self.events.put(("unit_started", unit.unit_id, total))

    def advance(self, unit: Unit, samples: int) -> None:
        self.events.put(("advance", unit.unit_id, samples))

    def generated(self, unit: Unit, answers: int) -> None:
        self.events.put(("generated", unit.unit_id, answers))


def _interrupt_once(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C in a unit process: the first one stops it; the copies that follow (the
    terminal's and the parent's forwarded one) must not interrupt its cleanup."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _child(job: ParallelRun, jobs: Any, events: Any, stop: Event, parent: int) -> None:
    """A unit process: run shard units from ``jobs`` until the sentinel or ``stop``."""
    signal.signal(signal.SIGINT, _interrupt_once)
    ignore_repeated_interrupts()
    # A parent killed outright (kill -9) leaves no one to hand out units: behave as on
    # Ctrl-C (commit what was graded, close the sandboxes) instead of grading on alone.
    if not signal_on_parent_death(signal.SIGINT, parent):
        return
    job.store.engine.dispose(close=False)  # the parent's pooled connections are not ours
    try:  # only suites without model access run in parallel: no bridge
        with job.session(progress=_EventProgress(events)) as session:
            writer = session.writer
            assert writer is not None
            try:
                while not stop.is_set():
                    index = jobs.get()
                    if index is None:
                        break
                    unit = job.units[index]
                    task = session.runtimes[unit.task_id].task
                    live: dict[tuple[str, str], TaskAggregate] = {}
                    rows = shard_rows(session.loaded, task, unit.start, unit.stop)
                    session.drive_unit(unit, rows, live if job.live else None)
                    writer.then(functools.partial(_unit_done, job, unit, live, events))
                writer.flush()
            except KeyboardInterrupt:
                events.put(("interrupted",))
            except BaseException as exc:  # reported to the parent, which raises it
                events.put(("failed", _kind(exc), str(exc)))
    except BaseException as exc:  # closing the session failed: reported too
        events.put(("failed", _kind(exc), str(exc)))
    finally:
        events.put(("exit",))


def _unit_done(
    job: ParallelRun, unit: Unit, live: dict[tuple[str, str], TaskAggregate], events: Any
) -> None:
    """On the writer thread, once the unit's samples are committed."""
    job.store.mark_unit_done(job.run_id, unit.unit_id)
    events.put(("done", unit.unit_id, live))


def _kind(exc: BaseException) -> str:
    return next((kind for kind, error in _ERRORS if isinstance(exc, error)), "other")


def run_parallel(
    job: ParallelRun, indexes: list[int], workers: int, progress: Progress
) -> dict[tuple[str, str], TaskAggregate]:
    """Run the shard units at ``indexes`` on ``workers`` processes; merged live aggregates."""
    context = multiprocessing.get_context("fork")
    jobs = context.Queue()
    events = context.Queue()
    stop = context.Event()
    for index in itertools.chain(indexes, [None] * workers):
        jobs.put(index)
    by_id = {unit.unit_id: unit for unit in job.units}
    children = [
        context.Process(
            target=_child, args=(job, jobs, events, stop, os.getpid()), name=f"evalkube-unit-{n}"
        )
        for n in range(workers)
    ]
    sys.stdout.flush()  # or each child would print what the parent had buffered again
    sys.stderr.flush()
    for child in children:
        child.start()
    merged: dict[tuple[str, str], TaskAggregate] = {}
    failure: tuple[str, str] | None = None
    interrupted = False

    def handle(event: Any) -> int:
        """Apply one event; 1 when a child exited."""
        nonlocal failure, interrupted
        kind = event[0]
        if kind in ("unit_started", "advance", "generated"):  # the child's Progress call
            getattr(progress, kind)(by_id[event[1]], event[2])
        elif kind == "done":
            for key, aggregate in event[2].items():
                merged.setdefault(key, TaskAggregate()).merge(aggregate)
        elif kind == "failed":
            failure = failure or (event[1], event[2])
            stop.set()
        elif kind == "interrupted":
            interrupted = True
            stop.set()
        return 1 if kind == "exit" else 0

    exited = 0
    try:
        while exited < workers:
            try:
                exited += handle(events.get(timeout=1.0))
            except queue.Empty:
                if not any(child.is_alive() for child in children):
                    break  # died without saying so (killed): nothing more will come
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        for child in children:  # Ctrl-C in a terminal reached them too; a kill did not
            with contextlib.suppress(ProcessLookupError):
                if child.pid is not None:
                    os.kill(child.pid, signal.SIGINT)
    finally:
        # Keep reading while the children clean up: a child exits only once what it put
        # on the queue has been taken.
        deadline = time.monotonic() + CHILD_EXIT_SECONDS
        while (alive := [c for c in children if c.is_alive()]) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                while True:
                    handle(events.get_nowait())
            # woken by an exit at once (a child that said "exit" is gone in milliseconds;
            # a blocking read of the queue kept the run waiting 0.2 s for it)
            multiprocessing.connection.wait([c.sentinel for c in alive], timeout=0.05)
        for child in children:
            if child.is_alive():
                child.kill()
            child.join()
    if interrupted:
        raise KeyboardInterrupt
    if failure is not None:
        kind, message = failure
        raise dict(_ERRORS).get(kind, RuntimeError)(message)
    if any(child.exitcode for child in children):
        codes = ", ".join(str(child.exitcode) for child in children)
        raise SandboxError(f"a unit process died (exit codes {codes}); resume the run")
    return merged
