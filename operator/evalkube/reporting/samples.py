"""``evalkube samples``: the debugging view of a run's samples, and their export."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from evalkube import limits
from evalkube.reporting.console import (
    EXIT_CONFIG,
    EXIT_RUNTIME,
    ApiOption,
    DbOption,
    NamespaceOption,
    SafeConsole,
    console,
    errors,
    fail,
    not_in_store,
    open_store,
    printable,
    utf8,
)
from evalkube.reporting.export import (
    FORMATS,
    ApiError,
    ApiSamples,
    store_views,
    text_stream,
    write_csv,
    write_json,
    write_jsonl,
)
from evalkube.store.filters import STATUS_FILTERS, SampleFilter

#: Samples the terminal view shows unless ``--limit`` says otherwise (exports take them all).
TABLE_LIMIT = 10
_SHOWN = (
    "prompt",
    "target",
    "output_text",
    "extracted_output",
    "scores",
    "judge",
    "error",
    "stdout",
    "stderr",
)


def samples(
    run_id: Annotated[
        str, typer.Argument(help="Run id (see `evalkube runs`), or the EvalRun name with --api")
    ],
    status: Annotated[
        str | None,
        typer.Option(
            help=f"{'|'.join(STATUS_FILTERS)}; wrong = valid, main metric (metricId) <= 0"
        ),
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only this task")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model")] = None,
    min_score: Annotated[
        list[str] | None,
        typer.Option("--min-score", metavar="METRIC=VALUE", help="Only scores[METRIC] >= VALUE"),
    ] = None,
    max_score: Annotated[
        list[str] | None,
        typer.Option("--max-score", metavar="METRIC=VALUE", help="Only scores[METRIC] <= VALUE"),
    ] = None,
    search: Annotated[
        str | None,
        typer.Option(help="Only samples whose output, target or error contains this (any case)"),
    ] = None,
    row: Annotated[
        str | None,
        typer.Option(help="Only this dataset row's samples (its idField value, else position)"),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"At most this many [default: {TABLE_LIMIT} for table, all for the others]",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table|json|jsonl|csv")] = "table",
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format json")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout")
    ] = None,
    db: DbOption = None,
    api: ApiOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Show or export samples of a run: prompt, target, output, extraction, scores, judge,
    error. Exports stream every matching sample."""
    if as_json:
        fmt = "json"
    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}", EXIT_CONFIG)
    try:
        where = SampleFilter.parse(
            task=task,
            model=model,
            status=status,
            min_score=min_score or (),
            max_score=max_score or (),
            search=search,
            row=row,
        )
    except ValueError as exc:
        fail(str(exc), EXIT_CONFIG)
    if limit is None and fmt == "table":
        limit = TABLE_LIMIT
    # the terminal view reads one more, to say when it left samples out
    wanted = limit + 1 if limit is not None and fmt == "table" else limit
    if out is not None:  # refuse a bad --out before reading anything (an export may take minutes)
        existed = out.exists()
        try:
            with out.open("ab"):
                pass
            if not existed:
                out.unlink()
        except OSError as exc:
            fail(f"cannot write --out {out}: {exc.strerror or exc}", EXIT_CONFIG)
    if api is not None:
        source = ApiSamples(api, namespace, run_id, os.environ.get("EVALKUBE_API_TOKEN"))
        try:
            metrics = source.metrics(where) if fmt == "csv" else []
            _write(source.views(where, wanted), fmt, out, metrics, limit)
        except ApiError as exc:
            fail(str(exc), EXIT_RUNTIME if exc.unreachable else EXIT_CONFIG)
        return
    with open_store(db) as store:
        record = store.get_run(run_id)
        if record is None:
            not_in_store(run_id, db)
        where = where.for_run(record.spec)
        columns = limits.CSV_SCORE_COLUMNS_MAX + 1  # one more: to say there are more
        metrics = store.score_names(run_id, columns) if fmt == "csv" else []
        _write(store_views(store, run_id, where, wanted), fmt, out, metrics, limit)


def _write(
    views: Iterator[dict[str, Any]],
    fmt: str,
    out: Path | None,
    metrics: list[str],
    limit: int | None = None,
) -> None:
    if len(metrics) > limits.CSV_SCORE_COLUMNS_MAX:
        errors.print(
            f"warning: the samples have more than {limits.CSV_SCORE_COLUMNS_MAX:,} metric "
            f"names; the CSV has score columns for the first {limits.CSV_SCORE_COLUMNS_MAX:,} "
            "(sorted), and every score is in --format jsonl",
            highlight=False,
            soft_wrap=True,
        )
        metrics = metrics[: limits.CSV_SCORE_COLUMNS_MAX]
    if fmt == "table":
        if out is None:
            _print_panels(views, console, limit)
        else:
            with out.open("w", encoding="utf-8", errors="backslashreplace") as handle:
                _print_panels(views, SafeConsole(file=handle, width=160, no_color=True), limit)
        return
    if out is not None:
        with out.open("wb") as binary, text_stream(binary) as stream:
            count = _export(views, fmt, stream, metrics)
        errors.print(f"wrote {count} samples to {out}", highlight=False, soft_wrap=True)
        return
    sys.stdout.flush()
    terminal = text_stream(sys.stdout.buffer)
    try:
        # a CSV printed to a terminal: its cells' control characters shown, not run
        target: Any = _Printable(terminal) if sys.stdout.isatty() else terminal
        _export(views, fmt, target, metrics)
    finally:
        terminal.flush()
        terminal.detach()


class _Printable:
    """A text stream that writes :func:`printable` text (for CSV on a terminal)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text, line_ends=True))


def _export(views: Iterator[dict[str, Any]], fmt: str, stream: IO[str], metrics: list[str]) -> int:
    if fmt == "jsonl":
        return write_jsonl(views, stream)
    if fmt == "csv":
        return write_csv(views, stream, metrics)
    return write_json(views, stream)


def _print_panels(views: Iterator[dict[str, Any]], target: Console, limit: int | None) -> None:
    shown = 0
    for view in views:
        if limit is not None and shown >= limit:
            errors.print(
                f"showing the first {shown}; more samples match: raise --limit, or export "
                "them all with --format jsonl|csv",
                highlight=False,
            )
            return
        target.print(panel(view), highlight=False)
        shown += 1
    if not shown:
        target.print("no samples match")


def _plain(text: str) -> Text:
    return Text(utf8(text).decode())


def panel(view: dict[str, Any]) -> Panel:
    """One sample for a person: text fields as text, structures as indented JSON, and an
    error's traceback as the lines Python printed (never a JSON string with ``\\n`` in it)."""
    parts: list[Text] = [Text("sample: ", style="bold") + _plain(str(view["sample_id"]))]
    for key in _SHOWN:
        value = view.get(key)
        if value is None or value == {}:
            continue
        label = Text(f"{key}: ", style="bold")
        if key == "error" and isinstance(value, dict):
            head = " · ".join(str(value[k]) for k in ("stage", "type") if value.get(k))
            parts.append(label + _plain(f"{head}: {value.get('message', '')}"))
            rest = {k: v for k, v in value.items() if k not in ("stage", "type", "message")}
            trace = rest.pop("traceback", None)
            if isinstance(trace, str) and trace:
                parts.append(_plain(trace.rstrip("\n")))
            if rest:
                parts.append(_plain(json.dumps(rest, indent=2, ensure_ascii=False)))
            continue
        text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
        parts.append(label + _plain(text))
    color = {"valid": "green", "invalid": "yellow", "errored": "red"}.get(view["status"], "white")
    # the dataset row id people know a sample by (views from before row ids: the sample id)
    row = view["sample_id"] if view.get("row_id") is None else view["row_id"]
    return Panel(
        Group(*parts),
        title=(
            f"row {escape(str(row))} · {escape(view['task_id'])} · {escape(view['model'])} · "
            f"[{color}]{view['status']}[/]"
        ),
        title_align="left",
    )
