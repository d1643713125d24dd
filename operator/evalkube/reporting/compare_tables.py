"""Tables of ``evalkube compare`` (the paired comparison of two runs) and of a run's gate."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from evalkube.grading.compare import MetricDelta
from evalkube.models import GateStatus


def gate_table(gate: GateStatus) -> Table:
    """Every check of the gate, failed ones in red."""
    verdict = "[green]passed[/]" if gate.passed else "[red]FAILED[/]"
    title = f"gate {verdict}" + (f" (baseline {escape(gate.baseline)})" if gate.baseline else "")
    table = Table(title=title, title_justify="left")
    table.add_column("check", overflow="fold")
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("bound", justify="right", no_wrap=True)
    table.add_column("", overflow="fold")
    for check in gate.checks:
        table.add_row(
            escape(check.name),
            "-" if check.value is None else f"{check.value:.4f}",
            "-" if check.threshold is None else f"{check.threshold:g}",
            "[green]ok[/]" if check.passed else f"[red]{escape(check.message)}[/]",
        )
    return table


def comparison_table(baseline: str, run: str, deltas: Sequence[MetricDelta]) -> Table:
    """One row per task x model x metric; red when the drop is beyond the interval."""
    table = Table(title=f"{run} vs baseline {baseline}", title_justify="left")
    table.add_column("task", overflow="fold")
    table.add_column("model", overflow="fold")
    table.add_column("metric", overflow="fold")
    for column in ("shared", "baseline", "run", "change", "CI", "better", "worse"):
        table.add_column(column, justify="right", no_wrap=True)
    for d in deltas:
        change = f"{d.delta:+.4f}"
        if d.significant_drop():
            change = f"[red]{change}[/]"
        elif d.ci_low > 0:
            change = f"[green]{change}[/]"
        table.add_row(
            escape(d.task),
            escape(d.model),
            escape(d.metric),
            str(d.shared),
            f"{d.baseline_mean:.4f}",
            f"{d.mean:.4f}",
            change,
            f"{d.ci_low:+.4f}..{d.ci_high:+.4f}",
            str(d.improved),
            str(d.regressed),
        )
    return table


def flipped_table(deltas: Sequence[MetricDelta], limit: int) -> Table:
    """The samples whose score changed (first ``limit`` per metric)."""
    table = Table(title="samples that changed", title_justify="left")
    for column in ("task", "model", "metric", "sample", "baseline", "run"):
        table.add_column(column, overflow="fold")
    for d in deltas:
        for flip in d.flipped[:limit]:
            table.add_row(
                escape(d.task),
                escape(d.model),
                escape(d.metric),
                escape(str(flip["key"])),
                f"{flip['baseline']:.4f}",
                f"{flip['score']:.4f}",
            )
    return table
