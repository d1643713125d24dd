"""``evalkube report RUN``: one self-contained HTML file a person can open anywhere.

The page needs no network: CSS and the filter script are inline, histograms are inline SVG.
Sample text is untrusted model output, so every value goes through Jinja2's autoescaping,
the script reads the page and never writes HTML, and a Content-Security-Policy allows only
that one script (by its hash): markup that slipped through would still not run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import jinja2
import typer

from evalkube import __version__, limits
from evalkube.reporting.console import (
    EXIT_CONFIG,
    EXIT_RUNTIME,
    ApiOption,
    DbOption,
    NamespaceOption,
    errors,
    fail,
    not_in_store,
    open_store,
)
from evalkube.reporting.export import ApiError, ApiRun
from evalkube.reporting.runs import run_overview
from evalkube.store import ResultStore, RunRecord
from evalkube.store.filters import is_wrong, main_metrics
from evalkube.store.views import sample_view

BINS = 10
#: Samples the browser section holds unless ``--max-samples`` says otherwise (the page stays
#: quick to open; the scores and histograms always cover every sample).
MAX_SAMPLES = 5000
#: Samples read from the store at a time (each may hold a judge of up to 1 MB).
PAGE_SIZE = 100


@dataclass
class Histogram:
    """How one metric's per-sample scores of one task x model are spread."""

    task: str
    model: str
    metric: str
    low: float = math.inf
    high: float = -math.inf
    total: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * BINS)

    def bin_of(self, value: float) -> int:
        if self.high <= self.low:
            return 0
        return min(int((value - self.low) / (self.high - self.low) * BINS), BINS - 1)

    def bars(self) -> list[dict[str, Any]]:
        """Bars as the SVG draws them: position, height (0-60 px), label."""
        peak = max(self.counts) or 1
        used = 1 if self.high <= self.low else BINS
        width = 240 / used
        step = (self.high - self.low) / BINS  # 0 when every value is the same (one bar)
        bars = []
        for i in range(used):
            low, high = self.low + i * step, self.low + (i + 1) * step
            count = self.counts[i]
            height = round(60 * count / peak, 1)
            bars.append(
                {
                    "x": round(i * width + 1, 1),
                    "y": round(64 - height, 1),
                    "width": round(max(width - 2, 1), 1),
                    "height": height,
                    "label": f"{_num(low)} to {_num(high)}: {count}"
                    if used > 1
                    else f"{_num(low)}: {count}",
                }
            )
        return bars


def _num(value: float) -> str:
    return f"{value:.4g}"


Scores = Iterable[tuple[str, str, str, dict[str, float]]]


class StoreReport:
    """A run of the results store (every read streams or pages, as :class:`ApiReport`'s)."""

    def __init__(self, store: ResultStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self._record: RunRecord | None = None

    def record(self) -> RunRecord | None:
        if self._record is None:
            self._record = self.store.get_run(self.run_id)
        return self._record

    def status_counts(self, run_id: str) -> dict[tuple[str, str], dict[str, int]]:
        return self.store.status_counts(run_id)

    def main_metrics(self) -> dict[str, str]:
        record = self.record()
        return main_metrics(record.spec if record else None)

    def scores(self) -> Scores:
        return ((t, m, status, s) for t, m, status, s, _ in self.store.iter_scores(self.run_id))

    def views(self) -> Iterator[dict[str, Any]]:
        return (sample_view(s) for s in self.store.iter_pages(self.run_id, page_size=PAGE_SIZE))


class ApiReport:
    """An EvalRun of the operator's samples API (:class:`~evalkube.reporting.export.ApiRun`)."""

    def __init__(self, run: ApiRun) -> None:
        self.run = run

    def record(self) -> RunRecord | None:
        data = self.run.run()
        return RunRecord(
            run_id=data["run_id"],
            suite_name=data["suite_name"],
            suite_version=data["suite_version"],
            spec={},
            sandbox=data["sandbox"],
            phase=data["phase"],
            created_at=_moment(data.get("created_at")),
            completed_at=_moment(data.get("completed_at")),
            summary=data.get("summary"),
        )

    def status_counts(self, run_id: str) -> dict[tuple[str, str], dict[str, int]]:
        return {(t, m): dict(by) for t, m, by in self.run.run().get("status_counts") or []}

    def main_metrics(self) -> dict[str, str]:
        return dict(self.run.run().get("main_metrics") or {})

    def scores(self) -> Scores:
        return self.run.scores()

    def views(self) -> Iterator[dict[str, Any]]:
        return self.run.views(PAGE_SIZE)


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def histograms(
    scores: Callable[[], Scores], limit: int = limits.REPORT_HISTOGRAMS_MAX
) -> tuple[list[Histogram], bool]:
    """Each metric's distribution over the run's graded samples, in two streamed passes
    (range, then bins) of ``scores()``, so memory does not grow with the run; at most
    ``limit`` of them (the first met), and whether others were left out."""
    found: dict[tuple[str, str, str], Histogram] = {}
    left_out = False
    for task, model, _status, values in scores():
        for metric, value in values.items():
            if not _finite(value):
                continue
            key = (task, model, metric)
            hist = found.get(key)
            if hist is None:
                if len(found) >= limit:
                    left_out = True
                    continue
                hist = found[key] = Histogram(task, model, metric)
            hist.low = min(hist.low, float(value))
            hist.high = max(hist.high, float(value))
    for task, model, _status, values in scores():
        for metric, value in values.items():
            if _finite(value) and (hist := found.get((task, model, metric))) is not None:
                hist.counts[hist.bin_of(float(value))] += 1
                hist.total += 1
    return [found[key] for key in sorted(found)], left_out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _pretty(value: Any) -> str:
    """Structured values as indented JSON; text as it is."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


#: Scores listed per sample (a grader may return thousands of names).
SCORES_SHOWN = 50
_TEXT_FIELDS = ("prompt", "target", "output_text", "extracted_output", "judge", "model_calls")


def _clip(text: str, pointer: str) -> str:
    cap = limits.REPORT_FIELD_CHARS
    if len(text) <= cap:
        return text
    return text[:cap] + f"\n… {len(text) - cap:,} more characters: {pointer}"


def bounded_view(view: dict[str, Any], run_id: str) -> tuple[dict[str, Any], int]:
    """A sample's view as the report shows it: every field at most
    :data:`limits.REPORT_FIELD_CHARS` characters (structures as indented JSON), the rest
    pointed to ``evalkube samples``; and about how many characters it adds to the page."""
    pointer = f"the whole field: evalkube samples {run_id} --format jsonl"
    shown = dict(view)
    for key in (*_TEXT_FIELDS, "stdout", "stderr"):
        value = view.get(key)
        if value is not None and value != {}:
            shown[key] = _clip(_pretty(value), pointer)
    scores = view.get("scores") or {}
    if len(scores) > SCORES_SHOWN:
        shown["scores"] = dict(list(scores.items())[:SCORES_SHOWN])
        shown["scores_more"] = f"… {len(scores) - SCORES_SHOWN:,} more scores: {pointer}"
    error = view.get("error")
    if isinstance(error, dict):
        shown["error"] = {
            k: _clip(v, pointer) if isinstance(v, str) else v for k, v in error.items()
        }
    size = sum(len(v) for v in shown.values() if isinstance(v, str))
    size += sum(len(str(v)) for v in (shown.get("error") or {}).values())
    return shown, size + 100 * len(shown.get("scores") or {})


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("evalkube.reporting", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty"] = _pretty
    env.filters["num"] = _num
    return env


def _script() -> tuple[str, str]:
    """The page's one script and its CSP source (``'sha256-...'``)."""
    text = resources.files("evalkube.reporting").joinpath("templates/report.js").read_text()
    digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return text, f"'sha256-{digest}'"


def render_report(store: ResultStore, run_id: str, max_samples: int = MAX_SAMPLES) -> str:
    """The report of ``run_id`` of the store as one HTML document."""
    return render(StoreReport(store, run_id), max_samples)


def render(source: StoreReport | ApiReport, max_samples: int = MAX_SAMPLES) -> str:
    """The report of ``source``'s run as one HTML document (:class:`LookupError`: no run)."""
    record = source.record()
    if record is None:
        raise LookupError("run")
    run_id = record.run_id
    overview = run_overview(source, record)
    main = source.main_metrics()
    views: list[dict[str, Any]] = []
    total = sum(int(r["counts"].get("samples") or 0) for r in overview["results"])
    used = 0
    pages = source.views()
    for view in pages:
        if len(views) >= max_samples:
            break
        wrong = is_wrong(view["status"], view["scores"], main.get(view["task_id"]))
        view, size = bounded_view(view, run_id)
        used += size
        if used > limits.REPORT_SAMPLES_BYTES and views:
            break
        view["wrong"] = wrong
        views.append(view)
    getattr(pages, "close", lambda: None)()  # stop paging (the API's client, the store's)
    # distributions in the scores table's order
    order = {(r["task"], r["model"]): i for i, r in enumerate(overview["results"])}
    hists, hists_left_out = histograms(source.scores)
    drawn = sorted(
        hists,
        key=lambda h: (order.get((h.task, h.model), len(order)), h.task, h.model, h.metric),
    )
    script, script_hash = _script()
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            run=overview,
            histograms=drawn,
            histograms_left_out=hists_left_out,
            samples=views,
            total=max(total, len(views)),
            tasks=sorted({r["task"] for r in overview["results"]}),
            models=sorted({r["model"] for r in overview["results"]}),
            script=script,
            script_hash=script_hash,
            field_chars=f"{limits.REPORT_FIELD_CHARS:,}",
            page_mb=limits.REPORT_SAMPLES_BYTES // 1024**2,
            version=__version__,
            generated=datetime.now(UTC).isoformat(timespec="seconds"),
        )
    )


def report(
    run_id: Annotated[str, typer.Argument(help="Run id (see `evalkube runs`)")],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="HTML file to write [default: RUN_ID.html]"),
    ] = None,
    max_samples: Annotated[
        int,
        typer.Option(min=0, help="Samples in the per-sample browser (scores use all of them)"),
    ] = MAX_SAMPLES,
    db: DbOption = None,
    api: ApiOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Write a self-contained HTML report of a run: scores, score distributions, and a
    per-sample browser with filters. It opens offline in any browser. With --api, RUN_ID is
    the EvalRun's name and everything streams from the operator (EVALKUBE_API_TOKEN)."""
    if api is not None:
        source = ApiReport(ApiRun(api, namespace, run_id, os.environ.get("EVALKUBE_API_TOKEN")))
        try:
            html = render(source, max_samples)
            run_id = source.run.run()["run_id"]  # the file is named by the run's id
        except ApiError as exc:
            fail(str(exc), EXIT_RUNTIME if exc.unreachable else EXIT_CONFIG)
    else:
        with open_store(db) as store:
            try:
                html = render_report(store, run_id, max_samples)
            except LookupError:
                not_in_store(run_id, db)
    target = out or Path(f"{run_id}.html")
    try:
        target.write_text(html, encoding="utf-8", errors="backslashreplace")
    except OSError as exc:
        fail(f"cannot write --out {target}: {exc.strerror or exc}", EXIT_CONFIG)
    errors.print(f"wrote {target.resolve()}", highlight=False, soft_wrap=True)
