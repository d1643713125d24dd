"""``isolation: sample`` forks each sample's process ahead of time, from a zygote that never
held a sample (:mod:`evalkube_sandbox.zygote`). So while a sample runs, two processes it did
not start are there with it: the zygote, and the process forked for the next sample. These
tests are the samples that go after them, on every isolating backend (each has its own PID
namespace, so every process a sample sees is the sandbox's own):

- stop, signal, re-limit, renice or pin the processes it can see: the next samples run as
  the first one did (same limits, nice value, CPU set) and answer correctly;
- kill them: the next samples still answer correctly (in a fresh sandbox);
- read or write their memory through ``/proc/PID/mem``: refused;
- look through its own memory for the bytes of the samples before it: none are there.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from tests.integration.sandbox.support import ISOLATING, backend, run

pytestmark = pytest.mark.timeout(180)

# Every attack goes after each process but the sample's own and the worker with its
# ancestors (stopping or killing the worker fails the attacker's own sample: a contained
# outcome tested elsewhere): the zygote (its parent) and the process forked for the next
# sample, once it is there.
ATTACKER = """
import os, resource, signal, time

def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[1])

def others():
    spared, pid = {os.getpid()}, parent(parent(os.getpid()))
    while pid > 0:
        spared.add(pid)
        pid = parent(pid) if pid > 1 else 0
    for _ in range(100):
        found = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in spared]
        if len(found) >= 2:
            break
        time.sleep(0.01)
    return found

def state():
    return {
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "as": list(resource.getrlimit(resource.RLIMIT_AS)),
        "cpu": list(resource.getrlimit(resource.RLIMIT_CPU)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "cpus": sorted(os.sched_getaffinity(0)),
    }

def grade(sample, item):
    targets = others()
    done = 0
    for pid in targets:
        try:
            if sample == "stop":
                os.kill(pid, signal.SIGSTOP)
            elif sample == "signals":
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGXCPU,
                            signal.SIGHUP, signal.SIGALRM):
                    os.kill(pid, sig)
            elif sample == "limits":
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, 8))
                resource.prlimit(pid, resource.RLIMIT_AS, (64 << 20, 64 << 20))
                resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1))
            elif sample == "nice":
                os.setpriority(os.PRIO_PROCESS, pid, 19)
            elif sample == "pin":
                os.sched_setaffinity(pid, {min(os.sched_getaffinity(0))})
            elif sample == "kill":
                os.kill(pid, signal.SIGKILL)
            elif sample == "memory":
                fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
                os.close(fd)
            else:
                break
            done += 1
        except OSError:
            pass
    if sample in ("stop", "signals", "limits", "nice", "pin", "kill"):
        time.sleep(0.1)  # let whatever the attack started land before this sample ends
        return {"scores": {"targets": float(len(targets)), "done": float(done)}}
    if sample == "memory":
        return {"scores": {"targets": float(len(targets)), "opened": float(done)}}
    return {"scores": {"ok": 1.0}, "state": state()}
"""

ATTACKS = ["stop", "signals", "limits", "nice", "pin", "kill"]


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("name", ISOLATING)
def test_what_a_sample_does_to_the_processes_beside_it_never_reaches_the_next(
    name: str, attack: str
) -> None:
    samples = ["check", attack, "check", "check", attack, "check", "check"]
    executions, restarts = run(backend(name), ATTACKER, samples, timeout=20, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * len(samples), [
        e.error for e in executions
    ]
    attacked = executions[1].value["scores"]
    assert attacked["targets"] >= 1, "the attack found no process beside it to go after"
    first = executions[0].value
    for index, execution in enumerate(executions):
        if samples[index] == "check":
            assert execution.value == first, (index, attack)
    if attack == "kill":
        assert restarts >= 1  # the zygote it killed is never replaced by forks of the worker


@pytest.mark.parametrize("name", ISOLATING)
def test_a_sample_cannot_open_the_memory_of_the_processes_beside_it(name: str) -> None:
    executions, _ = run(
        backend(name), ATTACKER, ["check", "memory", "check"], timeout=20, isolation="sample"
    )
    assert [e.status for e in executions] == ["returned"] * 3, [e.error for e in executions]
    scores: dict[str, Any] = executions[1].value["scores"]
    assert scores["targets"] >= 2  # the zygote and the process forked for the next sample
    # the worker, its ancestor, is not a target; neither of the others may be opened
    assert scores["opened"] == 0


# Reads every readable mapping of its own process and counts the secrets of other samples
# in it. The pattern is in this source only as a regular expression that cannot match
# itself (a secret is the prefix and 32 hex digits).
SCANNER = r"""
import ctypes, re

SECRET = re.compile(rb"evalkube-row-secret-[0-9a-f]{32}")

def grade(sample, item):
    if sample != "scan":
        return len(sample)
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            span, perms = fields[:2]
            where = fields[5] if len(fields) > 5 else ""
            special = where.startswith("[") and where not in ("[heap]", "[stack]")
            if not perms.startswith("r") or special:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            if end - start <= 1 << 30:
                found.update(SECRET.findall(ctypes.string_at(start, end - start)))
    return {"scores": {"found": float(len(found))}}
"""


@pytest.mark.parametrize("name", ISOLATING)
def test_no_sample_finds_the_bytes_of_the_samples_before_it_in_its_memory(name: str) -> None:
    # long rows: freed, their heap chunks keep their bytes until reused
    rows = [f"evalkube-row-secret-{secrets.token_hex(16)} " * 1500 for _ in range(20)]
    samples = [*rows, "scan", *rows[:5], "scan"]
    executions, _ = run(backend(name), SCANNER, samples, timeout=30, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * len(samples), [
        e.error for e in executions if e.error
    ]
    scans = [e.value for s, e in zip(samples, executions, strict=True) if s == "scan"]
    assert scans == [{"scores": {"found": 0.0}}] * 2
