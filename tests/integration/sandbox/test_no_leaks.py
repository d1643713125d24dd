"""Nothing outlives a run: after Ctrl-C (SIGINT) or SIGKILL of the evalkube process, no
sandbox process, runsc container or state, cgroup or temp dir is left.

Each test runs a small evalkube program in a child process, waits until its grader is busy,
signals it, then looks at the process table (every descendant the child had), ``/tmp`` and
``/sys/fs/cgroup`` for anything named after the child's pid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkube.sandbox import GraderSandbox, SandboxBackend, gvisor
from evalkube.sandbox.gvisor import containers
from evalkube_sandbox.hygiene import become_subreaper
from tests.integration.sandbox.support import (
    BACKENDS,
    alive,
    backend,
    descendants,
    grader,
    leftovers,
)

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import sys, time
from evalkube.sandbox import GraderSandbox, Program, resolve_backend

source = "import time\\ndef grade(sample, item):\\n    time.sleep(600)\\n    return 1.0\\n"
sandbox = GraderSandbox(resolve_backend(sys.argv[1]), [Program("grader", source, "g.py", "grade")],
                        task_id="t", load_timeout=30)
sandbox.start()
if sys.argv[2] == "busy":
    print("READY", flush=True)
    for execution in sandbox.execute("grader", [(["x", 1], None)], timeout=600):
        pass
else:  # idle: started, never closed, interrupted in unrelated code
    print("READY", flush=True)
    time.sleep(600)
"""


def _start_child(name: str, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT / 'sandbox_image'}:{ROOT}"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, name, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "READY", (line, child.stderr.read() if child.stderr else "")
    time.sleep(0.5)  # let the grader get going
    return child


def _finish(child: subprocess.Popen[str]) -> str:
    """Wait for the child and close its pipes; its stderr."""
    _, err = child.communicate(timeout=30)
    return err


def _wait_gone(processes: set[tuple[int, str]], seconds: float = 15) -> set[tuple[int, str]]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = alive(processes)
        if not left:
            return left
        time.sleep(0.1)
    return alive(processes)


def _state_dirs(pid: int) -> list[Path]:
    return list(Path("/tmp").glob(f"evalkube-gvisor-{pid}-*/state"))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["busy", "idle"])
@pytest.mark.parametrize("name", BACKENDS)
def test_ctrl_c_leaves_nothing(name: str, mode: str) -> None:
    backend(name)  # skip (or fail under CI) when unavailable
    child = _start_child(name, mode)
    processes = descendants(child.pid)
    assert processes, "the sandbox should be running"

    child.send_signal(signal.SIGINT)
    _finish(child)

    assert _wait_gone(processes) == set()
    assert leftovers(child.pid).empty, leftovers(child.pid)
    assert _state_dirs(child.pid) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", BACKENDS)
def test_sigkill_of_the_parent_leaves_nothing_after_the_next_start(name: str) -> None:
    sandbox_backend: SandboxBackend = backend(name)
    child = _start_child(name, "busy")
    processes = descendants(child.pid)

    child.kill()
    _finish(child)

    # The sandbox dies with its parent (parent-death signal), not at some later sweep.
    assert _wait_gone(processes) == set()
    # What a killed process cannot remove (runsc's record of the container, temp dirs,
    # cgroups) goes at the next start of the same backend.
    with GraderSandbox(sandbox_backend, grader("def grade(s, i):\n    return 1.0\n"), task_id="t"):
        pass
    assert leftovers(child.pid).empty, leftovers(child.pid)
    assert _state_dirs(child.pid) == []


@pytest.mark.timeout(120)
def test_a_leftover_runsc_cannot_delete_does_not_stop_the_next_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead process's sandbox that stays a zombie (its new parent, a child subreaper, never
    reaps it) makes ``runsc delete --force`` wait for its pid: the next start warns, keeps the
    leftover for later and runs; once the zombie is reaped, a later sweep removes it all."""
    sandbox_backend = backend("gvisor")
    monkeypatch.setattr(gvisor, "RUNSC_COMMAND_TIMEOUT", 3.0)
    assert become_subreaper()  # as the worker does (the conftest gives the flag back)
    child = _start_child("gvisor", "busy")
    processes = descendants(child.pid)
    try:
        child.kill()
        _finish(child)
        assert _wait_gone(processes) == set()  # dead, and unreaped: zombies of this process
        with (
            caplog.at_level(logging.WARNING, logger=gvisor.__name__),
            GraderSandbox(
                sandbox_backend, grader("def grade(s, i):\n    return 1.0\n"), task_id="t"
            ) as sandbox,
        ):
            outcomes = list(sandbox.execute("grader", [(["x", 1], None)], timeout=30))
        assert [o.status for o in outcomes] == ["returned"]
        (stuck,) = _state_dirs(child.pid)
        assert f"container in {stuck.parent} could not be removed" in caplog.text, caplog.text
        assert "delete --force timed out after 3 s" in caplog.text, caplog.text
    finally:
        for pid, _start in processes:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        gvisor._undeletable.clear()
    gvisor.sweep_stale()
    assert _state_dirs(child.pid) == []
    assert leftovers(child.pid).empty, leftovers(child.pid)


@pytest.mark.timeout(60)
def test_runsc_knows_one_container_per_live_sandbox_and_none_after() -> None:
    sandbox_backend = backend("gvisor")
    source = (
        "import time\n"
        "def grade(sample, item):\n"
        "    if sample == 'hang':\n"
        "        time.sleep(60)\n"
        "    return 1.0\n"
    )
    sandbox = GraderSandbox(sandbox_backend, grader(source), task_id="t")
    with sandbox:
        (first,) = _state_dirs(os.getpid())
        assert containers(first) == [first.parent.name.rsplit("-", 1)[0]]
        outcomes = list(
            sandbox.execute("grader", [(["hang", 0], None), (["ok", 1], None)], timeout=1)
        )
        assert [o.status for o in outcomes] == ["timeout", "returned"]
        (second,) = _state_dirs(os.getpid())  # the killed one is gone, a fresh one runs
        assert second != first
        assert not first.parent.exists()
        assert containers(second) == [second.parent.name.rsplit("-", 1)[0]]
    assert _state_dirs(os.getpid()) == []
    assert leftovers().empty
