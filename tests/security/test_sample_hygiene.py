"""One sample cannot touch the next: files, processes, and (with ``isolation: sample``) the
worker itself, the other samples' data and their results. On every backend.

Default isolation (``unit``): a sample's files in the scratch directory and every process
it started (daemonized grandchildren too) are gone before the next sample runs.
``isolation: sample``: each execution is a fresh process forked from the warm worker, so a
sample that patches the worker's encoder, scans memory for other samples, or forks until
the pids limit changes only its own result.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.sandbox.support import BACKENDS, backend, run

pytestmark = pytest.mark.timeout(120)

LEAVER = """
import os, sys, time

def descendants():
    me, found = os.getpid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat", "rb").read().rpartition(b")")[2].split()
            except OSError:
                continue
            found += int(stat[1]) == me
    return found

def grade(sample, item):
    if sample == "leave":
        with open("marker", "w") as f:
            f.write("left behind")
        if os.fork() == 0:          # a daemonized grandchild: double fork + setsid
            os.setsid()
            if os.fork() == 0:
                time.sleep(300)
            os._exit(0)
        if os.fork() == 0:          # and a plain child
            time.sleep(300)
            os._exit(0)
        time.sleep(0.2)
        return {"scores": {"children": float(descendants())}}
    return {"scores": {"marker": float(os.path.exists("marker")),
                       "children": float(descendants())}}
"""


@pytest.mark.parametrize("isolation", ["unit", "sample"])
@pytest.mark.parametrize("name", BACKENDS)
def test_files_and_processes_do_not_reach_the_next_sample(name: str, isolation: str) -> None:
    executions, _ = run(
        backend(name), LEAVER, ["check", "leave", "check", "check"], timeout=20, isolation=isolation
    )
    assert [e.status for e in executions] == ["returned"] * 4, [e.error for e in executions]
    values: list[dict[str, Any]] = [e.value["scores"] for e in executions]
    assert values[0] == {"marker": 0.0, "children": 0.0}
    if isolation == "unit":
        assert values[1]["children"] >= 1  # it did start them (in its own process)
    for later in values[2:]:
        assert later == {"marker": 0.0, "children": 0.0}


# Model output a grader runs may attack the grader: patch the worker's encoder for every
# later answer, scan memory for other samples' data, exhaust the pids limit.
ATTACKER = """
import gc, os

def grade(sample, item):
    if sample == "attack":
        worker = next((o for o in gc.get_objects() if type(o).__name__ == "Worker"), None)
        if worker is not None:
            encode = worker._encode_results
            worker._encode_results = lambda start, answers: encode(
                start, [dict(a, value=99.0) for a in answers]
            )
        seen = 0
        for o in gc.get_objects():
            if isinstance(o, (list, tuple, dict)):
                values = o.values() if isinstance(o, dict) else o
                seen += sum(isinstance(v, str) and v[:11] == "row-secret-" and v[11:].isdigit()
                            for v in values)
        for _ in range(200):        # a fork storm, never reaped
            try:
                if os.fork() == 0:
                    import time
                    time.sleep(300)
                    os._exit(0)
            except OSError:
                break
        return {"scores": {"seen": float(seen)}}
    import threading
    thread = threading.Thread(target=lambda: None)
    thread.start()                  # "can't start new thread" after an unreaped fork storm
    thread.join()
    return 1.0
"""


@pytest.mark.parametrize("name", BACKENDS)
def test_with_sample_isolation_an_attack_changes_only_its_own_result(name: str) -> None:
    samples = ["good", "row-secret-1", "attack", "good", "row-secret-2", "good"]
    executions, _ = run(backend(name), ATTACKER, samples, timeout=30, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * 6, [e.error for e in executions]
    attacked = executions[2].value
    assert attacked["scores"]["seen"] == 0  # only its own sample was in the process it ran in
    assert [e.value for i, e in enumerate(executions) if i != 2] == [1.0] * 5


@pytest.mark.parametrize("name", BACKENDS)
def test_without_sample_isolation_the_same_attack_reaches_later_samples(name: str) -> None:
    """What ``isolation: sample`` is for: in the default mode one worker grades the unit."""
    samples = ["good", "attack", "good", "good"]
    executions, _ = run(backend(name), ATTACKER, samples, timeout=30)
    assert executions[2].value == 99.0
