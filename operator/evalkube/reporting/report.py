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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import jinja2
import typer

from evalkube import __version__
from evalkube.cli_support import EXIT_CONFIG, DbOption, errors, fail, open_store, shown_store
from evalkube.cli_support import store_url as _store_url
from evalkube.reporting.runs import run_overview
from evalkube.store import ResultStore
from evalkube.store.filters import is_wrong, main_metrics
from evalkube.store.views import sample_view

BINS = 10
#: Samples the browser section holds unless ``--max-samples`` says otherwise (the page stays
#: quick to open; the scores and histograms always cover every sample).
MAX_SAMPLES = 5000


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

    def edges(self, i: int) -> tuple[float, float]:
        if self.high <= self.low:
            return self.low, self.high
        width = (self.high - self.low) / BINS
        return self.low + i * width, self.low + (i + 1) * width

    def bars(self) -> list[dict[str, Any]]:
        """Bars as the SVG draws them: position, height (0-60 px), label."""
        peak = max(self.counts) or 1
        used = 1 if self.high <= self.low else BINS
        width = 240 / used
        bars = []
        for i in range(used):
            low, high = self.edges(i)
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


def histograms(store: ResultStore, run_id: str) -> list[Histogram]:
    """Every metric's distribution over the run's graded samples, in two streamed passes
    (range, then bins), so memory does not grow with the run."""
    found: dict[tuple[str, str, str], Histogram] = {}
    for task, model, _status, scores, _calls in store.iter_scores(run_id):
        for metric, value in scores.items():
            if not _finite(value):
                continue
            key = (task, model, metric)
            hist = found.get(key) or found.setdefault(key, Histogram(task, model, metric))
            hist.low = min(hist.low, float(value))
            hist.high = max(hist.high, float(value))
    for task, model, _status, scores, _calls in store.iter_scores(run_id):
        for metric, value in scores.items():
            if _finite(value):
                hist = found[(task, model, metric)]
                hist.counts[hist.bin_of(float(value))] += 1
                hist.total += 1
    return [found[key] for key in sorted(found)]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _pretty(value: Any) -> str:
    """Structured values as indented JSON; text as it is."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


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
    """The report of ``run_id`` as one HTML document."""
    record = store.get_run(run_id)
    if record is None:
        raise LookupError(run_id)
    overview = run_overview(store, record)
    main = main_metrics(record.spec)
    views: list[dict[str, Any]] = []
    total = sum(int(r["counts"].get("samples") or 0) for r in overview["results"])
    for sample in store.iter_pages(run_id, page_size=1000):
        if len(views) >= max_samples:
            break
        view = sample_view(sample)
        view["wrong"] = is_wrong(view["status"], view["scores"], main.get(view["task_id"]))
        views.append(view)
    # distributions in the scores table's order
    order = {(r["task"], r["model"]): i for i, r in enumerate(overview["results"])}
    drawn = sorted(
        histograms(store, run_id),
        key=lambda h: (order.get((h.task, h.model), len(order)), h.task, h.model, h.metric),
    )
    script, script_hash = _script()
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            run=overview,
            histograms=drawn,
            samples=views,
            total=max(total, len(views)),
            tasks=sorted({r["task"] for r in overview["results"]}),
            models=sorted({r["model"] for r in overview["results"]}),
            script=script,
            script_hash=script_hash,
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
) -> None:
    """Write a self-contained HTML report of a run: scores, score distributions, and a
    per-sample browser with filters. It opens offline in any browser."""
    url = _store_url(db)
    store = open_store(db)
    try:
        html = render_report(store, run_id, max_samples)
    except LookupError:
        fail(
            f"run {run_id!r} is not in the store {shown_store(url)}; list its runs with "
            "`evalkube runs` (or pass --db)",
            EXIT_CONFIG,
        )
    finally:
        store.close()
    target = out or Path(f"{run_id}.html")
    try:
        target.write_text(html, encoding="utf-8", errors="backslashreplace")
    except OSError as exc:
        fail(f"cannot write --out {target}: {exc.strerror or exc}", EXIT_CONFIG)
    errors.print(f"wrote {target.resolve()}", highlight=False, soft_wrap=True)
