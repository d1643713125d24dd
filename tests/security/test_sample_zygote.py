"""``isolation: sample`` forks each sample's process ahead of time, from a zygote that never
held a sample (:mod:`evalkube_sandbox.zygote`). So while a sample runs, two processes it did
not start are there with it: the zygote, and the process forked for the next sample. These
tests are the samples that go after them, on every isolating backend (each has its own PID
namespace, so every process a sample sees is the sandbox's own):

- stop, signal, re-limit, renice, pin or reschedule the processes it can see: the next
  samples run as the first one did (same limits, nice value, CPU set, scheduling policy, I/O
  priority) and answer correctly;
- leave a process behind that the sweep must find (its first thread exited, so it shows as
  a zombie, while another thread waits to forge the next sample's answer and steal its
  request): the next sample's answer and request are its own;
- lower the worker's own limits so that it fails on the next sample: the next sample runs
  in a fresh sandbox;
- plant files or symlinks in ``/dev``: refused;
- kill them: the next samples still answer correctly (in a fresh sandbox);
- read or write their memory through ``/proc/PID/mem``: refused;
- look through its own memory for the bytes of the samples before it: none are there;
- read the request of the next sample, whose process is forked while it runs: it holds no
  end of that request's pipe.
"""

from __future__ import annotations

import itertools
import os
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
import ctypes, os, resource, signal, time

IOPRIO = {"x86_64": (251, 252), "aarch64": (30, 31)}.get(os.uname().machine)
libc = ctypes.CDLL(None, use_errno=True)

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
        "policy": os.sched_getscheduler(0),
        "io": libc.syscall(IOPRIO[1], 1, 0) if IOPRIO else None,
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
            elif sample == "schedule":
                try:
                    os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
                finally:
                    if IOPRIO:
                        libc.syscall(IOPRIO[0], 1, pid, 3 << 13)  # the idle I/O class
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
    if sample in ("stop", "signals", "limits", "nice", "pin", "schedule", "kill"):
        time.sleep(0.1)  # let whatever the attack started land before this sample ends
        return {"scores": {"targets": float(len(targets)), "done": float(done)}}
    if sample == "memory":
        return {"scores": {"targets": float(len(targets)), "opened": float(done)}}
    return {"scores": {"ok": 1.0}, "state": state()}
"""

ATTACKS = ["stop", "signals", "limits", "nice", "pin", "schedule", "kill"]


def _each_answers_itself(name: str, source: str, samples: list[str]) -> None:
    """Every sample returns, each with its own value (the graders answer the sample)."""
    executions, _ = run(backend(name), source, samples, timeout=20, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * len(samples), [
        e.error for e in executions if e.error
    ]
    assert [e.value for e in executions] == samples


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


# The process for the next sample is forked and warms up while this sample runs, so each
# reads its request from a pipe of its own (two, taken in turn) and closes the other one
# before anything else: a running sample holds no read end of the pipe the next sample's
# request goes through (it can reach the next process's only through /proc, refused above).
PIPES = r"""
import fcntl, os

def grade(sample, item):
    ends = {"read": [], "write": []}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            mode = fcntl.fcntl(int(name), fcntl.F_GETFL) & 3
        except OSError:
            continue
        if int(name) > 2 and target.startswith("pipe:"):  # not the worker's own streams
            ends["read" if mode == os.O_RDONLY else "write"].append(target)
    return ends
"""


@pytest.mark.parametrize("name", ISOLATING)
def test_a_sample_holds_no_end_of_the_pipe_the_next_request_goes_through(name: str) -> None:
    executions, _ = run(backend(name), PIPES, list("abcdef"), timeout=20, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * 6, [e.error for e in executions]
    held = [e.value for e in executions]
    for ends in held:  # its request pipe's read end; the answer pipe's write end
        assert (len(ends["read"]), len(ends["write"])) == (1, 1), held
    for this, following in itertools.pairwise(held):
        assert following["read"][0] not in this["read"], held
        assert following["write"] == this["write"], held  # one answer pipe, drained between


# Found by an attacker review: a process whose first thread exits shows as a zombie while
# another thread runs on. It outlived the sweep (which skipped zombies), kept the sample's
# pipe ends, stopped the process forked for the next sample, read that sample's request from
# the pipe and wrote a forged answer for it.
SURVIVOR = r"""
import ctypes, fcntl, json, os, signal, struct, threading, time

def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[1])

def pipe_ends():
    ends = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                ends[fcntl.fcntl(fd, fcntl.F_GETFL) & 3] = fd
        except OSError:
            pass
    return ends.get(os.O_RDONLY), ends.get(os.O_WRONLY)

def waiting(fd):
    count = bytearray(4)
    fcntl.ioctl(fd, 0x541B, count)  # FIONREAD
    return struct.unpack("i", count)[0]

def lurk(zygote, sample):
    request, answer = pipe_ends()
    while True:
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (sample, os.getpid()):
                try:
                    if parent(int(name)) == zygote:
                        os.kill(int(name), signal.SIGSTOP)
                except OSError:
                    pass
        if request is not None and answer is not None and waiting(request) >= 8:
            size = int.from_bytes(os.read(request, 8), "little")
            stolen = os.read(request, size)
            forged = json.dumps({"ok": True, "value": {"forged": stolen.decode()}}).encode()
            os.write(answer, len(forged).to_bytes(8, "little") + forged)
            return
        time.sleep(0.001)

def grade(sample, item):
    if sample == "lurk":
        zygote, me = parent(os.getpid()), os.getpid()
        if os.fork() == 0:
            os.setsid()
            threading.Thread(target=lurk, args=(zygote, me)).start()
            time.sleep(0.05)
            ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86_64): only this thread ends
        time.sleep(0.3)
    return sample
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the survivor calls SYS_exit by number")
@pytest.mark.parametrize("name", ISOLATING)
def test_a_process_that_looks_exited_is_swept_before_the_next_sample(name: str) -> None:
    samples = ["first", "lurk", "victim-row", "after", "last"]
    _each_answers_itself(name, SURVIVOR, samples)


# The sweep after a sample runs while the zygote forks the next sample's process, and keeps
# that one process (whose pid it learns from the zygote). A sample that makes a process the
# zygote's child itself (``clone(CLONE_PARENT)``) must not pass for it: the lurker below is
# a sibling of the sample, a child of the zygote like the process forked for the next sample.
SIBLING = SURVIVOR.replace(
    """        if os.fork() == 0:
            os.setsid()""",
    """        CLONE_PARENT, SIGCHLD = 0x8000, 17
        if ctypes.CDLL(None, use_errno=True).syscall(56, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0) == 0:
            os.setsid()""",
)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the sibling calls SYS_clone by number")
@pytest.mark.parametrize("name", ISOLATING)
def test_a_process_made_the_zygotes_child_is_swept_before_the_next_sample(name: str) -> None:
    assert SIBLING != SURVIVOR
    samples = ["first", "lurk", "victim-row", "after", "last"]
    _each_answers_itself(name, SIBLING, samples)


# Found by an attacker review of the concurrent sweep: under gVisor a fork that is under way
# when its process is killed still completes. A sample wrote its own answer and forked a
# process slow to fork (thousands of mappings); the worker listed /proc before the killed
# sample had exited, so the child was not there yet, and the sweep skipped its scan. The child
# lived into the next sample, stopped its process, read its request and forged its answer.
# The sweep now waits for the killed sample to exit before it lists /proc.
FORK_AT_EXIT = (
    SURVIVOR
    + r"""
import mmap

KEEP = []

def grade(sample, item):
    if sample.startswith("fork-at-exit"):
        zygote, me = parent(os.getpid()), os.getpid()
        _, answer = pipe_ends()
        KEEP.extend(mmap.mmap(-1, 4096) for _ in range(15000))
        for page in KEEP:
            page[0] = 1  # each a mapping of its own: the fork below takes tens of ms
        body = json.dumps({"ok": True, "value": sample}).encode()
        os.write(answer, len(body).to_bytes(8, "little") + body)  # the worker kills it now
        if os.fork() == 0:
            os.setsid()
            lurk(zygote, me)
            os._exit(0)
        time.sleep(5)
    return sample
"""
)


@pytest.mark.parametrize("name", ISOLATING)
def test_a_fork_under_way_when_the_sample_is_killed_is_swept(name: str) -> None:
    samples = ["first"]
    for round_ in range(4):  # each round is a race the attacker won most times on gVisor
        samples += [f"fork-at-exit-{round_}", f"victim-row-{round_}"]
    samples.append("last")
    _each_answers_itself(name, FORK_AT_EXIT, samples)


# A grader's helper: the parent of a process, -1 once it is gone.
PARENT_OF = r"""
def parent(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[1])
    except OSError:
        return -1
"""

# Found by the same review (and older than the concurrent sweep): a sample that killed only
# the zygote, once it had forked the next sample's process, made the worker close the pipes
# of the sample running in that process and crash; the next sample was blamed.
ZYGOTE_KILLER = (
    r"""
import os, signal, time
"""
    + PARENT_OF
    + r"""
def grade(sample, item):
    if sample == "kill-zygote":
        zygote, me = parent(os.getpid()), os.getpid()
        for _ in range(500):
            if any(n.isdigit() and int(n) != me and parent(int(n)) == zygote
                   for n in os.listdir("/proc")):
                break
            time.sleep(0.002)
        time.sleep(0.1)  # the zygote has told the worker the next process's pid
        os.kill(zygote, signal.SIGKILL)
        time.sleep(0.05)
    return sample
"""
)


@pytest.mark.parametrize("name", ISOLATING)
def test_a_sample_that_kills_only_the_zygote_fails_no_other_sample(name: str) -> None:
    samples = ["first", "kill-zygote", "victim", "after", "kill-zygote", "victim", "last"]
    _each_answers_itself(name, ZYGOTE_KILLER, samples)


# Found by an attacker review: the worker is the same user as its samples; a sample lowered
# the worker's address-space limit, and the worker then failed on the next large sample,
# which was blamed for the crash.
POISONER = r"""
import os, resource

def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[1])

def grade(sample, item):
    if sample == "poison":
        worker = parent(parent(os.getpid()))
        with open(f"/proc/{worker}/status") as status:
            size = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
        resource.prlimit(worker, resource.RLIMIT_AS, (size + (1 << 20),) * 2)
        return "poisoned"
    return len(sample)
"""


@pytest.mark.parametrize("name", ISOLATING)
def test_a_sample_that_lowers_the_workers_limits_fails_no_other_sample(name: str) -> None:
    big = "v" * (4 << 20)
    samples = ["small", "poison", big, "small", big]
    executions, restarts = run(backend(name), POISONER, samples, timeout=30, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * len(samples), [
        e.error for e in executions if e.error
    ]
    assert [e.value for e in executions] == [5, "poisoned", len(big), 5, len(big)]
    assert restarts >= 1  # the poisoned worker handled no other sample


# Found by an attacker review (bwrap): /dev was a writable tmpfs (and /dev/shm another), past
# the wipe of /tmp: a symlink /dev/stdout -> a file it reads later captured a later grader's
# output.
PLANTER = r"""
import os

def grade(sample, item):
    if sample == "plant":
        planted = 0
        for make in (
            lambda: open("/dev/shm/left", "w").close(),
            lambda: os.symlink("/dev/shm/left", "/dev/evalkube-planted"),
            lambda: os.replace("/dev/null", "/dev/evalkube-moved"),
        ):
            try:
                make()
                planted += 1
            except OSError:
                pass
        return planted
    return sorted(n for n in ("/dev/shm/left", "/dev/evalkube-planted") if os.path.lexists(n))
"""


@pytest.mark.parametrize("name", ISOLATING)
def test_a_sample_plants_nothing_in_dev(name: str) -> None:
    executions, _ = run(backend(name), PLANTER, ["plant", "look"], timeout=20, isolation="sample")
    assert [e.value for e in executions] == [0, []], [e.error for e in executions if e.error]


# Found by an attacker review (2026-12-07): the worker was dumpable, so a sample (same user)
# could open /proc/<worker>/fd/N and write a forged request into the pipe of the process
# forked for the next sample, which then ran the attacker's code, read the next sample's real
# request and forged its answer; on bwrap and nsjail it could also read the worker's memory,
# which holds the batch. The worker is no longer dumpable once it runs samples in processes
# of their own.
WORKER_PROCESS = r"""
import json, os, re

SECRET = re.compile(rb"evalkube-row-secret-[0-9a-f]{32}")

def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[1])

def grade(sample, item):
    worker = parent(parent(os.getpid()))  # sample -> zygote -> worker
    if sample == "pipes":
        opened = 0
        try:
            names = os.listdir(f"/proc/{worker}/fd")
        except OSError:
            names = []
        for name in names:
            try:
                if os.readlink(f"/proc/{worker}/fd/{name}").startswith("pipe:"):
                    fd = os.open(f"/proc/{worker}/fd/{name}", os.O_WRONLY | os.O_NONBLOCK)
                    body = json.dumps(["grader", ["hijack", -1], None]).encode()
                    try:
                        os.write(fd, len(body).to_bytes(8, "little") + body)
                    finally:
                        os.close(fd)
                    opened += 1
            except OSError:
                pass
        return {"scores": {"opened": float(opened)}}
    if sample == "memory":
        found = set()
        try:
            mem = os.open(f"/proc/{worker}/mem", os.O_RDONLY)
            with open(f"/proc/{worker}/maps") as maps:
                for line in maps:
                    fields = line.split()
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    if fields[1].startswith("r") and end - start <= 1 << 30:
                        try:
                            found.update(SECRET.findall(os.pread(mem, end - start, start)))
                        except OSError:
                            pass
        except OSError:
            pass
        return {"scores": {"found": float(len(found))}}
    if sample == "hijack":
        return {"scores": {"hijacked": 1.0}}
    return sample
"""


@pytest.mark.parametrize("name", ISOLATING)
def test_a_sample_cannot_open_the_workers_pipes_or_memory(name: str) -> None:
    rows = [f"evalkube-row-secret-{secrets.token_hex(16)}" for _ in range(6)]
    samples = ["first", "pipes", *rows[:3], "memory", *rows[3:]]
    executions, _ = run(backend(name), WORKER_PROCESS, samples, timeout=20, isolation="sample")
    assert [e.status for e in executions] == ["returned"] * len(samples), [
        e.error for e in executions
    ]
    assert executions[1].value == {"scores": {"opened": 0.0}}
    assert executions[5].value == {"scores": {"found": 0.0}}
    own = [e.value for s, e in zip(samples, executions, strict=True) if s.startswith("evalkube")]
    assert own == rows  # no forged request ran in their processes


# Found by the same review: the answer pipe's write end, the request pipes' read ends and the
# worker's stderr are each one open file description, shared through fork by every sample's
# process. What a sample sets on one outlived it: F_SETOWN + F_SETSIG(SIGKILL) + O_ASYNC made
# the kernel kill the next sample's process when the worker read the answer pipe; O_NONBLOCK
# with a one-page pipe made every later answer over 4 KiB fail; O_DIRECT (packet mode) lost
# every later answer's body. The worker now sets them back after each sample.
SHARED_FILES = (
    r"""
import fcntl, os, signal, time

F_SETSIG, F_SETPIPE_SZ = 10, 1031
"""
    + PARENT_OF
    + r"""
def shared():
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            fcntl.fcntl(int(name), fcntl.F_GETFL)
            found.append(int(name))
        except OSError:
            pass
    return found

def next_process():
    me = os.getpid()
    for _ in range(1000):
        found = [int(n) for n in os.listdir("/proc")
                 if n.isdigit() and int(n) != me and parent(int(n)) == parent(me)]
        if found:
            return found[0]
        time.sleep(0.002)
    return 0

def arm(how):
    victim = next_process()
    for fd in shared():
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            if how == "signal":
                fcntl.fcntl(fd, fcntl.F_SETOWN, victim)
                fcntl.fcntl(fd, F_SETSIG, signal.SIGKILL)
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | fcntl.FASYNC)
            elif how == "nonblock":
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
                fcntl.fcntl(fd, F_SETPIPE_SZ, 4096)
            elif how == "direct":
                fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        except OSError:
            pass

def grade(sample, item):
    if sample.startswith("arm-"):
        arm(sample[len("arm-"):])
        return "armed"
    if sample == "big":
        return "x" * 300_000
    time.sleep(0.01)  # a grader that does some work
    return sample
"""
)


@pytest.mark.parametrize("how", ["signal", "nonblock", "direct"])
@pytest.mark.parametrize("name", ISOLATING)
def test_what_a_sample_sets_on_the_files_it_shares_reaches_no_later_sample(
    name: str, how: str
) -> None:
    samples = ["first", f"arm-{how}", "victim", "big", "after", f"arm-{how}", "big", "last"]
    executions, _ = run(backend(name), SHARED_FILES, samples, timeout=20, isolation="sample")
    # an armed sample may lose its own answer (packet mode splits it): its own result only
    others = [(s, e) for s, e in zip(samples, executions, strict=True) if not s.startswith("arm")]
    assert [e.status for _, e in others] == ["returned"] * len(others), [e.error for _, e in others]
    assert [e.value for _, e in others] == [s if s != "big" else "x" * 300_000 for s, _ in others]
