"""Model output, grader text and grader-chosen metric names reach the terminal as text: every
CLI view (the run's results table, ``samples`` as panels, JSON, JSONL and CSV, ``runs`` and
``runs --json``, ``compare``, errors) shows a control sequence as a visible escape instead of
sending it (window title, OSC 52 clipboard write, screen clear, cursor move, C1 CSI, bidi
override).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.security.bounded import EVALKUBE, Outcome, run_bounded

pytestmark = pytest.mark.timeout(300)

TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"
CLEAR = "\x1b[2J\x1b[H"
C1_CSI = "\x9b31m"
BIDI = "\u202eevil"
HOSTILE = TITLE + CLIPBOARD + CLEAR + C1_CSI + BIDI
# anything a terminal acts on: C0 but tab/newline (CR: the CSV rows' own line ends are
# checked apart), DEL, C1, bidi controls
RAW = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

GRADER = f"""
def grade(sample, item):
    if item["id"] == "bad":
        raise ValueError({HOSTILE!r})
    print({HOSTILE!r})
    return {{"scores": {{"m" + {CLEAR!r}: 1.0, "score": 1.0}}, "judge": {{"note": {HOSTILE!r}}}}}
"""


def _views_are_clean(outcome: Outcome, what: str) -> None:
    for name, text in (("stdout", outcome.stdout), ("stderr", outcome.stderr)):
        found = RAW.findall(text.replace("\r\n", "\n"))
        assert not found, (what, name, found[:5], text[-1500:])


@pytest.fixture
def hostile_run(tmp_path: Path) -> tuple[str, str, Outcome]:
    suite = tmp_path / "suite.yaml"
    document = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "terminal"},
        "spec": {
            "tasks": [
                {
                    "id": "t",
                    "dataset": {
                        "idField": "id",
                        "rows": [
                            {"id": "ok", "output": "fine " + HOSTILE},
                            {"id": "bad", "output": HOSTILE},
                        ],
                    },
                    "outputs": {"column": "output"},
                    "grader": {"type": "python", "source": GRADER},
                }
            ]
        },
    }
    suite.write_text(yaml.safe_dump(document))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = run_bounded(
        "run", suite, "--sandbox", "process", "--db", db, "--output", tmp_path / "o.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert outcome.code == 0, outcome.stderr[-3000:]
    run_id = json.loads((tmp_path / "o.json").read_text())["run_id"]
    return run_id, db, outcome


def test_the_results_table_shows_metric_names_as_text(
    hostile_run: tuple[str, str, Outcome],
) -> None:
    _, _, outcome = hostile_run
    _views_are_clean(outcome, "run")
    assert "\\x1b[2J" in outcome.stdout  # the grader's metric name, visible


@pytest.mark.parametrize(
    "view",
    [
        ["samples", "{run}"],
        ["samples", "{run}", "--status", "invalid"],
        ["samples", "{run}", "--format", "json"],
        ["samples", "{run}", "--format", "jsonl"],
        ["runs"],
        ["runs", "--json"],
        ["compare", "{run}", "{run}"],
    ],
)
def test_every_view_shows_control_sequences_as_text(
    hostile_run: tuple[str, str, Outcome], view: list[str]
) -> None:
    run_id, db, _ = hostile_run
    outcome = run_bounded(*[part.format(run=run_id) for part in view], "--db", db)
    assert outcome.code == 0, outcome.stderr[-2000:]
    _views_are_clean(outcome, " ".join(view))
    if view[0] == "samples":
        assert "]52;c;" in outcome.stdout  # the clipboard write is there, as text


def test_a_csv_printed_to_a_terminal_shows_control_sequences_as_text(
    hostile_run: tuple[str, str, Outcome],
) -> None:
    """On a terminal the CSV's cells are shown as text; piped (``> file.csv``) the export
    keeps every byte (and quotes and defuses its cells: ``test_csv_cells.py``)."""
    run_id, db, _ = hostile_run
    primary, secondary = pty.openpty()
    with subprocess.Popen(
        [str(EVALKUBE), "samples", run_id, "--db", db, "--format", "csv"],
        stdout=secondary,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    ) as child:
        os.close(secondary)
        shown = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        child.wait(timeout=60)
    os.close(primary)
    text = shown.decode("utf-8", "replace").replace("\r\n", "\n")
    assert child.returncode == 0
    assert "]52;c;" in text
    assert not RAW.findall(text), RAW.findall(text)[:5]


def test_an_error_message_shows_control_sequences_as_text(tmp_path: Path) -> None:
    outcome = run_bounded("samples", "run-" + TITLE, "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert outcome.code == 2
    _views_are_clean(outcome, "error")
    assert "\\x1b]0;pwned\\x07" in outcome.stderr
