"""Which samples a view or an export selects, shared by ``evalkube samples`` and the samples API.

Every filter becomes SQL (scores and text are read out of the JSON columns by the database),
so a page of the view is ``limit`` matching samples, and an export streams only what matches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Float, Table, and_, case, cast, func, literal, or_, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import ColumnElement

#: ``--status`` / ``?status=`` values and the sample statuses they select. ``wrong`` is a valid
#: sample (the grader could grade it) whose task's main metric (the grader's ``metricId``)
#: is 0 or less; a sample without that score is wrong when any of its scores is.
STATUS_FILTERS = {
    "failed": ["invalid", "errored"],
    "valid": ["valid"],
    "wrong": ["valid"],
    "invalid": ["invalid"],
    "errored": ["errored"],
    "pending": ["pending"],
}

#: Detail fields the text search looks in: what the model said, what it should have said,
#: and what went wrong.
SEARCHED = (
    ("output_text",),
    ("extracted_output",),
    ("target",),
    ("error", "type"),
    ("error", "message"),
    ("error", "traceback"),
)


@dataclass(frozen=True, slots=True)
class ScoreRange:
    """``low <= scores[metric] <= high`` (either bound may be open)."""

    metric: str
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True, slots=True)
class SampleFilter:
    """The samples to select; the defaults select all of them."""

    task: str | None = None
    model: str | None = None
    status: str | None = None
    scores: tuple[ScoreRange, ...] = field(default_factory=tuple)
    search: str | None = None
    #: The dataset row id (the task's ``idField`` value, else the row's position), exactly.
    row: str | None = None
    #: ``(task, metric)``: each task's main metric, which ``wrong`` looks at first.
    main_metrics: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def for_run(self, spec: dict[str, Any] | None) -> SampleFilter:
        """This filter with the main metrics of the run whose stored spec is ``spec``."""
        return replace(self, main_metrics=tuple(sorted(main_metrics(spec).items())))

    @classmethod
    def parse(
        cls,
        *,
        task: str | None = None,
        model: str | None = None,
        status: str | None = None,
        min_score: Sequence[str] = (),
        max_score: Sequence[str] = (),
        search: str | None = None,
        row: str | None = None,
        prefix: str = "--",
    ) -> SampleFilter:
        """Build a filter from option text; :class:`ValueError` names the bad option.

        ``prefix`` is how the message spells an option (``--`` on the command line, empty
        for query parameters).
        """
        if status is not None and status not in STATUS_FILTERS:
            raise ValueError(f"{prefix}status must be one of {', '.join(STATUS_FILTERS)}")
        lows = [_bound(text, f"{prefix}min_score") for text in min_score]
        highs = [_bound(text, f"{prefix}max_score") for text in max_score]
        ranges = [ScoreRange(m, low=v) for m, v in lows] + [ScoreRange(m, high=v) for m, v in highs]
        return cls(
            task=task or None,
            model=model or None,
            status=status or None,
            scores=tuple(ranges),
            search=search or None,
            row=row or None,
        )


def main_metrics(spec: dict[str, Any] | None) -> dict[str, str]:
    """Task id -> its grader's ``metricId`` (default ``score``), from a run's stored spec (its
    :class:`~evalkube.models.snapshot.RunSnapshot`; read as JSON: a view never fails on it)."""
    suite = (spec or {}).get("suite") or {}
    found: dict[str, str] = {}
    for task in (suite.get("spec") or {}).get("tasks") or []:
        if isinstance(task, dict) and isinstance(task.get("id"), str):
            grader = task.get("grader") or {}
            found[task["id"]] = str(grader.get("metricId") or "score")
    return found


def is_wrong(status: str, scores: dict[str, Any], main: str | None) -> bool:
    """``status=wrong`` for one sample in Python (the HTML report's badge and filter)."""
    if status != "valid":
        return False
    if main is not None and _number(scores.get(main)):
        return bool(scores[main] <= 0)
    return any(_number(value) and value <= 0 for value in scores.values())


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bound(text: str, option: str) -> tuple[str, float]:
    metric, sep, number = text.rpartition("=")
    option = option.replace("_", "-") if option.startswith("--") else option
    if not sep or not metric:
        raise ValueError(
            f"{option} takes METRIC=VALUE (e.g. {option.lstrip('-')} exact_match=0.5), got {text!r}"
        )
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{option}: {number!r} is not a number (in {text!r})") from None
    if math.isnan(value):
        raise ValueError(f"{option}: the bound of {metric!r} is NaN; give a number")
    return metric, value


def conditions(where: SampleFilter, table: Table, dialect: str) -> list[ColumnElement[bool]]:
    """SQL conditions on ``table`` (the samples table) for ``where`` on ``dialect``."""
    c = table.c
    out: list[ColumnElement[bool]] = []
    if where.task is not None:
        out.append(c.task_id == where.task)
    if where.model is not None:
        out.append(c.model == where.model)
    if where.status is not None:
        out.append(c.status.in_(STATUS_FILTERS[where.status]))
        if where.status == "wrong":
            out.append(_wrong(where, table, dialect))
    for bound in where.scores:
        out.append(_any_score(c.scores, dialect, bound.metric, bound.low, bound.high))
    if where.row is not None:
        out.append(_detail_text(c.detail, dialect, ("row_id",)) == where.row)
    if where.search is not None:
        out.append(
            or_(
                *(
                    _detail_text(c.detail, dialect, path).icontains(where.search, autoescape=True)
                    for path in SEARCHED
                )
            )
        )
    return out


def _wrong(where: SampleFilter, table: Table, dialect: str) -> ColumnElement[bool]:
    c = table.c
    any_low = _any_score(c.scores, dialect, None, None, 0.0)
    if not where.main_metrics:
        return any_low
    main = case(dict(where.main_metrics), value=c.task_id, else_=None)
    return or_(
        _any_score(c.scores, dialect, main, None, 0.0),
        and_(~_any_score(c.scores, dialect, main, None, None), any_low),
    )


def _any_score(
    scores: Any, dialect: str, metric: Any, low: float | None, high: float | None
) -> ColumnElement[bool]:
    """Some score (named ``metric``, a name or an SQL expression, if given) lies within
    ``[low, high]``."""
    if dialect == "postgresql":
        each = func.jsonb_each_text(cast(scores, JSONB)).table_valued("key", "value")
    else:
        each = func.json_each(scores).table_valued("key", "value")
    value = cast(each.c.value, Float)
    tests: list[ColumnElement[bool]] = []
    if metric is not None:
        tests.append(each.c.key == metric)
    if low is not None:
        tests.append(value >= low)
    if high is not None:
        tests.append(value <= high)
    return select(literal(1)).select_from(each).where(and_(*tests)).exists()


def _detail_text(detail: Any, dialect: str, path: tuple[str, ...]) -> ColumnElement[str]:
    """A text field of the ``detail`` JSON column.

    A NUL in model output is stored as the escape ``\\u0000``, which PostgreSQL's JSON
    refuses to turn into text (the whole query would fail) and SQLite's text ends at; it is
    read as U+FFFD instead. (Rewriting ``\\\\u0000``, an escaped backslash, the same way
    still leaves valid JSON.)
    """
    readable = func.replace(detail, "\\u0000", "\\ufffd")
    if dialect == "postgresql":
        return func.jsonb_extract_path_text(cast(readable, JSONB), *path)
    return func.json_extract(readable, "$." + ".".join(path))
