"""``evalkube samples`` exports as users run them: a real subprocess over a real store (SQLite
and PostgreSQL), and over the operator's samples API served on loopback."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from evalkube.controller.api import ApiServer
from evalkube.controller.metrics import OperatorMetrics
from evalkube.controller.registry import RunEntry, RunRegistry, digest
from evalkube.store import ResultStore, RunRecord, SampleRecord

pytestmark = pytest.mark.timeout(180)

EVALKUBE = Path(sys.executable).parent / "evalkube"
RUN = "big-run"
#: More than the old 1,000-sample cap and more than two pages of the export.
N = 2345
TRACEBACK = "Traceback (most recent call last):\n  File \"grader.py\", line 3\nKeyError: 'x'"


def sample(i: int) -> SampleRecord:
    """Every 5th errored (with a traceback), every 7th invalid, the rest valid: odd ones
    wrong (exact 0). Samples 2k and 2k+1 grade dataset row ``q{k}``."""
    if i % 5 == 0:
        return SampleRecord(
            RUN, f"s{i:05d}", "qa", "m", i, "errored", row_id=f"q{i // 2}", target=str(i),
            output_text=f"out {i}",
            error={"stage": "grading", "type": "KeyError", "message": "'x'",
                   "traceback": TRACEBACK},
        )  # fmt: skip
    status = "invalid" if i % 7 == 0 else "valid"
    return SampleRecord(
        RUN, f"s{i:05d}", "qa" if i % 2 else "math", "m", i, status,  # type: ignore[arg-type]
        row_id=f"q{i // 2}", target=str(i),
        output_text=f'said "{i}",\nthen, more' if i == 3 else f"out {i}",
        scores={"exact": float(i % 2 == 0), "f1": round((i % 100) / 100, 2)},
    )  # fmt: skip


def seed(store: ResultStore) -> list[SampleRecord]:
    store.create_run(RunRecord(RUN, "suite", "sha256:0", {}, "process"))
    records = [sample(i) for i in range(N)]
    store.record_samples(records)
    return records


def url_of(store: ResultStore) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def evalkube(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVALKUBE), *args], cwd=cwd, capture_output=True, text=True, timeout=150
    )


def ids(records: list[SampleRecord]) -> list[str]:
    return sorted(r.sample_id for r in records)


def test_jsonl_export_streams_every_sample(store: ResultStore, tmp_path: Path) -> None:
    records = seed(store)
    done = evalkube("samples", RUN, "--format", "jsonl", "--db", url_of(store), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    views = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(views) == N
    assert sorted(v["sample_id"] for v in views) == ids(records)
    errored = next(v for v in views if v["status"] == "errored")
    assert errored["error"]["traceback"] == TRACEBACK


def test_csv_export_to_a_file_parses_back(store: ResultStore, tmp_path: Path) -> None:
    seed(store)
    out = tmp_path / "samples.csv"
    done = evalkube(
        "samples", RUN, "--format", "csv", "--out", str(out), "--db", url_of(store), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {N} samples to {out}" in done.stderr
    with out.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == N
    assert list(rows[0])[:7] == [
        "sample_id", "task_id", "model", "status", "row_id", "score:exact", "score:f1",
    ]  # fmt: skip
    by_id = {row["sample_id"]: row for row in rows}
    assert by_id["s00003"]["output_text"] == 'said "3",\nthen, more'
    assert by_id["s00003"]["score:f1"] == "0.03"
    assert by_id["s00010"]["error_traceback"] == TRACEBACK
    assert by_id["s00010"]["score:exact"] == ""
    assert by_id["s00010"]["error_type"] == "KeyError"


def test_filters_select_exactly_the_matching_samples(store: ResultStore, tmp_path: Path) -> None:
    records = seed(store)
    db = url_of(store)

    def exported(*options: str) -> list[str]:
        done = evalkube("samples", RUN, "-f", "jsonl", "--db", db, *options, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return sorted(json.loads(line)["sample_id"] for line in done.stdout.splitlines())

    wrong = [r for r in records if r.status == "valid" and r.scores["exact"] == 0.0]
    assert exported("--status", "wrong") == ids(wrong)
    valid = [r for r in records if r.status == "valid"]
    assert len(valid) > 1000  # more than one page of the export
    assert exported("--status", "valid") == ids(valid)
    ranged = [r for r in records if 0.2 <= r.scores.get("f1", -1) <= 0.25 and r.task_id == "qa"]
    assert exported("--min-score", "f1=0.2", "--max-score", "f1=0.25", "--task", "qa") == ids(
        ranged
    )
    assert exported("--search", "KEYERROR", "--limit", "7") == ids(
        [r for r in records if r.status == "errored"][:7]
    )
    assert exported("--search", "then, MORE") == ["s00003"]
    assert exported("--row", "q7") == ["s00014", "s00015"]
    assert exported("--row", "q7", "--task", "qa") == ["s00015"]
    assert exported("--row", "q1173") == []  # past the last row
    assert exported("--row", "Q7") == []  # ids match exactly


def test_the_table_names_each_sample_by_its_row(store: ResultStore, tmp_path: Path) -> None:
    """The panel's title (the line a person scans) leads with the dataset row id; the sample
    id is in the panel."""
    seed(store)
    table = evalkube("samples", RUN, "--row", "q21", "--db", url_of(store), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    titles = [line for line in table.stdout.splitlines() if line.startswith("╭")]
    assert len(titles) == 2
    assert titles[0].startswith("╭─ row q21 · math · m · invalid ")
    assert titles[1].startswith("╭─ row q21 · qa · m · valid ")
    assert "│ sample: s00042 " in table.stdout
    assert "│ sample: s00043 " in table.stdout


def test_json_stays_an_array_and_the_table_shows_ten(store: ResultStore, tmp_path: Path) -> None:
    seed(store)
    db = url_of(store)
    done = evalkube("samples", RUN, "--json", "--status", "errored", "--db", db, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    views = json.loads(done.stdout)
    assert len(views) == len(range(0, N, 5))
    table = evalkube("samples", RUN, "--status", "errored", "--db", db, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("errored") == 10
    assert "showing the first 10; more samples match" in table.stderr
    # the traceback is printed as the lines Python wrote, not a JSON string
    lines = table.stdout.splitlines()
    assert any(line.startswith('│   File "grader.py", line 3 ') for line in lines)
    assert "\\n" not in table.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--min-score", "0.5"], "--min-score takes METRIC=VALUE"),
        (["--max-score", "f1=high"], "--max-score: 'high' is not a number"),
        (["--status", "broken"], "--status must be one of failed, valid, wrong"),
        (["--format", "xml"], "--format must be one of table, json, jsonl, csv"),
    ],
)
def test_bad_options_are_exit_2_naming_the_option(
    tmp_path: Path, options: list[str], message: str
) -> None:
    db = tmp_path / "r.db"
    done = evalkube("samples", "any", "--db", str(db), *options, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr


def test_an_unwritable_out_is_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "x.csv"
    done = evalkube("samples", "any", "-f", "csv", "--out", str(missing), cwd=tmp_path)
    assert done.returncode == 2
    assert f"cannot write --out {missing}: No such file or directory" in done.stderr.replace(
        "\n", ""
    )


def test_unknown_run_names_the_store_file(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    done = evalkube("samples", "nope", cwd=tmp_path / "work")
    assert done.returncode == 2
    assert f"not in the store {tmp_path / 'work' / '.evalkube' / 'results.db'}" in done.stderr


# -- through the operator's samples API --------------------------------------------------------
TOKEN = "read-token"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, list[SampleRecord]]]:
    """The operator's API application on a loopback port, in a thread of its own."""
    store = ResultStore.open(f"sqlite:///{tmp_path / 'operator.db'}")
    records = seed(store)
    registry = RunRegistry()
    registry.register(RunEntry("team", "nightly", RUN, "suite", digest("ingest")))
    server = ApiServer(store, registry, OperatorMetrics(), read_token=TOKEN)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.api_app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", records
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        store.close()


def api_samples(base: str, cwd: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVALKUBE), "samples", "nightly", "--api", base, "-n", "team", *options],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "EVALKUBE_API_TOKEN": TOKEN},
    )


def test_api_export_follows_the_cursor_to_the_end(
    api: tuple[str, list[SampleRecord]], tmp_path: Path
) -> None:
    base, records = api
    done = api_samples(base, tmp_path, "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line)["sample_id"] for line in done.stdout.splitlines()]
    assert len(seen) == N
    assert sorted(seen) == ids(records)


def test_api_export_filters_and_csv(api: tuple[str, list[SampleRecord]], tmp_path: Path) -> None:
    base, records = api
    done = api_samples(base, tmp_path, "-f", "csv", "--status", "wrong", "--max-score", "f1=0.5")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout, newline="")))
    expected = [
        r
        for r in records
        if r.status == "valid" and r.scores["exact"] == 0 and r.scores["f1"] <= 0.5
    ]
    assert sorted(row["sample_id"] for row in rows) == ids(expected)
    assert {row["score:exact"] for row in rows} == {"0.0"}
    row = api_samples(base, tmp_path, "-f", "jsonl", "--row", "q101", "--task", "math")
    assert row.returncode == 0, row.stderr
    assert [json.loads(line)["sample_id"] for line in row.stdout.splitlines()] == ["s00202"]
    limited = api_samples(base, tmp_path, "-f", "jsonl", "--limit", "1500")
    assert limited.returncode == 0, limited.stderr
    assert len(limited.stdout.splitlines()) == 1500
