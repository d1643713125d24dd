"""The hostile graders: one attack each, and the backends that claim to block it.

Every attack is the body of ``grade(sample, item)`` for the sample ``"attack"``; the other
samples of the run are plain exact-match cases (``"good"`` scores 1, ``"bad"`` 0), so a test
can check that they were graded correctly around the attack. ``{placeholders}`` are filled
per test (paths, ports, secrets).

``check`` receives the attacked sample's outcome as the grading side saw it and asserts that
the attack failed: the sample is invalid (an exception, a timeout, a crash, a protocol
violation) or unaffected (it returned, and nothing it returned carries what it tried to get).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

from evalkube.sandbox import Execution
from tests.integration.sandbox.support import BACKENDS, ISOLATING

#: Every backend: these attacks are stopped by the worker protocol, the rlimits the worker
#: sets on itself, or the runner's wall-clock kill, which the plain process has as well.
ALL = BACKENDS

INVALID = ("raised", "timeout", "crashed", "protocol_error", "unserializable", "oversized")


Check = Callable[[Execution, dict[str, str]], None]


def invalid(*statuses: str, errors: tuple[str, ...] = ()) -> Check:
    """The attacked sample must end in one of ``statuses`` (and one of ``errors`` if given)."""

    def check(execution: Execution, params: dict[str, str]) -> None:
        assert execution.status in statuses, (execution.status, execution.error)
        if errors and execution.status == "raised":
            assert execution.error is not None
            assert execution.error["type"] in errors, execution.error

    return check


def nothing_leaked(*statuses: str) -> Check:
    """Whatever the sample ended as, the secret appears nowhere in what it produced."""

    def check(execution: Execution, params: dict[str, str]) -> None:
        assert execution.status in statuses, (execution.status, execution.error)
        seen = repr((execution.value, execution.error, execution.stdout, execution.stderr))
        assert params["secret"] not in seen

    return check


def unaffected_or_invalid(execution: Execution, params: dict[str, str]) -> None:
    assert execution.status in ("returned", *INVALID), execution.status
    if execution.status == "returned":
        assert execution.value == 1.0


def children_contained(execution: Execution, params: dict[str, str]) -> None:
    """Children together over the memory cgroup: one is OOM-killed, or the sandbox is."""
    if execution.status == "returned":
        assert 9 in execution.value or 9 << 8 in execution.value, execution.value
    else:
        assert execution.status in ("timeout", "crashed"), execution.status


def output_capped(execution: Execution, params: dict[str, str]) -> None:
    assert execution.status == "returned", execution
    assert execution.value == 1.0
    for text in (execution.stdout, execution.stderr):
        assert text is not None
        assert len(text) < 9_000
        assert "more characters dropped" in text


def ran_in_gvisor(execution: Execution, params: dict[str, str]) -> None:
    assert execution.status == "returned", execution.error
    judge = execution.value["judge"]
    assert judge["release"] == "4.4.0", judge
    assert "gVisor" in judge["dmesg"], judge


@dataclass(frozen=True)
class Attack:
    name: str
    body: str
    blocked_by: tuple[str, ...]
    check: Check
    timeout: float = 2.0
    #: Substituted into ``body`` with ``str.format`` (test-specific values are added).
    params: dict[str, str] = field(default_factory=dict)


ATTACKS = [
    Attack(
        "loopback_listener",
        """
        s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
        s.sendall(b"pwned")
        return 1.0
        """,
        ISOLATING,
        invalid("raised", errors=("ConnectionRefusedError", "OSError", "TimeoutError")),
    ),
    Attack(
        "secret_in_environment",
        """
        return {{"scores": {{"found": float("{secret}" in repr(dict(os.environ)))}},
                "judge": {{"environ": dict(os.environ)}}}}
        """,
        ALL,
        nothing_leaked("returned"),
    ),
    Attack(
        "secret_in_other_processes",
        """
        found = []
        for pid in os.listdir("/proc"):
            for name in ("environ", "cmdline"):
                try:
                    data = open(f"/proc/{{pid}}/{{name}}", "rb").read()
                except OSError:
                    continue
                if b"{secret}" in data:
                    found.append(data.decode(errors="replace"))
        return {{"scores": {{"found": float(len(found))}}, "judge": {{"found": found}}}}
        """,
        ISOLATING,
        nothing_leaked("returned", "raised"),
    ),
    Attack(
        "read_results_database",
        """
        data = open("{database}", "rb").read().decode("latin-1")
        return {{"scores": {{"s": 1}}, "judge": {{"db": data}}}}
        """,
        ISOLATING,
        nothing_leaked("raised"),
    ),
    Attack(
        "read_credentials_file",
        """
        return {{"scores": {{"s": 1}}, "judge": {{"credentials": open("{credentials}").read()}}}}
        """,
        ISOLATING,
        nothing_leaked("raised"),
    ),
    Attack(
        "read_etc_shadow",
        """
        return {{"scores": {{"s": 1}}, "judge": {{"shadow": open("/etc/shadow").read()}}}}
        """,
        ISOLATING,
        invalid("raised", errors=("FileNotFoundError", "PermissionError")),
    ),
    Attack(
        "write_outside_tmp",
        """
        for path in ("{host_file}", "/usr/pwned", "/pwned", "/opt/evalkube/pwned"):
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                return {{"scores": {{"s": 1}}, "judge": {{"wrote": path}}}}
            except OSError:
                pass
        raise PermissionError("nothing outside /tmp is writable")
        """,
        ISOLATING,
        invalid("raised", errors=("PermissionError",)),
    ),
    Attack(
        "fill_tmp",
        """
        for i in range(1000):
            with open(f"/tmp/fill-{{i}}", "wb") as f:
                f.write(b"x" * (1 << 20))
        return 1.0
        """,
        ISOLATING,
        invalid("raised", errors=("OSError",)),
    ),
    Attack(
        "fork_bomb",
        """
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        ISOLATING,
        invalid("timeout", "crashed", "protocol_error"),
        timeout=1.0,
    ),
    Attack(
        "memory_bomb",
        """
        hog = bytearray(16 * 1024**3)
        return float(len(hog))
        """,
        ALL,
        invalid("raised", "crashed", errors=("MemoryError",)),
    ),
    Attack(
        "memory_bomb_growing",
        """
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
        """,
        ALL,
        invalid("raised", "crashed", "timeout", errors=("MemoryError",)),
    ),
    Attack(
        "memory_bomb_in_children",
        """
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                hog = bytearray(600 << 20)
                for k in range(0, len(hog), 4096):
                    hog[k] = 1
                os._exit(0)
            pids.append(pid)
        return [os.waitpid(pid, 0)[1] for pid in pids]
        """,
        ISOLATING,
        children_contained,
    ),
    Attack(
        "infinite_loop",
        """
        while True:
            pass
        """,
        ALL,
        invalid("timeout", "raised", errors=("CpuTimeLimitExceeded",)),
        timeout=1.0,
    ),
    Attack(
        "cpu_spin_ignoring_signals",
        """
        for sig in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
        """,
        ALL,
        invalid("timeout"),
        timeout=1.0,
    ),
    Attack(
        "flood_stdout_and_stderr",
        """
        chunk = "x" * 10_000
        for _ in range(300):
            print(chunk)
            sys.stderr.write(chunk)
            os.write(1, chunk.encode())
            os.write(2, chunk.encode())
        return 1.0
        """,
        ALL,
        output_capped,
    ),
    Attack(
        "forged_protocol_frames",
        """
        frames = [
            {{"t": "results", "start": 0, "answers": [{{"ok": True, "value": 99.0}}] * 5}},
            {{"t": "done", "n": 5}},
        ]
        for fd in os.listdir("/proc/self/fd"):
            for frame in frames:
                body = json.dumps(frame).encode()
                try:
                    os.write(int(fd), struct.pack(">I", len(body)) + body)
                except OSError:
                    pass
        return 99.0
        """,
        ALL,
        invalid("protocol_error"),
    ),
    Attack("os_exit_mid_batch", "os._exit(0)", ALL, invalid("crashed")),
    Attack("sys_exit_mid_batch", "sys.exit()", ALL, invalid("raised", errors=("SystemExit",))),
    Attack(
        "kill_parent",
        """
        os.kill(os.getppid(), signal.SIGKILL)
        return 1.0
        """,
        ISOLATING,
        unaffected_or_invalid,
    ),
    Attack(
        "kill_pid_1",
        """
        os.kill(1, signal.SIGKILL)
        return 1.0
        """,
        ISOLATING,
        unaffected_or_invalid,
    ),
    Attack(
        "recursion_bomb",
        """
        sys.setrecursionlimit(10**8)
        nested = []
        for _ in range(10**6):
            nested = [nested]
        return float(len(repr(nested)))
        """,
        ALL,
        invalid("crashed", "raised", "timeout", errors=("RecursionError", "MemoryError")),
    ),
    Attack(
        "judge_of_50_mb",
        """
        return {{"scores": {{"s": 1.0}}, "judge": {{"blob": "x" * (50 * 1024 * 1024)}}}}
        """,
        ALL,
        invalid("oversized"),
    ),
    Attack(
        "judge_not_json_serializable",
        """
        return {{"scores": {{"s": 1.0}}, "judge": {{"handle": object(), "set": {{1, 2}}}}}}
        """,
        ALL,
        invalid("unserializable"),
    ),
    Attack(
        "proof_of_gvisor",
        """
        import platform
        import subprocess
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
        judge = {{"release": platform.release(), "dmesg": dmesg}}
        return {{"scores": {{"s": 1.0}}, "judge": judge}}
        """,
        ("gvisor",),
        ran_in_gvisor,
    ),
]

PRELUDE = """
import json
import os
import signal
import socket
import struct
import sys


def grade(sample, item):
    if sample != "attack":
        return 1.0 if sample == "good" else 0.0
"""


def grader_source(attack: Attack, params: dict[str, str]) -> str:
    """The attack's whole grader module, ``params`` filled in."""
    body = textwrap.indent(textwrap.dedent(attack.body).strip("\n"), "    ")
    return PRELUDE + body.format(**params) + "\n"


#: The run every attack is part of: the attack mid-batch between graded samples.
SAMPLES = ["good", "bad", "good", "attack", "good", "bad", "good"]
EXPECTED = {0: 1.0, 1: 0.0, 2: 1.0, 4: 1.0, 5: 0.0, 6: 1.0}
ATTACKED = 3
