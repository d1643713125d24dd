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


def test_missing_config_map_keys_name_the_field_and_the_key() -> None:
    """A grader file and a dataset in ConfigMaps that do not exist are reported per field;
    present ones are read, counted and recorded as the snapshot's sources."""
    stored = {("ns", "code", "grade.py"): "def grade(sample, item):\n    return 1\n"}
    missing = {
        "id": "m",
        "dataset": {"configMapRef": {"name": "rows", "key": "rows.jsonl"}},
        "prompt": "x",
        "grader": {"type": "python", "file": "code/absent.py"},
    }
    present = {
        **missing,
        "id": "p",
        "dataset": {"configMapRef": {"name": "code", "key": "grade.py"}},
        "grader": {"type": "python", "file": "code/grade.py"},
    }
    check = check_suite("ns", {"tasks": [missing, present]}, lambda *ref: stored.get(ref))
    assert check.problems == [
        "spec.tasks[0].grader.file: ConfigMap 'code' has no key 'absent.py' (or does not exist) "
        "in namespace ns",
        "spec.tasks[0].dataset.configMapRef: ConfigMap 'rows' has no key 'rows.jsonl' (or does "
        "not exist) in namespace ns",
    ]
    assert check.sources == {
        "p/grader": (stored["ns", "code", "grade.py"], "configmap/code/grade.py")
    }
    assert check.datasets["p"].rows == 2
    assert (check.datasets["p"].config_map, check.datasets["p"].key) == ("code", "grade.py")


def test_uri_sources_are_checked_without_reading_them() -> None:
    """The operator checks a uri's shape only: its rows are counted by the run's prepare pod."""
    grader = {"type": "python", "source": "def grade(sample, item):\n    return 1\n"}
    tasks = [
        {"id": "s", "dataset": {"uri": "s3://bucket/mmlu.parquet"}, "prompt": "x",
         "grader": grader},
        {"id": "o", "dataset": {"rows": [{"a": 1}]}, "outputs": {"uri": "pvc://claim/out.jsonl.gz"},
         "grader": grader},
        {"id": "l", "dataset": {"uri": "data/local.jsonl"}, "prompt": "x", "grader": grader},
        {"id": "f", "dataset": {"uri": "s3://bucket/x.txt"}, "prompt": "x", "grader": grader},
    ]  # fmt: skip
    check = check_suite("ns", {"tasks": tasks}, lambda ns, cm, key: None)
    assert check.problems == [
        "spec.tasks[2].dataset.uri: 'data/local.jsonl' is a local path, which a cluster cannot "
        "read; use s3://BUCKET/KEY, pvc://CLAIM/PATH or https://... with sha256 (`evalkube "
        "submit` uploads local files)",
        "spec.tasks[3].dataset.uri: cannot tell the format of 'x.txt' from its name; name it "
        ".jsonl, .parquet or .csv (.gz or .zst compressed for JSONL and CSV) or set `format`",
    ]
    assert check.datasets["s"].uri == "s3://bucket/mmlu.parquet"
    assert check.datasets["s"].rows is None


def test_config_map_rows_are_counted_as_the_runner_reads_them() -> None:
    """U+2028, U+2029 and U+0085 may stand raw inside a JSON string: they do not end a row."""
    rows = '{"q": "a\u2028b"}\n\n{"q": "c\u0085d\u2029"}\n'
    grader = {"type": "python", "source": "def grade(s, i): return 1"}
    task = {"id": "t", "dataset": {"configMapRef": {"name": "d", "key": "rows.jsonl"}},
            "prompt": "x", "grader": grader}  # fmt: skip
    check = check_suite("ns", {"tasks": [task]}, lambda ns, cm, key: rows)
    assert check.problems == []
    assert check.datasets["t"].rows == 2
