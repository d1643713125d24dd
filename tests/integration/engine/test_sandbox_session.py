"""GraderSandbox over the plain-process backend: batches, deadlines, crashes, probe mode."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from evalkube.engine.grade import execution_outcome
from evalkube.sandbox import Execution, GraderSandbox, ProcessBackend, Program, ProgramLoadError

pytestmark = pytest.mark.timeout(120)

#: ``grade`` behaves according to ``sample["do"]``; everything else returns ``sample["n"]``.
GRADER = """
import os, sys, time

def grade(sample, item):
    do = sample.get("do")
    if do == "sleep":
        time.sleep(60)
    elif do == "spin":
        while True:
            pass
    elif do == "hold_gil":
        sum(range(10 ** 12))  # C code: the heartbeat thread cannot run
    elif do == "exit_process":
        os._exit(7)
    elif do == "sys_exit":
        sys.exit(3)
    elif do == "raise":
        raise ValueError("asked to raise")
    elif do == "print":
        print("n =", sample["n"])
    return sample["n"]
"""


@pytest.fixture
def sandbox() -> Iterator[GraderSandbox]:
    box = GraderSandbox(
        ProcessBackend(), [Program("grader", GRADER, "/graders/g.py", "grade")], task_id="t"
    )
    box.start()
    try:
        yield box
    finally:
        box.close()


def items(count: int, special: dict[int, str] | None = None) -> list[tuple[list[Any], str]]:
    special = special or {}
    out = []
    for n in range(count):
        sample: dict[str, Any] = {"n": n}
        if n in special:
            sample["do"] = special[n]
        out.append(([sample, {}], f"s_{n}"))
    return out


def run(
    box: GraderSandbox, work: list[tuple[list[Any], str]], timeout: float = 5
) -> list[Execution]:
    results = list(box.execute("grader", work, timeout=timeout))
    assert [e.index for e in results] == list(range(len(work)))
    return results


def test_many_batches_in_order(sandbox: GraderSandbox) -> None:
    sandbox.batch_size = 64
    results = run(sandbox, items(1_000))
    assert all(e.status == "returned" for e in results)
    assert [e.value for e in results] == list(range(1_000))
    assert sandbox.restarts == 0


def test_items_are_consumed_lazily(sandbox: GraderSandbox) -> None:
    pulled: list[int] = []

    def source() -> Iterator[tuple[list[Any], str]]:
        for n in range(100):
            pulled.append(n)
            yield [{"n": n}, {}], f"s_{n}"

    sandbox.batch_size = 10
    stream = sandbox.execute("grader", source(), timeout=5)
    first = next(stream)
    assert first.value == 0
    assert len(pulled) <= 30  # at most a couple of batches ahead, not the whole input
    assert [e.value for e in stream] == list(range(1, 100))


def test_prints_are_captured_per_execution(sandbox: GraderSandbox) -> None:
    results = run(sandbox, items(3, {1: "print"}))
    assert [e.stdout for e in results] == [None, "n = 1\n", None]


def test_exception_is_an_answer_not_a_restart(sandbox: GraderSandbox) -> None:
    results = run(sandbox, items(5, {2: "raise"}))
    assert [e.status for e in results] == ["returned", "returned", "raised", "returned", "returned"]
    assert results[2].error is not None
    assert results[2].error["type"] == "ValueError"
    assert results[2].error["message"] == "asked to raise"
    assert 'File "/graders/g.py", line 18, in grade' in results[2].error["traceback"]
    assert sandbox.restarts == 0


def test_sys_exit_is_invalid_and_the_worker_survives(sandbox: GraderSandbox) -> None:
    results = run(sandbox, items(4, {1: "sys_exit"}))
    assert [e.status for e in results] == ["returned", "raised", "returned", "returned"]
    outcome = execution_outcome(results[1], "score")
    assert outcome.status == "invalid"
    assert outcome.scores == {"score": 0.0}
    assert outcome.error is not None
    assert outcome.error["type"] == "SystemExit"
    assert sandbox.restarts == 0


@pytest.mark.parametrize("behaviour", ["sleep", "spin"])
def test_timeout_mid_batch_kills_only_that_execution(
    sandbox: GraderSandbox, behaviour: str
) -> None:
    started = time.monotonic()
    results = run(sandbox, items(40, {17: behaviour}), timeout=1)
    elapsed = time.monotonic() - started
    statuses = [e.status for e in results]
    assert statuses.count("timeout") == 1
    assert statuses[17] == "timeout"
    assert all(s == "returned" for i, s in enumerate(statuses) if i != 17)
    assert [e.value for i, e in enumerate(results) if i != 17] == [n for n in range(40) if n != 17]
    error = results[17].error
    assert error is not None
    assert error["type"] == "Timeout"
    assert "timeout_seconds=1" in error["message"]
    outcome = execution_outcome(results[17], "score")
    assert (outcome.status, outcome.scores) == ("invalid", {"score": 0.0})
    assert sandbox.restarts == 1
    assert elapsed < 15


def test_timeout_of_code_holding_the_gil_is_pinned_on_the_right_sample(
    sandbox: GraderSandbox,
) -> None:
    sandbox.batch_size = 16
    results = run(sandbox, items(30, {9: "hold_gil"}), timeout=1)
    statuses = [e.status for e in results]
    assert statuses.count("timeout") == 1, statuses
    assert statuses[9] == "timeout"
    assert [e.value for i, e in enumerate(results) if i != 9] == [n for n in range(30) if n != 9]


@pytest.mark.parametrize("position", [0, 5, 63, 99])
def test_process_exit_mid_batch_is_pinned_on_the_right_sample(
    sandbox: GraderSandbox, position: int
) -> None:
    sandbox.batch_size = 64
    results = run(sandbox, items(100, {position: "exit_process"}))
    statuses = [e.status for e in results]
    assert statuses.count("crashed") == 1, statuses
    assert statuses[position] == "crashed"
    assert [e.value for i, e in enumerate(results) if i != position] == [
        n for n in range(100) if n != position
    ]
    error = results[position].error
    assert error is not None
    assert error["type"] == "WorkerCrashed"
    assert "code 7" in error["message"]
    assert sandbox.restarts >= 1


def test_several_crashes_and_timeouts_in_one_stream(sandbox: GraderSandbox) -> None:
    sandbox.batch_size = 32
    special = {3: "exit_process", 40: "sleep", 41: "exit_process", 90: "raise"}
    results = run(sandbox, items(120, special), timeout=1)
    expected = {3: "crashed", 40: "timeout", 41: "crashed", 90: "raised"}
    assert {i: e.status for i, e in enumerate(results) if e.status != "returned"} == expected
    assert all(e.value == i for i, e in enumerate(results) if i not in expected)


def test_sandbox_can_run_again_after_failures(sandbox: GraderSandbox) -> None:
    run(sandbox, items(3, {1: "exit_process"}))
    again = run(sandbox, items(3))
    assert [e.value for e in again] == [0, 1, 2]


def test_close_stops_the_worker() -> None:
    box = GraderSandbox(ProcessBackend(), [Program("grader", GRADER, "g.py", "grade")], task_id="t")
    box.start()
    assert box._live is not None
    popen = box._live.process.popen
    box.close()
    assert popen.poll() is not None


@pytest.mark.parametrize(
    ("source", "kind", "line"),
    [
        ("def grade(sample, item):\n    return (\n", "SyntaxError", 2),
        ("def score(sample, item):\n    return 1\n", "MissingFunction", None),
        ("x = 1\nraise RuntimeError('boom at import')\n", "RuntimeError", 2),
    ],
)
def test_load_errors(source: str, kind: str, line: int | None) -> None:
    box = GraderSandbox(ProcessBackend(), [Program("grader", source, "g.py", "grade")], task_id="t")
    with pytest.raises(ProgramLoadError) as info:
        box.start()
    assert info.value.program == "grader"
    assert info.value.error["type"] == kind
    assert info.value.error.get("line") == line
    box.close()


def test_ctx_detection_is_reported(sandbox: GraderSandbox) -> None:
    assert sandbox.wants_ctx == {"grader": False}
    programs = [
        Program("grader", "def grade(s, i, ctx):\n    return 1\n", "g.py", "grade"),
        Program("preprocess", "def transform(row):\n    return row\n", "p.py", "transform"),
    ]
    with GraderSandbox(ProcessBackend(), programs, task_id="t") as box:
        assert box.wants_ctx == {"grader": True, "preprocess": False}
