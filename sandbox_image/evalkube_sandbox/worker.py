"""The worker loop: load user programs, run executions, answer in batches.

Answers leave in batches (one write per flush), yet the host always knows which execution
is in flight: the worker flushes pending answers at least every ``FLUSH_INTERVAL`` seconds
or ``FLUSH_COUNT`` answers, and a heartbeat thread announces an execution that is still
running on two of its consecutive ticks (``{"t": "running", "i": k}``). The host holds the
deadline of each execution from that knowledge and kills the sandbox when it passes.

The loop reads no clock and takes no lock per execution: under gVisor's ptrace platform
``clock_gettime`` is a trapped syscall of about 6 µs (more than an exact-match grader
costs), and CPython 3.11 reads that clock in every ``Lock.acquire``. The heartbeat's ticks
drive the time-based flush; durations (``"ms"``) are measured per execution only where the
clock is cheap or the executions are slow enough for it not to matter, and fast executions
otherwise report the mean of their flush group. The main thread and the heartbeat share
the channel through a two-flag handshake (``_current`` / ``_announcing``, see
:meth:`Worker._heartbeat`), taking the lock only when the heartbeat is really announcing.

User output never reaches the protocol channel: the channel uses private duplicates of the
original stdin/stdout descriptors; fd 0 becomes /dev/null, fd 1 is pointed at stderr (which
the host drains and caps), and ``print`` inside an execution lands in a per-execution
capped buffer returned with the answer.

Every frame about a batch echoes the batch token the host sent with it (``"b"``), and
answers carry their position: the host rejects frames that are out of sequence, so user
code that writes forged frames to the channel is caught and blamed (see
``evalkube.sandbox.session``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable

from evalkube_sandbox import PROTOCOL_VERSION
from evalkube_sandbox.capture import CappedText
from evalkube_sandbox.ctx import Context
from evalkube_sandbox.errors import describe
from evalkube_sandbox.hygiene import Hygiene
from evalkube_sandbox.isolation import run_isolated
from evalkube_sandbox.loader import LoadError, load
from evalkube_sandbox.protocol import encode, read_frame
from evalkube_sandbox.rlimits import CpuBudget, apply_fixed
from evalkube_sandbox.zygote import Zygote, set_dumpable

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any, BinaryIO

FLUSH_INTERVAL = 0.02
FLUSH_COUNT = 256
#: A clock read cheaper than this (vDSO) is taken around every execution.
CHEAP_CLOCK_SECONDS = 1e-6
#: With an expensive clock, executions are timed one by one once their mean duration is at
#: least this many clock reads (timing then costs under 1% of the work).
TIMED_FACTOR = 100
DEFAULT_CAPTURE_CHARS = 8_192
DEFAULT_PAYLOAD_BYTES = 1_000_000


class _Program:
    __slots__ = ("function", "wants_ctx")

    def __init__(self, function: Callable[..., Any], wants_ctx: bool) -> None:
        self.function = function
        self.wants_ctx = wants_ctx


class Worker:
    """Serves one unit's programs (grader and preprocessor) on a pair of streams."""

    def __init__(self, requests: BinaryIO, answer_fd: int) -> None:
        self._requests = requests
        self._answer_fd = answer_fd
        self._lock = threading.Lock()
        self._programs: dict[str, _Program] = {}
        self._endpoint: str | None = None
        self._task_id = ""
        self._capture_chars = DEFAULT_CAPTURE_CHARS
        self._payload_bytes = DEFAULT_PAYLOAD_BYTES
        # State shared with the heartbeat thread (plain attributes: single writers).
        self._pending: list[dict[str, Any]] = []
        self._pending_start = 0
        #: Executions started so far: the heartbeat's identity for the one in flight.
        self._ordinal = 0
        #: Batch position of the execution in flight (-1 between executions).
        self._current = -1
        self._announced = -1
        #: Set on every heartbeat tick that announced nothing: flush at the next answer.
        self._flush_due = False
        #: True while the heartbeat holds the lock to flush and announce.
        self._announcing = False
        self._batch: Any = None
        self._clock_cost = _clock_cost()
        self._timed = self._clock_cost < CHEAP_CLOCK_SECONDS
        #: Clock at the last flush: untimed answers share the time since then.
        self._group_start = 0.0
        #: The heartbeat's clock on the tick that first saw the execution in flight.
        self._seen_at = 0.0
        self._in_user = False
        self._cpu = CpuBudget(lambda: self._in_user)
        #: Cleans files and processes a sample left behind (set up at load time).
        self._hygiene = Hygiene(None)
        self._heartbeat_thread: threading.Thread | None = None
        #: ``isolation: sample``: forks each sample's process (started at load time).
        self._zygote: Zygote | None = None
        #: Samples run with ``isolation: sample`` so far (their requests passed through here).
        self._held = 0
        #: The zygote failed a sample: the next one runs in a fresh sandbox.
        self._zygote_lost = False

    # -- channel ---------------------------------------------------------------------------
    def _write(self, message: Any) -> None:
        self._write_bytes(encode(message))

    def _write_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._answer_fd, view)
            view = view[written:]

    def _flush(self, until: float | None = None) -> None:
        """Send pending answers (main thread between executions, or the heartbeat)."""
        now = time.monotonic() if until is None else until
        if self._pending:
            answers, self._pending = self._pending, []
            self._share_group_time(answers, now - self._group_start)
            start = self._pending_start
            self._pending_start += len(answers)
            self._write_bytes(self._encode_results(start, answers))
        self._group_start = now
        self._flush_due = False
        self._cpu.arm()

    def _share_group_time(self, answers: list[dict[str, Any]], elapsed: float) -> None:
        """Give untimed answers the group's mean duration; choose how to time the next group."""
        untimed = [answer for answer in answers if "ms" not in answer]
        if not untimed:
            return
        mean = elapsed / len(untimed)
        ms = round(mean * 1000, 3)
        for answer in untimed:
            answer["ms"] = ms
        self._timed = mean >= TIMED_FACTOR * self._clock_cost

    def _encode_results(self, start: int, answers: list[dict[str, Any]]) -> bytes:
        """Encode a results frame; check answers one by one only when the fast path fails."""
        frame = {"t": "results", "b": self._batch, "start": start, "answers": answers}
        try:
            data = encode(frame)
        except (TypeError, ValueError, RecursionError):
            data = b""
        if data and len(data) <= self._payload_bytes:
            return data
        frame["answers"] = [self._safe_one(answer) for answer in answers]
        return encode(frame)

    def _safe_one(self, answer: dict[str, Any]) -> dict[str, Any]:
        if "value" not in answer:
            return answer
        value = answer["value"]
        try:
            size = len(json.dumps(value, separators=(",", ":")))
        except (TypeError, ValueError, RecursionError) as exc:
            safe = dict(answer)
            del safe["value"]
            safe["unserializable"] = {
                "type": type(value).__name__,
                "repr": _repr(value),
                "reason": str(exc)[:500],
            }
            return safe
        if size > self._payload_bytes:
            safe = dict(answer)
            del safe["value"]
            safe["oversized"] = {"bytes": size, "limit": self._payload_bytes, "repr": _repr(value)}
            return safe
        return answer

    # -- heartbeat ---------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        seen = -1
        while True:
            time.sleep(FLUSH_INTERVAL)
            ordinal = self._ordinal
            if ordinal != seen:
                self._seen_at = time.monotonic()
            if self._current >= 0 and ordinal == seen and ordinal != self._announced:
                # The same execution on two ticks: running for at least FLUSH_INTERVAL.
                # Handshake with the main thread, which sets ``_current = -1`` and then reads
                # ``_announcing``: this thread sets ``_announcing`` and then reads
                # ``_current``, so (the GIL orders both) at least one sees the other and the
                # two never touch the pending answers or the channel at the same time.
                with self._lock:
                    self._announcing = True
                    try:
                        current = self._current  # read once: the main thread may reset it
                        if self._ordinal == ordinal and current >= 0:
                            self._flush(until=self._seen_at)
                            self._write({"t": "running", "b": self._batch, "i": current})
                            self._announced = ordinal
                            self._timed = True
                    finally:
                        self._announcing = False
            else:
                self._flush_due = True
            seen = ordinal

    # -- requests ----------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        """Once programs are loaded (and the sample zygote forked: a thread's stack mapped in
        it would cost every sample's fork)."""
        if self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat, name="evalkube-heartbeat", daemon=True
            )
            self._heartbeat_thread.start()

    def serve(self) -> int:
        self._write({"t": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid()})
        while True:
            request = read_frame(self._requests)
            if request is None:
                return 0
            op = request.get("op")
            if op == "load":
                self._load(request)
            elif op == "run":
                self._run(request)
            elif op == "ping":
                with self._lock:
                    self._write({"t": "pong"})
            else:
                with self._lock:
                    self._write(
                        {
                            "t": "error",
                            "error": {"type": "ProtocolError", "message": f"unknown op {op!r}"},
                        }
                    )

    def _load(self, request: dict[str, Any]) -> None:
        limits = request.get("limits")
        if isinstance(limits, dict):
            apply_fixed(limits)
        self._cpu.install()
        self._endpoint = request.get("model_endpoint")
        self._task_id = request.get("task_id", "")
        self._capture_chars = int(request.get("capture_chars", DEFAULT_CAPTURE_CHARS))
        self._payload_bytes = int(request.get("payload_bytes", DEFAULT_PAYLOAD_BYTES))
        scratch = request.get("scratch_dir")
        self._hygiene.scratch = scratch if isinstance(scratch, str) and scratch else None
        self._hygiene.install()  # before any user code runs (a module's import included)
        loaded: dict[str, Any] = {}
        for program in request.get("programs", []):
            name = program["name"]
            try:
                function, ctx = load(
                    program["source"],
                    program["filename"],
                    program["entrypoint"],
                    f"evalkube_user_{name}",
                )
            except LoadError as exc:
                with self._lock:
                    self._write({"t": "load_error", "name": name, "error": exc.info})
                return
            self._programs[name] = _Program(function, ctx)
            loaded[name] = {"ctx": ctx}
        if request.get("isolation") == "sample":  # before any sample reaches this process
            # no sample may open this process's /proc entries (fd, mem): it holds the batch's
            # requests and the write ends of the next processes' request pipes
            set_dumpable(False)
            self._zygote = Zygote.start(
                {name: p.function for name, p in self._programs.items()},
                hygiene=self._hygiene,
                channel_fds=(self._requests.fileno(), self._answer_fd),
                capture_chars=self._capture_chars,
            )
        self._start_heartbeat()
        with self._lock:
            self._write({"t": "loaded", "programs": loaded, "zygote": self._zygote is not None})

    def _replace_me(self, reason: str) -> None:
        """Send the answers so far and ask the host for a fresh sandbox, then exit: no later
        sample may run here (the scratch directory could not be brought back to empty and
        free, :func:`evalkube_sandbox.hygiene.verify`; or the sample zygote is gone)."""
        with self._lock:
            self._flush()
            self._write({"t": "replace", "b": self._batch, "reason": reason[:300]})
        os._exit(0)

    def _run_isolated(
        self, name: str, function: Callable[..., Any], args: list[Any], ctx: list[Any] | None
    ) -> dict[str, Any]:
        """One sample in a process of the zygote; in a child of this worker only while this
        worker has held no other sample (the zygote could not start)."""
        zygote = self._zygote
        self._held += 1
        if zygote is not None:
            answer = zygote.run(name, args, ctx, payload_bytes=self._payload_bytes)
            if answer is not None:
                return answer
            # its pipes are no fork's of this process to inherit, nor is it used again
            zygote.close()
            self._zygote, self._zygote_lost = None, True
        if self._zygote_lost and self._held > 1:
            self._replace_me(
                self._hygiene.unclean
                or "the zygote that forks each sample's process, or the process it forked, "
                "ended or was changed by a sample; no sample is forked from a worker that "
                "held other samples"
            )
        return run_isolated(
            function,
            [*args, Context(*ctx)] if ctx is not None else args,
            hygiene=self._hygiene,
            channel_fds=(self._requests.fileno(), self._answer_fd),
            capture_chars=self._capture_chars,
            payload_bytes=self._payload_bytes,
        )

    def _run(self, request: dict[str, Any]) -> None:
        self._start_heartbeat()  # a run before (or after a failed) load still has its ticks
        program = self._programs[request["program"]]
        items: list[list[Any]] = request["items"]
        exec_ids: list[str] = request.get("exec_ids") or []
        isolated = request.get("isolation") == "sample"
        hygiene = self._hygiene
        out = CappedText(self._capture_chars)
        err = CappedText(self._capture_chars)
        real_out, real_err = sys.stdout, sys.stderr
        function = program.function
        cpu_seconds = request.get("cpu_seconds")
        with self._lock:
            self._batch = request.get("batch")
            self._pending = []
            self._pending_start = 0
            self._group_start = time.monotonic()
            self._flush_due = False
            self._cpu.set(float(cpu_seconds) if isinstance(cpu_seconds, int | float) else None)
        monotonic = time.monotonic
        started = 0.0
        answer: dict[str, Any]
        for index, args in enumerate(items):
            ctx: list[Any] | None = None
            if program.wants_ctx:
                exec_id = exec_ids[index] if index < len(exec_ids) else f"exec-{index}"
                ctx = [self._endpoint, exec_id, self._task_id]
                if not isolated:
                    args = [*args, Context(*ctx)]
            timed = self._timed
            if timed:
                started = monotonic()
            ordinal = self._ordinal = self._ordinal + 1
            self._current = index
            if isolated:
                answer = self._run_isolated(request["program"], function, args, ctx)
            else:
                sys.stdout, sys.stderr = out, err
                try:
                    try:
                        self._in_user = True
                        value = function(*args)
                    finally:
                        self._in_user = False
                    answer = {"ok": True, "value": value}
                except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt
                    answer = {"ok": False, "error": describe(exc)}
                finally:
                    sys.stdout, sys.stderr = real_out, real_err
                if hygiene.dirty:  # a flag: cleaning costs syscalls only when needed
                    hygiene.clean()
            if timed:
                answer["ms"] = round((monotonic() - started) * 1000, 3)
            if out.kept or out.dropped:
                answer["stdout"] = out.text()
                out.reset()
            if err.kept or err.dropped:
                answer["stderr"] = err.text()
                err.reset()
            self._current = -1
            if self._announcing:
                with self._lock:  # the heartbeat is announcing this execution: let it finish
                    pass
            if not timed and self._announced == ordinal:
                # Slow enough to be announced: worth a clock read (exact to one tick).
                answer["ms"] = round((monotonic() - self._seen_at) * 1000, 3)
            self._pending.append(answer)
            if hygiene.unclean is not None:
                self._replace_me(hygiene.unclean)
            if self._flush_due or len(self._pending) >= FLUSH_COUNT:
                self._flush()
        if isolated and self._zygote is not None:
            unsafe = self._zygote.settle()  # before the next request is read
            if unsafe is not None:
                self._replace_me(unsafe)
        with self._lock:
            self._flush()
            self._write({"t": "done", "b": self._batch, "n": len(items)})


def _clock_cost(reads: int = 200) -> float:
    """Seconds one ``time.monotonic()`` takes here (a vDSO read, or a trapped syscall)."""
    monotonic = time.monotonic
    began = time.perf_counter()
    for _ in range(reads):
        monotonic()
    return (time.perf_counter() - began) / reads


def _repr(value: Any, limit: int = 2_000) -> str:
    try:
        text = repr(value)
    except BaseException:
        text = f"<unrepresentable {type(value).__name__}>"
    return text[:limit]


def main() -> int:
    """Take over stdin/stdout as the protocol channel and serve until stdin closes."""
    requests = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
    answer_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    # Graders allocate many short-lived acyclic objects; default thresholds make the
    # collector a large share of per-sample cost (see evalkube.util.gctune).
    gc.set_threshold(100_000, 50, 100)
    return Worker(requests, answer_fd).serve()
