"""The hostile graders: one attack each, and the backends that claim to block it.

Every attack is the body of ``grade(sample, item)`` for the sample ``"attack"``; the other
samples of the run are plain exact-match cases (``"good"`` scores 1, ``"bad"`` 0), so a test
can check that they were graded correctly around the attack. ``{placeholders}`` are filled
per test (paths, ports, secrets).

``expect`` says how the attack must fail: the attacked sample is invalid (an exception, a
timeout, a crash, a protocol violation) or unaffected (it returned, and nothing it returned
carries what it tried to get); it is checked on the execution the session yields and on the
sample ``evalkube run`` stores.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evalkube.sandbox import Execution
from tests.integration.sandbox.support import BACKENDS, ISOLATING

#: Every backend: these attacks are stopped by the worker protocol, the rlimits the worker
#: sets on itself, or the runner's wall-clock kill, which the plain process has as well.
ALL = BACKENDS

#: How the engine names a failed execution in the stored sample's ``error.type``.
ERROR_TYPES = {
    "timeout": "Timeout",
    "crashed": "WorkerCrashed",
    "protocol_error": "ProtocolError",
    "unserializable": "UnserializableResult",
    "oversized": "ResultTooLarge",
}


@dataclass(frozen=True)
class Expect:
    """What the attacked sample may end as: invalid, or unaffected and holding nothing stolen.

    ``outcomes`` are :class:`Execution` statuses; ``errors`` the exception types allowed when
    it ``raised``. ``extra`` checks the execution further at the sandbox layer, ``view`` the
    stored sample (``evalkube samples --json``) at the end-to-end layer.
    """

    outcomes: tuple[str, ...]
    errors: tuple[str, ...] = ()
    extra: Callable[[Execution], None] | None = None
    view: Callable[[dict[str, Any]], None] | None = None

    def check_execution(self, execution: Execution, secret: str) -> None:
        assert execution.status in self.outcomes, (execution.status, execution.error)
        if self.errors and execution.status == "raised":
            assert execution.error is not None
            assert execution.error["type"] in self.errors, execution.error
        seen = repr((execution.value, execution.error, execution.stdout, execution.stderr))
        assert secret not in seen
        if self.extra is not None:
            self.extra(execution)

    def check_view(self, view: dict[str, Any], secret: str, metric: str) -> None:
        assert secret not in json.dumps(view)
        if view["status"] == "valid":
            assert "returned" in self.outcomes, view
        else:
            assert view["status"] == "invalid", view
            assert view["scores"] == {metric: 0.0}, view
            kind = view["error"]["type"]
            allowed = {ERROR_TYPES[o] for o in self.outcomes if o in ERROR_TYPES}
            if "raised" in self.outcomes:
                allowed |= set(self.errors)
            if not (("raised" in self.outcomes and not self.errors) or "returned" in self.outcomes):
                assert kind in allowed, (kind, allowed, view["error"])
        if self.view is not None:
            self.view(view)


def _children_contained(execution: Execution) -> None:
    """Children together over the memory cgroup: the sandbox is killed, or a child is (the OOM
    killer's SIGKILL; once, on a loaded machine, a SIGSEGV from a page the limit left unbacked),
    or fails its allocation. All three exiting 0 means they held 1.8 GiB at once (the attack
    holds each child's memory until its siblings have theirs)."""
    if execution.status == "returned":
        assert any(status != 0 for status in execution.value), execution.value


def _unaffected(execution: Execution) -> None:
    if execution.status == "returned":
        assert execution.value == 1.0


def _output_capped(execution: Execution) -> None:
    assert execution.value == 1.0
    for text in (execution.stdout, execution.stderr):
        assert text is not None
        assert len(text) < 9_000
        assert "more characters dropped" in text


def _output_capped_view(view: dict[str, Any]) -> None:
    assert view["status"] == "valid", view
    assert view["stdout"] is not None
    assert len(view["stdout"]) < 9_000


def _ran_in_gvisor(execution: Execution) -> None:
    _gvisor_judge(execution.value["judge"])


def _gvisor_judge(judge: dict[str, Any]) -> None:
    assert judge["release"] == "4.19.0-gvisor", judge  # the pinned gVisor's own release
    assert "gVisor" in judge["dmesg"], judge


@dataclass(frozen=True)
class Attack:
    name: str
    body: str
    blocked_by: tuple[str, ...]
    expect: Expect
    timeout: float = 2.0
    #: Stopped by the memory or pids cgroup (nsjail and bwrap have one only as root).
    needs_cgroups: bool = False


ATTACKS = [
    Attack(
        "loopback_listener",
        """
        s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
        s.sendall(b"pwned")
        return 1.0
        """,
        ISOLATING,
        Expect(("raised",), ("ConnectionRefusedError", "OSError", "TimeoutError")),
    ),
    Attack(
        "secret_in_environment",
        """
        return {{"scores": {{"found": float("{secret}" in repr(dict(os.environ)))}},
                "judge": {{"environ": dict(os.environ)}}}}
        """,
        ALL,
        Expect(("returned",)),
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
        Expect(("returned", "raised")),
    ),
    Attack(
        "read_results_database",
        """
        data = open("{database}", "rb").read().decode("latin-1")
        return {{"scores": {{"s": 1}}, "judge": {{"db": data}}}}
        """,
        ISOLATING,
        Expect(("raised",), ("FileNotFoundError", "PermissionError")),
    ),
    Attack(
        "read_credentials_file",
        """
        return {{"scores": {{"s": 1}}, "judge": {{"credentials": open("{credentials}").read()}}}}
        """,
        ISOLATING,
        Expect(("raised",), ("FileNotFoundError", "PermissionError")),
    ),
    Attack(
        "read_etc_shadow",
        """
        return {{"scores": {{"s": 1}}, "judge": {{"shadow": open("/etc/shadow").read()}}}}
        """,
        ISOLATING,
        Expect(("raised",), ("FileNotFoundError", "PermissionError")),
    ),
    Attack(
        "write_outside_tmp",
        """
        for path in ("{host_file}", "/usr/pwned", "/pwned", "/opt/evalkube/pwned",
                     "/opt/evalkube-env/pwned"):
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                return {{"scores": {{"s": 1}}, "judge": {{"wrote": path}}}}
            except OSError:
                pass
        raise PermissionError("nothing outside /tmp is writable")
        """,
        ISOLATING,
        Expect(("raised",), ("PermissionError",)),
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
        Expect(("raised",), ("OSError",)),
    ),
    Attack(
        "fill_dev_shm",
        """
        for i in range(1000):
            with open(f"/dev/shm/fill-{{i}}", "wb") as f:
                f.write(b"x" * (1 << 20))
        return 1.0
        """,
        ISOLATING,
        Expect(("raised",), ("OSError", "FileNotFoundError", "PermissionError")),
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
        # The forking loop itself may hit the per-execution CPU limit before the wall-clock
        # deadline (both are contained outcomes; which one comes first depends on load).
        Expect(("timeout", "crashed", "protocol_error", "raised"), ("CpuTimeLimitExceeded",)),
        timeout=1.0,
        needs_cgroups=True,
    ),
    Attack(
        "memory_bomb",
        """
        hog = bytearray(16 * 1024**3)
        return float(len(hog))
        """,
        ALL,
        Expect(("raised", "crashed"), ("MemoryError",)),
    ),
    Attack(
        "memory_bomb_growing",
        """
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
        """,
        ALL,
        # CPU-heavy: the per-execution CPU limit may come first under load (also contained)
        Expect(("raised", "crashed", "timeout"), ("MemoryError", "CpuTimeLimitExceeded")),
    ),
    Attack(
        "memory_bomb_in_children",
        """
        import select
        # Each child holds its 600 MiB until every sibling has its own (or died): without
        # the barrier a loaded machine can run them one after another, each under the limit.
        ready_r, ready_w = os.pipe()
        hold_r, hold_w = os.pipe()
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                os.close(hold_w)
                hog = bytearray(600 << 20)
                for k in range(0, len(hog), 4096):
                    hog[k] = 1
                os.write(ready_w, b"x")
                os.read(hold_r, 1)
                os._exit(0)
            pids.append(pid)
        os.close(ready_w)
        statuses = {{}}
        ready = 0
        while ready + len(statuses) < len(pids):
            if select.select([ready_r], [], [], 0.05)[0]:
                ready += len(os.read(ready_r, 8))
            for pid in pids:
                if pid not in statuses:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        statuses[pid] = status
        os.close(hold_w)
        return [statuses[pid] if pid in statuses else os.waitpid(pid, 0)[1] for pid in pids]
        """,
        ISOLATING,
        Expect(("returned", "timeout", "crashed"), extra=_children_contained),
        needs_cgroups=True,
    ),
    Attack(
        "infinite_loop",
        """
        while True:
            pass
        """,
        ALL,
        Expect(("timeout", "raised"), ("CpuTimeLimitExceeded",)),
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
        Expect(("timeout",)),
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
        Expect(("returned",), extra=_output_capped, view=_output_capped_view),
    ),
    Attack(
        "forged_protocol_frames",
        """
        write_frames([
            {{"t": "results", "start": 0, "answers": [{{"ok": True, "value": 99.0}}] * 5}},
            {{"t": "done", "n": 5}},
        ])
        return 99.0
        """,
        ALL,
        Expect(("protocol_error",)),
    ),
    Attack(
        # the worker's own batch token, read from its memory, in a replace frame (which asks
        # for a fresh sandbox and blames no one): sent before any answer, every time, it
        # restarted the sandbox forever until such a frame counted as forged
        "forged_replace_frame",
        """
        import gc
        live = [o for o in gc.get_objects() if isinstance(o, dict) and o.get("op") == "run"]
        write_frames([{{"t": "replace", "b": request.get("batch")}} for request in live])
        return 1.0
        """,
        ALL,
        Expect(("protocol_error",)),
    ),
    Attack("os_exit_mid_batch", "os._exit(0)", ALL, Expect(("crashed",))),
    Attack("sys_exit_mid_batch", "sys.exit()", ALL, Expect(("raised",), ("SystemExit",))),
    Attack(
        "kill_parent",
        """
        os.kill(os.getppid(), signal.SIGKILL)
        return 1.0
        """,
        ISOLATING,
        Expect(("returned", "raised", *ERROR_TYPES), extra=_unaffected),
    ),
    Attack(
        "kill_pid_1",
        """
        os.kill(1, signal.SIGKILL)
        return 1.0
        """,
        ISOLATING,
        Expect(("returned", "raised", *ERROR_TYPES), extra=_unaffected),
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
        Expect(
            ("crashed", "raised", "timeout"),
            ("RecursionError", "MemoryError", "CpuTimeLimitExceeded"),
        ),
    ),
    Attack(
        "judge_of_50_mb",
        """
        return {{"scores": {{"s": 1.0}}, "judge": {{"blob": "x" * (50 * 1024 * 1024)}}}}
        """,
        ALL,
        Expect(("oversized",)),
    ),
    # The worker's own checks run inside the sandbox: a grader patches them out, and the host
    # must hold on its own.
    Attack(
        "patched_worker_reports_a_huge_duration",
        """
        import gc
        worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
        encode = worker._encode_results
        worker._encode_results = lambda start, answers: encode(
            start, [dict(a, ms=10**400) for a in answers]
        )
        return 1.0
        """,
        ALL,
        Expect(("returned",), extra=_unaffected),
    ),
    Attack(
        "patched_worker_sends_a_5_mb_judge",
        """
        import gc
        worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
        worker._payload_bytes = 10**12
        return {{"scores": {{"s": 1.0}}, "judge": {{"blob": "x" * (5 * 1024 * 1024)}}}}
        """,
        ALL,
        Expect(("oversized",)),
    ),
    Attack(
        "judge_not_json_serializable",
        """
        return {{"scores": {{"s": 1.0}}, "judge": {{"handle": object(), "set": {{1, 2}}}}}}
        """,
        ALL,
        Expect(("unserializable",)),
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
        Expect(("returned",), extra=_ran_in_gvisor, view=lambda v: _gvisor_judge(v["judge"])),
    ),
]

PRELUDE = """
import json
import os
import signal
import socket
import struct
import sys


def write_frames(frames):
    # each frame, framed as the worker frames them, to every descriptor this process has
    for fd in os.listdir("/proc/self/fd"):
        for frame in frames:
            body = json.dumps(frame).encode()
            try:
                os.write(int(fd), struct.pack(">I", len(body)) + body)
            except OSError:
                pass


def grade(sample, item):
    case = {case}
    if case != "attack":
        return 1.0 if case == "good" else 0.0
"""


def grader_source(attack: Attack, params: dict[str, str], case: str = "sample") -> str:
    """The attack's whole grader module, ``params`` filled in.

    ``case`` is the expression that names the case: the sample itself at the sandbox layer,
    ``sample["output_text"]`` when the grader runs through ``evalkube run``.
    """
    body = textwrap.indent(textwrap.dedent(attack.body).strip("\n"), "    ")
    return PRELUDE.format(case=case) + body.format(**params) + "\n"


#: The run every attack is part of: the attack mid-batch between graded samples.
SAMPLES = ["good", "bad", "good", "attack", "good", "bad", "good"]
EXPECTED = {0: 1.0, 1: 0.0, 2: 1.0, 4: 1.0, 5: 0.0, 6: 1.0}
ATTACKED = 3
