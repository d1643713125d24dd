"""Every backend for real: grading, deadlines, restarts and each limit of ``evalkube.limits``.

Under CI every backend must run (a skip there is a failure, see ``support.backend``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest

from evalkube.sandbox import (
    AUTO_ORDER,
    GraderSandbox,
    GVisorBackend,
    SandboxBackend,
    SandboxLimits,
    availability,
    resolve_backend,
)
from tests.integration.sandbox.support import (
    BACKENDS,
    ISOLATING,
    backend,
    grader,
    leftovers,
    require_cgroups,
    run,
)

EXACT = "def grade(sample, item):\n    return 1.0 if sample == str(item % 3) else 0.0\n"
MIB = 1024 * 1024


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", BACKENDS)
def test_grades_thousands_of_samples_in_one_persistent_worker(name: str) -> None:
    samples = [str(i % 3) if i % 5 else "wrong" for i in range(3_000)]
    executions, restarts = run(backend(name), EXACT, samples)

    assert restarts == 0
    assert [e.index for e in executions] == list(range(3_000))
    assert [e.value for e in executions] == [0.0 if i % 5 == 0 else 1.0 for i in range(3_000)]
    assert leftovers().empty


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BACKENDS)
def test_missed_deadline_kills_the_sandbox_and_a_fresh_one_continues(name: str) -> None:
    source = (
        "import time\n"
        "def grade(sample, item):\n"
        "    if sample == 'hang':\n"
        "        time.sleep(60)\n"
        "    return float(item)\n"
    )
    executions, restarts = run(backend(name), source, ["a", "b", "hang", "c", "d"], timeout=1)

    assert restarts == 1
    assert [e.status for e in executions] == ["returned"] * 2 + ["timeout"] + ["returned"] * 2
    assert [e.value for e in executions if e.returned] == [0.0, 1.0, 3.0, 4.0]
    assert executions[2].error is not None
    assert "timeout_seconds=1" in executions[2].error["message"]
    assert leftovers().empty


@dataclass(frozen=True)
class BadSample:
    """A grader that misbehaves on one sample (``bad``) between two good ones, and what the
    sandbox makes of it: that sample alone fails, with a clear error, and the rest grade."""

    bad: str
    misbehave: str  # the body of ``if sample == bad:``
    status: str
    restarts: int = 0
    error_type: str | None = None
    in_message: str | None = None
    limits: SandboxLimits | None = None
    timeout: float = 2.0
    imports: str = ""

    def source(self) -> str:
        return (
            self.imports + "def grade(sample, item):\n"
            f"    if sample == {self.bad!r}:\n"
            + textwrap.indent(self.misbehave, " " * 8)
            + "    return 1.0\n"
        )


BAD_SAMPLES = [
    pytest.param(
        BadSample(
            "hog",
            "return len(bytearray(400 * 1024 * 1024))\n",
            status="raised",
            error_type="MemoryError",
            limits=SandboxLimits(memory_bytes=256 * MIB),
        ),
        id="memory-limit",
    ),
    pytest.param(
        BadSample(
            "spin",
            "while True:\n    pass\n",
            status="raised",
            error_type="CpuTimeLimitExceeded",
            in_message="1 CPU seconds",  # cpu_seconds is per execution
            limits=SandboxLimits(cpu_seconds=1),
            timeout=30,
        ),
        id="cpu-seconds",
    ),
    pytest.param(
        BadSample(
            "segv",
            "ctypes.string_at(0)\n",
            status="crashed",
            # the crash was not announced: probe mode re-ran it alone to be sure
            restarts=2,
            in_message="SIGSEGV",  # a native crash names its signal
            imports="import ctypes\n",
        ),
        id="native-crash",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", BAD_SAMPLES)
@pytest.mark.parametrize("name", BACKENDS)
def test_a_bad_sample_fails_alone_with_a_clear_error(name: str, case: BadSample) -> None:
    executions, restarts = run(
        backend(name),
        case.source(),
        ["ok", case.bad, "ok"],
        limits=case.limits,
        timeout=case.timeout,
    )

    assert restarts == case.restarts
    assert [e.status for e in executions] == ["returned", case.status, "returned"]
    error = executions[1].error
    assert error is not None
    assert case.error_type is None or error["type"] == case.error_type
    assert case.in_message is None or case.in_message in error["message"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BACKENDS)
def test_cpu_budget_is_per_execution_not_per_worker(name: str) -> None:
    source = (
        "import time\n"
        "def grade(sample, item):\n"
        "    end = time.process_time() + 0.3\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
        "    return 1.0\n"
    )
    limits = SandboxLimits(cpu_seconds=1)
    executions, _ = run(backend(name), source, ["x"] * 8, limits=limits, timeout=30)

    assert [e.status for e in executions] == ["returned"] * 8  # 2.4 CPU seconds in all


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ISOLATING)
def test_tmp_is_private_writable_and_capped(name: str) -> None:
    source = (
        "import os\n"
        "def grade(sample, item):\n"
        "    with open(f'/tmp/{sample}', 'wb') as f:\n"
        "        f.write(b'x' * (int(sample) * 1024))\n"
        "    return float(os.path.getsize(f'/tmp/{sample}'))\n"
    )
    limits = SandboxLimits(tmp_bytes=MIB)
    executions, _ = run(backend(name), source, ["100", "4000"], limits=limits)

    assert executions[0].value == 100 * 1024
    assert executions[1].status == "raised"
    assert executions[1].error is not None
    assert (
        "No space left" in executions[1].error["message"]
        or "too large" in (executions[1].error["message"])
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ISOLATING)
def test_pids_limit(name: str) -> None:
    source = (
        "import os, time\n"
        "def grade(sample, item):\n"
        "    for n in range(100):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2)\n"
        "            os._exit(0)\n"
        "    return 0.0\n"
    )
    sandbox_backend = backend(name)
    require_cgroups(name)
    executions, _ = run(sandbox_backend, source, ["x"], limits=SandboxLimits(pids=16), timeout=10)

    assert executions[0].status == "raised"
    assert executions[0].error is not None
    assert executions[0].error["type"] == "BlockingIOError"


@pytest.mark.parametrize("name", BACKENDS)
def test_describe_says_whether_it_isolates(name: str) -> None:
    described = backend(name).describe()
    assert described.startswith(name)
    assert ("unsafe" in described) == (name == "process")


def test_auto_picks_the_strongest_available_backend() -> None:
    reasons = availability()
    assert list(reasons)[: len(AUTO_ORDER)] == list(AUTO_ORDER)
    expected = next(name for name in AUTO_ORDER if reasons[name] is None)
    assert resolve_backend("auto").name == expected


def test_gvisor_is_what_auto_picks_on_a_machine_that_has_it() -> None:
    backend("gvisor")
    chosen: SandboxBackend = resolve_backend("auto")
    assert isinstance(chosen, GVisorBackend)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BACKENDS)
def test_taking_only_the_first_answer_keeps_the_worker(name: str) -> None:
    sandbox = GraderSandbox(backend(name), grader(EXACT), task_id="t")
    with sandbox:
        first = next(iter(sandbox.execute("grader", [(["1", 1], None)], timeout=5)))
        live = sandbox._live
        second = list(sandbox.execute("grader", [(["2", 2], None)], timeout=5))
        assert sandbox._live is live  # the same worker: no second cold start
    assert (first.value, second[0].value) == (1.0, 1.0)
    assert sandbox.restarts == 0
