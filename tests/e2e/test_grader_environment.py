"""`evalkube run` with the grader environment: OpenAI's docs grader scores as rapidfuzz does,
a task's own directory is importable, and an image is refused locally naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evalkube.sandbox.environment import default_dir, default_site_packages
from tests.conftest import require

pytestmark = pytest.mark.timeout(180)

EVALKUBE = Path(sys.executable).parent / "evalkube"
DOCS_GRADER = """from rapidfuzz import fuzz, utils

def grade(sample, item) -> float:
    output_text = sample["output_text"]
    reference_answer = item["reference_answer"]
    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0
"""
ROWS = [
    {"reference_answer": "Eiffel Tower", "output": "the eiffel tower"},
    {"reference_answer": "Paris", "output": "Paris, France"},
    {"reference_answer": "Mount Kilimanjaro", "output": "no idea"},
]


def _suite(tmp_path: Path, grader: dict[str, object]) -> Path:
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "env"},
        "spec": {
            "tasks": [
                {
                    "id": "fuzzy",
                    "dataset": {"rows": ROWS},
                    "prompt": "Where? {{ item.reference_answer }}",
                    "target": "{{ item.reference_answer }}",
                    "outputs": {"column": "output"},
                    "grader": {"type": "python", "metricId": "fuzzy", **grader},
                }
            ]
        },
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _run(tmp_path: Path, suite: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVALKUBE), "run", str(suite), "--sandbox", "gvisor", "--quiet",
         "--db", str(tmp_path / "r.db"), "--output", str(tmp_path / "results.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip


def _metric(tmp_path: Path) -> float:
    results = json.loads((tmp_path / "results.json").read_text())
    (task,) = results["results"]
    assert task["task"] == "fuzzy"
    assert task["counts"]["valid"] == 3, task
    value: float = task["metrics"]["fuzzy"]
    return value


def test_openai_docs_grader_scores_as_rapidfuzz_does(tmp_path: Path) -> None:
    site = default_site_packages()
    if site is None:
        require(f"the grader environment ({default_dir()}): run `make grader-env`")
        pytest.skip("the grader environment is not created: make grader-env")
    done = _run(tmp_path, _suite(tmp_path, {"source": DOCS_GRADER}))
    assert done.returncode == 0, done.stderr
    code = (
        "import json, sys; sys.path.append(sys.argv[1]); from rapidfuzz import fuzz, utils; "
        f"rows = {ROWS!r}; print(json.dumps(sum(fuzz.WRatio(r['output'], r['reference_answer'], "
        "processor=utils.default_process) / 100.0 for r in rows) / len(rows)))"
    )
    expected = json.loads(
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, str(site)],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    assert _metric(tmp_path) == pytest.approx(expected, abs=1e-6)


def test_a_task_names_its_own_directory_relative_to_the_suite(tmp_path: Path) -> None:
    own = tmp_path / "own-env"
    own.mkdir()
    (own / "evalkube_e2e_scorer.py").write_text("def score(a, b):\n    return 0.5\n")
    source = "import evalkube_e2e_scorer\n\ndef grade(sample, item):\n" + (
        "    return evalkube_e2e_scorer.score(sample['output_text'], item['reference_answer'])\n"
    )
    done = _run(tmp_path, _suite(tmp_path, {"source": source, "environment": "./own-env"}))
    assert done.returncode == 0, done.stderr
    assert _metric(tmp_path) == 0.5


def test_an_image_or_a_missing_directory_is_refused_naming_the_field(tmp_path: Path) -> None:
    source = "def grade(sample, item):\n    return 1.0\n"
    done = _run(tmp_path, _suite(tmp_path, {"source": source, "environment": "./nowhere"}))
    assert done.returncode != 0
    assert "tasks[fuzzy].grader.environment" in done.stderr
    assert "not a directory" in done.stderr
    done = _run(tmp_path, _suite(tmp_path, {"source": source, "environment": "ghcr.io/a/g:1"}))
    assert done.returncode != 0
    assert "tasks[fuzzy].grader.environment" in done.stdout + done.stderr
    assert "only a cluster run can use" in done.stdout + done.stderr
