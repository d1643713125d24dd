"""The operator's suite check refuses what a cluster cannot run yet, naming the field."""

from __future__ import annotations

from evalkube.controller.snapshot import check_suite


def test_model_graders_are_refused_in_a_cluster_with_what_to_use() -> None:
    messages = [{"role": "user", "content": "{{ sample.output_text }}"}]
    task = {
        "id": "t",
        "dataset": {"rows": [{"a": 1}]},
        "outputs": {"column": "a"},
        "graders": [
            {"type": "string_check", "name": "s", "input": "x", "reference": "x",
             "operation": "eq"},
            {"type": "score_model", "name": "q", "input": messages},
        ],
    }  # fmt: skip
    check = check_suite("ns", {"tasks": [task]}, lambda ns, cm, key: None)
    assert check.problems == [
        "spec.tasks[0].graders[1]: score_model graders run only in `evalkube run` for now "
        "(the work-unit runner cannot reach the model bridge yet); use a model_backed python "
        "grader with ctx.responses_create in a cluster"
    ]
