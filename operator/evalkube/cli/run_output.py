"""What ``evalkube run`` shows as it goes: a progress bar per task x model, each distinct
failure of the model bridge once, and the results table at the end."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from evalkube.engine import Unit
from evalkube.local import RunSummary
from evalkube.reporting.console import errors
from evalkube.reporting.tables import results_table


class _OncePerCause(logging.Handler):
    """Shows each distinct failure of the model bridge once, then counts its repeats.

    Graders call models once per sample: a key the provider rejects or a missing endpoint
    would otherwise print one stderr line per sample. The message without its execution id
    is the cause; :meth:`summary` says how many more calls failed that way.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        cause = re.sub(r"\(execution [^,]*, ", "(", record.getMessage())
        self.counts[cause] = self.counts.get(cause, 0) + 1
        if self.counts[cause] == 1:
            errors.print(f"[yellow]warning:[/] {escape(cause)}", highlight=False, soft_wrap=True)

    def summary(self) -> None:
        for cause, count in self.counts.items():
            if count > 1:
                errors.print(
                    f"[yellow]warning:[/] {count - 1} more model calls failed the same way: "
                    f"{escape(cause)}",
                    highlight=False,
                    soft_wrap=True,
                )


@contextlib.contextmanager
def bridge_failures_once() -> Iterator[None]:
    """While a local run goes, its bridge's failures are shown once per cause."""
    logger = logging.getLogger("evalkube.proxy")
    handler = _OncePerCause()
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        handler.summary()


def _generates(unit: Unit) -> bool:
    return unit.kind == "shard" and unit.model.split(":", 1)[0] not in ("precomputed", "local")


class RichProgress:
    """Draws bars per task x model from the engine's unit events: one counting model answers
    as they arrive (generated candidates), one counting graded and recorded samples."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.bars: dict[tuple[str, str, str], Any] = {}
        #: Samples each unit was expected to have, until it says how many it has.
        self.expected: dict[str, int] = {}

    def _bar(self, unit: Unit, stage: str = "") -> Any:
        stage = stage or ("grade" if _generates(unit) else unit.kind)
        key = (unit.task_id, unit.model, stage)
        if key not in self.bars:
            suffix = {"aggregate": " · grade_batch", "shard": ""}.get(stage, f" · {stage}")
            label = f"{unit.task_id} · {unit.model}{suffix}"
            self.bars[key] = self.progress.add_task(label, total=0)
        return self.bars[key]

    def _grow(self, unit: Unit, by: int) -> None:
        """Grow the unit's bars by ``by`` samples: its generate bar (first) and its own."""
        for bar in ([self._bar(unit, "generate")] if _generates(unit) else []) + [self._bar(unit)]:
            self.progress.update(bar, total=(self.progress.tasks[bar].total or 0) + by)

    def planned(self, units: Sequence[Unit]) -> None:
        """Size every bar up front (units run in parallel would otherwise grow it)."""
        for unit in units:
            self.expected[unit.unit_id] = rows = unit.stop - unit.start
            self._grow(unit, rows)

    def unit_started(self, unit: Unit, total: int) -> None:
        self._grow(unit, total - self.expected.pop(unit.unit_id, 0))

    def advance(self, unit: Unit, samples: int) -> None:
        self.progress.advance(self._bar(unit), samples)

    def generated(self, unit: Unit, answers: int) -> None:
        self.progress.advance(self._bar(unit, "generate"), answers)


def run_table(summary: RunSummary) -> Table:
    return results_table(f"{summary.suite} · run {summary.run_id}", summary.results)
