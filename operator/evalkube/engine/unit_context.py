"""What a unit runs with and reports: its run's context, the model bridge it may use, and
the progress it shows."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from evalkube.engine.candidates import CandidateSource
from evalkube.engine.plan import Unit
from evalkube.engine.runtime import TaskRuntime
from evalkube.sandbox import GraderSandbox, SandboxBackend
from evalkube.store import SampleRecord, SampleWriter
from evalkube.store.protocol import SampleStore

if TYPE_CHECKING:
    from evalkube.engine.answers import AnswerLog
    from evalkube.engine.guard import ErrorGuard


class BridgeControl(Protocol):
    """The runner's handle on a model bridge (in-process, child process or pod sidecar)."""

    @property
    def endpoint(self) -> str | None:
        """Where graders reach the bridge (``unix:/path`` or ``http://host:port``)."""

    def configure_unit(
        self, unit_id: str, max_calls_per_execution: int, planned_executions: int
    ) -> None:
        """Serve ``unit_id`` with fresh counters (closing every open execution token)."""

    def open_executions(self, tokens: Iterable[str]) -> None:
        """Let graders call models with ``tokens`` until their usage is taken."""

    def take_usage(self, execution_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Remove and return the usage of ``execution_ids``, closing those tokens."""

    def budget(self) -> dict[str, object]:
        """The served unit's budget, use and refusals by scope (``refused``)."""


def execution_token() -> str:
    """A fresh, unguessable execution token (128 bits): the only id a grader's model calls
    are charged to, so a grader can neither guess nor forge another execution's."""
    return secrets.token_urlsafe(16)


class Progress(Protocol):
    """What a unit reports while it runs (the CLI draws progress bars from it)."""

    def planned(self, units: Sequence[Unit]) -> None:
        """The units a run is about to run (shard units sized by their rows)."""

    def unit_started(self, unit: Unit, total: int) -> None:
        """``unit`` has ``total`` samples to record (its exact size)."""

    def advance(self, unit: Unit, samples: int) -> None:
        """``samples`` more of ``unit`` are graded and recorded."""

    def generated(self, unit: Unit, answers: int) -> None:
        """``answers`` more model answers of ``unit`` arrived (or were kept from before)."""


class NoProgress:
    def planned(self, units: Sequence[Unit]) -> None:
        pass

    def unit_started(self, unit: Unit, total: int) -> None:
        pass

    def advance(self, unit: Unit, samples: int) -> None:
        pass

    def generated(self, unit: Unit, answers: int) -> None:
        pass


@dataclass
class UnitContext:
    """Everything a unit needs from its run."""

    run_id: str
    runtime: TaskRuntime
    store: SampleStore
    backend: SandboxBackend
    source: CandidateSource | None = None
    model_endpoint: str | None = None
    bridge: BridgeControl | None = None
    """The model bridge of a task with model access (set by
    :class:`~evalkube.engine.session.UnitSession`): executions get tokens, samples their usage."""
    progress: Progress = field(default_factory=NoProgress)
    observe: Callable[[list[SampleRecord]], None] | None = None
    """Sees every chunk of records as it is submitted (live aggregates of a local run)."""
    resuming: bool = False
    writer: SampleWriter | None = None
    """A writer that units share (a local run); the unit then only submits its samples and
    whoever marks it done queues that behind them. ``None``: each unit waits for its own."""
    sandbox: GraderSandbox | None = None
    """A started sandbox of this task x model that its shard units share (a local run's
    :class:`TaskModelSandboxes`). ``None``: each shard starts and closes its own."""
    answers: AnswerLog | None = None
    """Keeps every model answer as it arrives and gives kept ones back on resume (a local
    run). ``None``: candidates live only until their sample is recorded."""
    guard: ErrorGuard | None = None
    """Stops the run when a task x model fails past the maximum error rate."""


@dataclass
class UnitReport:
    """What one unit did."""

    unit: Unit
    samples: int = 0
    skipped: int = 0
    restarts: int = 0
    seconds: float = 0.0


class UnitFailed(RuntimeError):
    """A unit could not run at all (its programs do not load); nothing partial is recorded."""


def stage_error(stage: str, kind: str, message: str, traceback: str = "") -> dict[str, Any]:
    return {"stage": stage, "type": kind, "message": message, "traceback": traceback}
