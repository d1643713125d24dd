"""``evalkube runs``: recent runs with their scores, counts, duration and phase."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol

import typer
from rich.markup import escape
from rich.table import Table

from evalkube.reporting.console import DbOption, console, json_printable, open_store, shown_store
from evalkube.store import RunRecord

COUNTED = ("valid", "invalid", "errored", "pending")


class StatusCounts(Protocol):
    def status_counts(self, run_id: str) -> dict[tuple[str, str], dict[str, int]]: ...


def run_overview(store: StatusCounts, record: RunRecord) -> dict[str, Any]:
    """A run as ``runs --json`` gives it: what ran, how it ended, and its scores.

    A finished run's results come from its summary; a run without one (still running,
    interrupted, failed) gets its counts from the samples recorded so far, and no metrics.
    """
    summary = record.summary or {}
    results: list[dict[str, Any]] = [
        {
            "task": result.get("task"),
            "model": result.get("model"),
            "metrics": result.get("metrics") or {},
            "counts": result.get("counts") or {},
            **({"error": result["error"]} if result.get("error") else {}),
        }
        for result in summary.get("results") or []
    ]
    if not results:
        for (task, model), by_status in sorted(store.status_counts(record.run_id).items()):
            counts = {"samples": sum(by_status.values())}
            counts.update({status: by_status.get(status, 0) for status in COUNTED})
            results.append({"task": task, "model": model, "metrics": {}, "counts": counts})
    seconds = summary.get("seconds")
    if seconds is None and record.created_at and record.completed_at:
        seconds = (_aware(record.completed_at) - _aware(record.created_at)).total_seconds()
    return {
        "run_id": record.run_id,
        "suite": record.suite_name,
        "suite_version": record.suite_version,
        "phase": record.phase,
        "sandbox": record.sandbox,
        "created_at": _iso(record.created_at),
        "completed_at": _iso(record.completed_at),
        "seconds": round(seconds, 3) if seconds is not None else None,
        **({"reason": summary["reason"]} if summary.get("reason") else {}),
        "results": results,
    }


def _aware(moment: datetime) -> datetime:
    """SQLite gives naive datetimes back (written as UTC)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _iso(moment: datetime | None) -> str | None:
    return _aware(moment).isoformat() if moment else None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def _metrics_cell(result: dict[str, Any]) -> str:
    lines = [f"{escape(name)} = {value:.4f}" for name, value in result["metrics"].items()]
    if result.get("error"):
        lines.append(f"[red]batch failed: {escape(str(result['error']))}[/]")
    return "\n".join(lines) or "-"


def _counts_cell(counts: dict[str, Any]) -> str:
    parts = [str(counts.get("samples") or 0), f"[green]{counts.get('valid') or 0}[/] valid"]
    if counts.get("invalid"):
        parts.append(f"[yellow]{counts['invalid']}[/] invalid")
    if counts.get("errored"):
        parts.append(f"[red]{counts['errored']}[/] errored")
    if counts.get("pending"):
        parts.append(f"{counts['pending']} pending")
    return " · ".join(parts)


_PHASE_COLOR = {"Succeeded": "green", "Failed": "red", "Running": "cyan", "Interrupted": "yellow"}


def runs(
    db: DbOption = None,
    limit: Annotated[int, typer.Option(min=1, help="How many recent runs")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """List recent runs in the store: phase, duration, sample counts and scores."""
    with open_store(db) as store:
        overviews = [run_overview(store, record) for record in store.list_runs(limit)]
    where = shown_store(db)
    if as_json:
        payload = json.dumps({"store": where, "runs": overviews}, indent=2, ensure_ascii=False)
        print(json_printable(payload))
        return
    table = Table(title=f"runs in {escape(where)}", title_justify="left")
    table.add_column("run", no_wrap=True)
    table.add_column("phase · duration", overflow="fold")
    table.add_column("created", no_wrap=True)
    table.add_column("task", overflow="fold")
    table.add_column("model", overflow="fold")
    table.add_column("samples", no_wrap=True)
    table.add_column("scores", no_wrap=True)
    for view in overviews:
        color = _PHASE_COLOR.get(view["phase"], "white")
        phase = f"[{color}]{escape(view['phase'])}[/] · {_duration(view['seconds'])}"
        if view.get("reason"):
            phase += f"\n{escape(view['reason'][:200])}"
        run = [
            f"{escape(view['run_id'])}\n[dim]{escape(view['suite'])}[/]",
            phase,
            (view["created_at"] or "")[:16].replace("T", " "),
        ]
        # one row per task x model; the run's own columns on its first row only
        for result in view["results"] or [{"task": "-", "model": "-", "metrics": {}, "counts": {}}]:
            table.add_row(
                *run,
                escape(str(result["task"])),
                escape(str(result["model"])),
                _counts_cell(result["counts"]),
                _metrics_cell(result),
            )
            run = ["", "", ""]
        table.add_section()
    console.print(table)
    if not overviews:
        console.print("no runs yet", highlight=False)
    console.print(f"store: {escape(where)}", highlight=False, soft_wrap=True)
