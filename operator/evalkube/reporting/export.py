"""Sample exports: where the debugging views come from and the formats they are written in.

Everything here streams: views are read a page at a time (from the store by keyset cursor,
or from the operator's samples API by following ``next_cursor``) and written as they come,
so exporting a million samples holds one page in memory.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any

import httpx

from evalkube.reporting.console import json_printable
from evalkube.store import ResultStore
from evalkube.store.filters import SampleFilter
from evalkube.store.views import sample_view
from evalkube.util.net import release

PAGE_SIZE = 1000
#: Samples read from a local store at a time: a judge may hold up to 1 MB, so a page of
#: these stays about 100 MB at worst.
STORE_PAGE_SIZE = 100
FORMATS = ("table", "json", "jsonl", "csv")
#: Sample columns of the CSV export, around one ``score:<metric>`` column per metric.
CSV_HEAD = ("sample_id", "task_id", "model", "status", "row_id")
CSV_TAIL = (
    "target",
    "output_text",
    "extracted_output",
    "prompt",
    "judge",
    "error_stage",
    "error_type",
    "error_message",
    "error_traceback",
    "model_calls",
    "response_id",
    "stdout",
    "stderr",
)


class ApiError(RuntimeError):
    """The samples API could not be reached or refused the request (message says why)."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def store_views(
    store: ResultStore, run_id: str, where: SampleFilter, limit: int | None = None
) -> Iterator[dict[str, Any]]:
    """The matching samples of a local run as views, in order, at most ``limit``."""
    for n, record in enumerate(store.iter_pages(run_id, where, STORE_PAGE_SIZE)):
        if limit is not None and n >= limit:
            return
        yield sample_view(record)


class _RunEndpoint:
    """An EvalRun's URL in the operator's samples API, and the headers every request sends."""

    def __init__(self, api: str, namespace: str, name: str, token: str | None) -> None:
        self.api, self.namespace, self.name, self.token = api, namespace, name, token
        self.url = f"{api.rstrip('/')}/api/v1/namespaces/{namespace}/evalruns/{name}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _get(
        self, client: httpx.Client, path: str, what: str, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            response = client.get(f"{self.url}/{path}", params=params, headers=self.headers)
        except httpx.HTTPError as exc:
            raise ApiError(
                f"cannot reach the samples API at {self.api}: {exc}", unreachable=True
            ) from None
        _raise_for_answer(response, what)
        body: dict[str, Any] = response.json()
        release(response)  # each page freed as the next comes, not at a full GC
        return body


class ApiSamples(_RunEndpoint):
    """The samples of an EvalRun from the operator's API, following its cursor."""

    @staticmethod
    def params(where: SampleFilter) -> dict[str, Any]:
        params: dict[str, Any] = {
            "status": where.status,
            "task": where.task,
            "model": where.model,
            "search": where.search,
            "row": where.row,
            "min_score": [f"{r.metric}={r.low!r}" for r in where.scores if r.low is not None],
            "max_score": [f"{r.metric}={r.high!r}" for r in where.scores if r.high is not None],
        }
        return {k: v for k, v in params.items() if v}

    def metrics(self, where: SampleFilter) -> list[str]:
        """The run's metric names (the CSV columns), asked of the API once."""
        with httpx.Client(timeout=60) as client:
            params = {**self.params(where), "limit": 1, "metrics": "true"}
            body = self._get(client, "samples", "samples API", params)
        return [str(name) for name in body.get("metrics") or []]

    def views(
        self, where: SampleFilter, limit: int | None = None, page_size: int = PAGE_SIZE
    ) -> Iterator[dict[str, Any]]:
        """Every matching view (at most ``limit``), a page per request (the API ends a page
        at ``limits.SAMPLES_PAGE_BYTES`` too, so one page in memory is bounded)."""
        cursor: str | None = None
        left = limit
        with httpx.Client(timeout=60) as client:
            while left is None or left > 0:
                size = page_size if left is None else min(left, page_size)
                params = {**self.params(where), "limit": size}
                if cursor:
                    params["cursor"] = cursor
                body = self._get(client, "samples", "samples API", params)
                page: list[dict[str, Any]] = body["samples"]
                yield from page
                if left is not None:
                    left -= len(page)
                cursor = body.get("next_cursor")
                if not cursor:
                    return


class ApiRun(_RunEndpoint):
    """An EvalRun as the operator's samples API serves it: its run record
    (``GET .../run``), its scores (``GET .../scores``) and its samples (``GET .../samples``),
    each streamed or paged: what ``evalkube report --api`` renders."""

    _run: dict[str, Any] | None = None

    def run(self) -> dict[str, Any]:
        """The run record (asked once)."""
        if self._run is None:
            what = f"run API (EvalRun {self.namespace}/{self.name})"
            with httpx.Client(timeout=60) as client:
                self._run = dict(self._get(client, "run", what))
        return self._run

    def scores(self) -> Iterator[tuple[str, str, str, dict[str, float]]]:
        """Every sample's ``(task, model, status, scores)``, streamed."""
        for task, model, _key, status, scores in api_keyed_scores(
            self.api, self.namespace, self.name, self.token
        ):
            yield task, model, status, scores

    def views(self, page_size: int) -> Iterator[dict[str, Any]]:
        """The samples in order, a page at a time."""
        samples = ApiSamples(self.api, self.namespace, self.name, self.token)
        return samples.views(SampleFilter(), page_size=page_size)


def write_jsonl(views: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """One JSON object per line; returns how many. DEL, C1 and bidi controls are ``\\u``
    escapes (the same JSON), so printing it to a terminal runs no control sequence."""
    n = 0
    for view in views:
        out.write(json_printable(json.dumps(view, ensure_ascii=False)) + "\n")
        n += 1
    return n


def write_json(views: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """A JSON array (what ``--json`` has always printed), written a view at a time."""
    n = 0
    out.write("[")
    for n, view in enumerate(views, 1):
        body = json_printable(json.dumps(view, indent=2, ensure_ascii=False))
        out.write(("," if n > 1 else "") + "\n  " + body.replace("\n", "\n  "))
    out.write("\n]\n" if n else "]\n")
    return n


#: First characters that make a spreadsheet read a cell as a formula (OWASP "CSV injection"),
#: with the full-width forms some locales accept as well.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
#: Characters a spreadsheet may split a cell at when it guesses the separator or the locale
#: uses another one (``;`` in much of Europe): each piece must be defused on its own.
SEPARATORS = re.compile(r"([,;\t|\r\n])")
_RISKY = re.compile("[=+\\-@\uff1d\uff0b\uff0d\uff20]")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def defuse(text: str) -> str:
    """``text`` with a ``'`` in front of every piece a spreadsheet would run as a formula.

    Cells hold model output and grader messages, and a model may learn to write
    ``=HYPERLINK(...)`` for whoever opens the export. A piece is the cell, or what follows
    a separator a spreadsheet may split at (``a;=cmd|...`` in a ``;`` locale); leading
    spaces are skipped, as a spreadsheet trimming them would. A plain number (``-3``,
    ``+1.5e3``) is left alone. JSON and JSONL exports carry every value unchanged.
    """
    if not _RISKY.search(text) and not text.startswith(("\t", "\r")):
        return text
    prefix = "'" if text.startswith(("\t", "\r")) else ""
    pieces = SEPARATORS.split(text)
    for index in range(0, len(pieces), 2):  # even positions: text between separators
        piece = pieces[index]
        body = piece.lstrip(" ")
        if body.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(body.rstrip()):
            pieces[index] = piece[: len(piece) - len(body)] + "'" + body
    return prefix + "".join(pieces)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return defuse(value)
    return defuse(json.dumps(value, ensure_ascii=False, sort_keys=True))


def csv_columns(metrics: Iterable[str]) -> list[str]:
    """The header row. A metric name is a grader's choice (any characters, up to 128), so a
    ``score:`` column is :func:`defused <defuse>` like a cell (``x;=HYPERLINK(...)`` would
    be a formula in a ``;`` locale)."""
    return [*CSV_HEAD, *(defuse(f"score:{m}") for m in metrics), *CSV_TAIL]


def csv_row(view: dict[str, Any], metrics: list[str]) -> list[str]:
    """A view as CSV cells: text as is, structured values as JSON, a score per metric."""
    error = view.get("error") or {}
    scores = view.get("scores") or {}
    extra = {f"error_{k}": error.get(k) for k in ("stage", "type", "message", "traceback")}
    return [
        *(_cell(view.get(k)) for k in CSV_HEAD),
        *(repr(float(scores[m])) if m in scores else "" for m in metrics),
        *(_cell(extra[k] if k in extra else view.get(k)) for k in CSV_TAIL),
    ]


def write_csv(views: Iterable[dict[str, Any]], out: IO[str], metrics: list[str]) -> int:
    """RFC 4180 CSV with a header row, every field quoted (a separator or newline inside a
    cell never splits it), and text a spreadsheet would run as a formula
    :func:`defused <defuse>`."""
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_ALL)
    writer.writerow(csv_columns(metrics))
    n = 0
    for view in views:
        writer.writerow(csv_row(view, metrics))
        n += 1
    return n


def text_stream(binary: IO[bytes]) -> io.TextIOWrapper:
    """A UTF-8 text stream over ``binary`` that writes lone surrogates (a grader may return
    them) as ``\\udXXX`` instead of failing; ``newline=""`` keeps CSV's CRLF as written."""
    return io.TextIOWrapper(
        binary, encoding="utf-8", errors="backslashreplace", newline="", write_through=True
    )


def _raise_for_answer(response: httpx.Response, what: str) -> None:
    """An :class:`ApiError` with the API's own message for anything but 200."""
    if response.status_code == 200:
        return
    response.read()
    try:
        detail = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = response.text[:300]
    raise ApiError(f"{what} answered HTTP {response.status_code}: {detail}")


def api_keyed_scores(
    api: str, namespace: str, name: str, token: str | None
) -> Iterator[tuple[str, str, str, str, dict[str, float]]]:
    """Every sample's ``(task, model, key, status, scores)`` of an EvalRun from the operator's
    API (``GET .../scores``, streamed), the input :func:`compare_scores` pairs."""
    run = _RunEndpoint(api, namespace, name, token)
    try:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("GET", f"{run.url}/scores", headers=run.headers) as answer,
        ):
            _raise_for_answer(answer, f"scores API (EvalRun {namespace}/{name})")
            for line in answer.iter_lines():
                if line:
                    row = json.loads(line)
                    yield row["task"], row["model"], row["key"], row["status"], row["scores"]
    except httpx.HTTPError as exc:
        raise ApiError(f"cannot reach the scores API at {api}: {exc}", unreachable=True) from None
