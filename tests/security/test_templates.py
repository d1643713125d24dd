"""Templates as an attacker writes them, through the real commands: a constant Jinja would
fold while compiling (``'x' * 500000000``, ``9 ** (9 ** 9)``) is refused at ``validate`` and
at ``import`` naming the field; a target or a built-in grader's reference that renders
10^10 characters in nested loops fails only its own sample at ``run``, the honest samples
are graded, and the host stays under 500 MB (:mod:`tests.security.bounded`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.security.bounded import PEAK_RSS_MB, run_bounded

pytestmark = pytest.mark.timeout(300)

GRADER = (
    "def grade(sample, item):\n    return 1.0 if sample['output_text'] == item['target'] else 0.0\n"
)
NESTED = (
    "{% if item.get('attack') %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "xxxxxxxxxx{% endfor %}{% endfor %}{% endif %}{{ item.answer }}"
)
ROWS = [
    {"id": "r0", "answer": "4", "output": "4"},
    {"id": "r1", "answer": "5", "output": "5", "attack": True},
    {"id": "r2", "answer": "7", "output": "7"},
    {"id": "r3", "answer": "8", "output": "9"},
]


def _suite(tmp_path: Path, task: dict[str, Any]) -> Path:
    base: dict[str, Any] = {
        "id": "t",
        "dataset": {"idField": "id", "rows": ROWS},
        "target": "{{ item.answer }}",
        "outputs": {"column": "output"},
        "grader": {"type": "python", "source": GRADER},
    }
    suite = tmp_path / "suite.yaml"
    document = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "templated"},
        "spec": {"tasks": [{**base, **task}]},
    }
    suite.write_text(yaml.safe_dump(document))
    return suite


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("{{ 'x' * 500000000 }}", "`*` would build more than"),
        ("{{ 9 ** (9 ** 9) }}", "`**` would build more than"),
        ("{{ 'x' * 100000 * 100000 }}", "`*` would build more than"),
        ("{{ '%0999999999d' % 1 }}", "a width of 999,999,999"),
    ],
)
def test_a_constant_over_budget_is_refused_at_validate(
    tmp_path: Path, template: str, named: str
) -> None:
    suite = _suite(tmp_path, {"target": template})
    outcome = run_bounded("validate", suite, "--sandbox", "process", cwd=tmp_path)
    assert outcome.code == 2, (outcome.code, outcome.stderr[-2000:])
    assert "tasks[t].target" in outcome.stderr, outcome.stderr
    assert named in outcome.stderr, outcome.stderr
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb


def test_a_constant_over_budget_is_refused_at_import(tmp_path: Path) -> None:
    fixture = Path(__file__).parent.parent / "fixtures" / "openai_eval_export.json"
    export = copy.deepcopy(json.loads(fixture.read_text()))
    export["eval"]["testing_criteria"][0]["reference"] = "{{ 'x' * 500000000 }}"
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    outcome = run_bounded("import", "openai", path, "--out", tmp_path / "out")
    assert outcome.code == 2, (outcome.code, outcome.stderr[-2000:])
    # named as the export spells it: the file the user holds
    assert "eval.testing_criteria[0].reference" in outcome.stderr, outcome.stderr
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb
    assert not (tmp_path / "out" / "suite.yaml").exists()


def _run(tmp_path: Path, suite: Path) -> list[dict[str, Any]]:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = run_bounded(
        "run", suite, "--sandbox", "process", "--db", db, "--quiet",
        "--output", tmp_path / "out.json", cwd=tmp_path,
    )  # fmt: skip
    assert outcome.code == 0, (outcome.code, outcome.stderr[-3000:])
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb
    run_id = json.loads((tmp_path / "out.json").read_text())["run_id"]
    listed = run_bounded("samples", run_id, "--db", db, "--format", "jsonl")
    assert listed.code == 0, listed.stderr
    views = [json.loads(line) for line in listed.stdout.splitlines()]
    return views


def test_a_target_rendering_gigabytes_fails_only_its_sample(tmp_path: Path) -> None:
    views = _run(tmp_path, _suite(tmp_path, {"target": NESTED}))
    by_id = {v["row_id"]: v for v in views}
    attacked = by_id["r1"]
    assert attacked["status"] == "errored"
    message = attacked["error"]["message"]
    assert message.startswith("target: ")
    # the output budget, or on a loaded machine the 2 s budget, stops it first
    assert "more than 1,000,000 characters" in message or "took longer than 2 s" in message
    assert [by_id[k]["scores"] for k in ("r0", "r2", "r3")] == [
        {"score": 1.0},
        {"score": 1.0},
        {"score": 0.0},
    ]


def test_a_reference_rendering_gigabytes_fails_only_its_sample(tmp_path: Path) -> None:
    grader = {
        "type": "string_check",
        "name": "match",
        "input": "{{ sample.output_text }}",
        "reference": NESTED,
        "operation": "eq",
    }
    views = _run(tmp_path, _suite(tmp_path, {"grader": grader}))
    by_id = {v["row_id"]: v for v in views}
    attacked = by_id["r1"]
    assert attacked["status"] == "invalid"
    message = attacked["judge"]["error"]["message"]
    assert message.startswith("tasks[t].grader.reference: ")
    assert "more than 1,000,000 characters" in message or "took longer than 2 s" in message
    assert [by_id[k]["scores"]["score"] for k in ("r0", "r2", "r3")] == [1.0, 1.0, 0.0]
