"""The operator's suite check accepts the built-in graders that call models: a pod's runner
makes their calls through the bridge sidecar (``engine/judging.py``)."""

from __future__ import annotations

from evalkube.controller.snapshot import check_suite


def test_model_graders_pass_the_cluster_suite_check() -> None:
    messages = [{"role": "user", "content": "{{ sample.output_text }}"}]
    task = {
        "id": "t",
        "dataset": {"rows": [{"a": 1}]},
        "outputs": {"column": "a"},
        "graders": [
            {"type": "string_check", "name": "s", "input": "x", "reference": "x",
             "operation": "eq"},
            {"type": "score_model", "name": "q", "input": messages},
            {"type": "label_model", "name": "l", "input": messages, "labels": ["a", "b"],
             "passingLabels": ["a"]},
            {"type": "text_similarity", "name": "c", "input": "{{ sample.output_text }}",
             "reference": "x", "evaluationMetric": "cosine", "passThreshold": 0.8},
        ],
    }  # fmt: skip
    check = check_suite("ns", {"tasks": [task]}, lambda ns, cm, key: None)
    assert check.problems == []
    assert {t: d.rows for t, d in check.datasets.items()} == {"t": 1}
