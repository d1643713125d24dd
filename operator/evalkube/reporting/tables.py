"""The scores table of a run, as ``evalkube run`` and ``evalkube submit`` print it: one row
per task x model with every metric and the sample counts, from a local run's summary or an
EvalRun's ``status.results`` alike."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from evalkube.models import TaskModelResult


def results_table(title: str, results: Sequence[TaskModelResult]) -> Table:
    """Metrics (4 decimals), counts (invalid in yellow, errored in red), a batch grader's
    error, and passed/failed per criterion when any task has a ``passThreshold``."""
    table = Table(title=title, title_justify="left")
    table.add_column("task", overflow="fold")
    table.add_column("model", overflow="fold")
    table.add_column("metrics", overflow="fold")
    for column in ("samples", "valid", "invalid", "errored"):
        table.add_column(column, justify="right", min_width=len(column), no_wrap=True)
    with_criteria = any(result.criteria for result in results)
    if with_criteria:
        table.add_column("passed/failed", overflow="fold")
    for result in results:
        metrics = (
            "\n".join(f"{escape(name)} = {value:.4f}" for name, value in result.metrics.items())
            or "-"
        )
        if result.error:
            metrics += f"\n[red]batch failed: {escape(result.error)}[/]"
        counts = result.counts
        cells = [
            escape(result.task),
            escape(result.model),
            metrics,
            str(counts.samples),
            str(counts.valid),
            f"[yellow]{counts.invalid}[/]" if counts.invalid else "0",
            f"[red]{counts.errored}[/]" if counts.errored else "0",
        ]
        if with_criteria:
            passed = (
                f"{escape(name)}: {c.passed}/{c.failed}" for name, c in result.criteria.items()
            )
            cells.append("\n".join(passed) or "-")
        table.add_row(*cells)
    return table
