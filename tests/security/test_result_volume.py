"""Results at the per-result cap, in volume: a grader whose every answer carries a judge of
almost 1 MB. The runner hands samples to the store by bytes as well as by count, so the
host stays under 500 MB however many such samples a unit has (before: all of a unit's
samples, up to 5,000, waited in memory, then were encoded at once), every sample is
stored; the HTML report cuts each field and bounds its page, pointing to
``evalkube samples`` for the rest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evalkube import limits
from tests.security.bounded import PEAK_RSS_MB, run_bounded

pytestmark = pytest.mark.timeout(600)

SAMPLES = 300
GRADER = """
import time

def grade(sample, item):
    time.sleep(0.002)   # a few answers per frame: the worker's frame cap is not the point
    return {"scores": {"score": 1.0}, "judge": {"blob": item["id"] * 190_000}}
"""


def test_results_at_the_cap_keep_the_host_flat_and_the_report_bounded(tmp_path: Path) -> None:
    rows = [{"id": f"r{n:04d}", "output": "x"} for n in range(SAMPLES)]
    suite = tmp_path / "suite.yaml"
    document = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "volume"},
        "spec": {
            "tasks": [
                {
                    "id": "t",
                    "dataset": {"idField": "id", "rows": rows},
                    "outputs": {"column": "output"},
                    "grader": {"type": "python", "source": GRADER},
                }
            ]
        },
    }
    suite.write_text(yaml.safe_dump(document))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = run_bounded(
        "run", suite, "--sandbox", "process", "--db", db, "--quiet",
        "--output", tmp_path / "out.json", cwd=tmp_path,
    )  # fmt: skip
    assert outcome.code == 0, outcome.stderr[-3000:]
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb
    (result,) = json.loads((tmp_path / "out.json").read_text())["results"]
    assert result["counts"]["valid"] == SAMPLES
    assert result["metrics"]["score"] == 1.0
    run_id = json.loads((tmp_path / "out.json").read_text())["run_id"]

    exported = run_bounded(
        "samples", run_id, "--db", db, "--format", "jsonl", "--out", tmp_path / "all.jsonl"
    )
    assert exported.code == 0, exported.stderr[-2000:]
    assert exported.peak_rss_mb < PEAK_RSS_MB, exported.peak_rss_mb
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == SAMPLES

    page = tmp_path / "report.html"
    made = run_bounded("report", run_id, "--db", db, "--out", page)
    assert made.code == 0, made.stderr[-2000:]
    assert made.peak_rss_mb < PEAK_RSS_MB, made.peak_rss_mb
    html = page.read_text()
    # each judge cut at the field cap: ~5 KB per sample instead of ~1 MB
    assert len(html.encode()) < SAMPLES * (limits.REPORT_FIELD_CHARS + 2_000) + 1024**2
    assert html.count('class="sample"') == SAMPLES
    assert f"evalkube samples {run_id} --format jsonl" in html
    assert "more characters: the whole field" in html
