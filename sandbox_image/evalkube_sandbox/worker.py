"""The worker loop: load user programs, run executions, answer in batches.

Answers leave in batches (one write per flush), yet the host always knows which execution
is in flight: the worker flushes pending answers at least every ``FLUSH_INTERVAL`` seconds
or ``FLUSH_COUNT`` answers, and a heartbeat thread announces an execution that has been
running for longer than ``FLUSH_INTERVAL`` (``{"t": "running", "i": k}``). The host holds
the deadline of each execution from that knowledge and kills the sandbox when it passes.

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
from typing import Any, BinaryIO

from evalkube_sandbox import PROTOCOL_VERSION
from evalkube_sandbox.capture import CappedText
from evalkube_sandbox.ctx import Context
from evalkube_sandbox.errors import describe
from evalkube_sandbox.loader import LoadError, load
from evalkube_sandbox.protocol import encode, read_frame
from evalkube_sandbox.rlimits import CpuBudget, apply_fixed

FLUSH_INTERVAL = 0.02
FLUSH_COUNT = 256
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
        self._current = -1
        self._current_since = 0.0
        self._announced = -1
        self._last_flush = 0.0
        self._batch: Any = None
        self._in_user = False
        self._cpu = CpuBudget(lambda: self._in_user)

    # -- channel ---------------------------------------------------------------------------
    def _write(self, message: Any) -> None:
        self._write_bytes(encode(message))

    def _write_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._answer_fd, view)
            view = view[written:]

    def _flush_locked(self) -> None:
        if self._pending:
            answers, self._pending = self._pending, []
            start = self._pending_start
            self._pending_start += len(answers)
            self._write_bytes(self._encode_results(start, answers))
        self._last_flush = time.monotonic()
        self._cpu.arm()

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
        while True:
            time.sleep(FLUSH_INTERVAL)
            current = self._current
            if current < 0 or current == self._announced:
                continue
            if time.monotonic() - self._current_since < FLUSH_INTERVAL:
                continue
            with self._lock:
                if self._current != current:
                    continue
                self._flush_locked()
                self._write({"t": "running", "b": self._batch, "i": current})
                self._announced = current

    # -- requests ----------------------------------------------------------------------------
    def serve(self) -> int:
        threading.Thread(target=self._heartbeat, name="evalkube-heartbeat", daemon=True).start()
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
        with self._lock:
            self._write({"t": "loaded", "programs": loaded})

    def _run(self, request: dict[str, Any]) -> None:
        program = self._programs[request["program"]]
        items: list[list[Any]] = request["items"]
        exec_ids: list[str] = request.get("exec_ids") or []
        out = CappedText(self._capture_chars)
        err = CappedText(self._capture_chars)
        real_out, real_err = sys.stdout, sys.stderr
        function = program.function
        cpu_seconds = request.get("cpu_seconds")
        with self._lock:
            self._batch = request.get("batch")
            self._pending = []
            self._pending_start = 0
            self._last_flush = time.monotonic()
            self._cpu.set(float(cpu_seconds) if isinstance(cpu_seconds, int | float) else None)
        monotonic = time.monotonic
        for index, args in enumerate(items):
            if program.wants_ctx:
                exec_id = exec_ids[index] if index < len(exec_ids) else f"exec-{index}"
                args = [*args, Context(self._endpoint, exec_id, self._task_id)]
            self._current_since = started = monotonic()
            self._current = index
            sys.stdout, sys.stderr = out, err
            try:
                try:
                    self._in_user = True
                    value = function(*args)
                finally:
                    self._in_user = False
                answer: dict[str, Any] = {"ok": True, "value": value}
            except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
                answer = {"ok": False, "error": describe(exc)}
            finally:
                sys.stdout, sys.stderr = real_out, real_err
            ended = monotonic()
            answer["ms"] = round((ended - started) * 1000, 3)
            if out.kept or out.dropped:
                answer["stdout"] = out.text()
                out.reset()
            if err.kept or err.dropped:
                answer["stderr"] = err.text()
                err.reset()
            with self._lock:
                self._current = -1
                self._pending.append(answer)
                if len(self._pending) >= FLUSH_COUNT or ended - self._last_flush >= FLUSH_INTERVAL:
                    self._flush_locked()
        with self._lock:
            self._flush_locked()
            self._write({"t": "done", "b": self._batch, "n": len(items)})


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
    # collector a large share of per-sample cost (see evalkube.engine.gctune).
    gc.set_threshold(100_000, 50, 100)
    return Worker(requests, answer_fd).serve()
