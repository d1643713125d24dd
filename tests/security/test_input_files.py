"""Suite, run, dataset and outputs files as an attacker writes them: every one is refused
with exit 2 and a message naming the field, within 500 MB of host RSS, never hanging.

Attacks: a YAML alias bomb (under 1 KB, billions of nodes once expanded) in a suite file and
in a run file; a recursive alias; a dataset or outputs path that is ``/dev/zero``, a FIFO
with no writer, or a file whose first line is 1 GB; a dataset line nested too deeply for
the parser; a CSV record spread over lines past the record cap; an alias bomb or
``/dev/zero`` as ``evalkube proxy --run-spec``. Each runs ``evalkube validate`` /
``evalkube run`` / ``evalkube proxy`` in a child process (:mod:`tests.security.bounded`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.security.bounded import PEAK_RSS_MB, run_bounded

pytestmark = pytest.mark.timeout(300)

GRADER = "def grade(sample, item):\n    return 1.0 if sample['output_text'] == item['a'] else 0.0\n"


def _alias_bomb(levels: int = 9, fan: int = 10) -> str:
    """YAML where each anchor repeats the previous one ``fan`` times: fan**levels strings."""
    lines = ['b0: &b0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*b{level - 1}"] * fan)
        lines.append(f"b{level}: &b{level} [{refs}]")
    return "\n".join(lines) + "\n"


def _suite(
    dataset: dict[str, object],
    outputs: dict[str, object] | None = None,
    grader: dict[str, object] | None = None,
) -> str:
    task = {
        "id": "qa",
        "dataset": dataset,
        "target": "{{ item.a }}",
        "outputs": outputs or {"column": "out"},
        "grader": grader or {"type": "python", "source": GRADER},
    }
    return yaml.safe_dump(
        {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalSuite",
            "metadata": {"name": "attacked"},
            "spec": {"tasks": [task]},
        }
    )


def _refused(args: list[str | Path], cwd: Path, *expected: str) -> str:
    outcome = run_bounded(*args, cwd=cwd)
    assert outcome.code == 2, (outcome.code, outcome.stderr[-3000:])
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    for text in expected:
        assert text in outcome.stderr, outcome.stderr[-3000:]
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb
    return outcome.stderr


def test_a_yaml_alias_bomb_in_a_suite_file_is_refused(tmp_path: Path) -> None:
    """A row (free-form data) holds the anchors; 1e9 strings once walked."""
    bomb = _alias_bomb()
    assert len(bomb) < 1024
    row = "{a: x, out: x, " + ", ".join(bomb.strip().splitlines()) + "}"
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"rows": [{"a": "x"}]}).replace("- a: x", "- " + row))
    assert "*b8" in suite.read_text()
    _refused(["validate", suite, "--sandbox", "process"], tmp_path, str(suite), "alias")


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        _suite({"rows": [{"a": "x"}]}).replace("- a: x", "- {a: x, out: x, loop: &l [*l]}")
    )
    _refused(["validate", suite, "--sandbox", "process"], tmp_path, "recursive alias")


def test_yaml_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    deep = "[" * 100_000 + "]" * 100_000
    suite.write_text(
        _suite({"rows": [{"a": "x"}]}).replace("- a: x", "- {a: x, deep: " + deep + "}")
    )
    _refused(["validate", suite, "--sandbox", "process"], tmp_path, str(suite), "YAML error")


def test_a_dataset_that_is_dev_zero_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"path": "/dev/zero"}))
    _refused(
        ["validate", suite, "--sandbox", "process"],
        tmp_path,
        "tasks[qa].dataset.path",
        "character device",
    )


def test_a_dataset_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "rows.jsonl")
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"path": "rows.jsonl"}))
    _refused(["run", suite, "--sandbox", "process"], tmp_path, "tasks[qa].dataset.path", "FIFO")


def test_a_gigabyte_line_is_refused_after_reading_the_cap(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    with rows.open("wb") as handle:  # sparse: a 1 GB line of NUL bytes, no disk used
        handle.truncate(1024**3)
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"path": "rows.jsonl"}))
    for command in ("validate", "run"):
        _refused(
            [command, suite, "--sandbox", "process"],
            tmp_path,
            "line 1: longer than",
            "a row must fit in one line",
        )


def test_an_outputs_file_that_is_dev_zero_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"rows": [{"a": "x"}]}, outputs={"path": "/dev/zero"}))
    _refused(["run", suite, "--sandbox", "process"], tmp_path, "outputs", "character device")


def test_a_line_nested_too_deeply_names_the_line(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": "x", "out": "x"}\n' + '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"path": "rows.jsonl"}))
    _refused(["validate", suite, "--sandbox", "process"], tmp_path, "rows.jsonl line 2")


def test_a_grader_file_that_is_dev_zero_is_refused(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        _suite({"rows": [{"a": "x", "out": "x"}]}, grader={"type": "python", "file": "/dev/zero"})
    )
    _refused(
        ["validate", suite, "--sandbox", "process"],
        tmp_path,
        "tasks[qa].grader.file",
        "character device",
    )


def test_a_csv_record_spread_over_many_lines_is_refused_at_the_cap(tmp_path: Path) -> None:
    """Each 4 MiB line closes the quote the line before opened, then holds 4M empty fields
    and opens another: one record of 80M fields (over 600 MB as a list) unless capped."""
    rows = tmp_path / "rows.csv"
    line = b'"' + b"," * (4 * 1024 * 1024) + b'"\n'
    with rows.open("wb") as handle:
        handle.write(b'a,out\n"\n')
        for _ in range(20):
            handle.write(line)
    suite = tmp_path / "suite.yaml"
    suite.write_text(_suite({"uri": "rows.csv"}))
    _refused(
        ["validate", suite, "--sandbox", "process"],
        tmp_path,
        "tasks[qa].dataset.uri",
        "rows.csv line 2: a CSV record longer than 8,388,608 bytes",
    )


def test_a_yaml_alias_bomb_as_the_proxy_run_spec_is_refused(tmp_path: Path) -> None:
    """``evalkube proxy --run-spec`` reads its file as a run file is read: the bomb is
    refused before any object is built, and nothing is served."""
    spec = tmp_path / "run.yaml"
    spec.write_text("models: [precomputed]\n" + _alias_bomb())
    outcome = run_bounded("proxy", "--run-spec", spec, cwd=tmp_path, timeout=60)
    assert outcome.code == 2, (outcome.code, outcome.stderr[-3000:])
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    assert f"evalkube proxy: {spec}: refused: its aliases expand" in outcome.stderr
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb


def test_a_proxy_run_spec_that_is_dev_zero_is_refused(tmp_path: Path) -> None:
    outcome = run_bounded("proxy", "--run-spec", "/dev/zero", cwd=tmp_path, timeout=60)
    assert outcome.code == 2, (outcome.code, outcome.stderr[-3000:])
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    assert "/dev/zero: is a character device" in outcome.stderr
    assert outcome.peak_rss_mb < PEAK_RSS_MB, outcome.peak_rss_mb
