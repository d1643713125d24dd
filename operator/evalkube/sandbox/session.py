"""A unit's grader sandbox: batches in, answers out, deadlines enforced from outside.

The runner hands :meth:`GraderSandbox.execute` an iterable of executions (lazily: it renders
prompts while the worker grades the previous batch, so both cores work). Answers come back
in order. Each execution has a deadline of ``timeout`` seconds from the moment the runner
knows it started; past it the worker is killed, the execution becomes ``timeout``, a fresh
worker loads the same programs and the rest continue.

Knowing which execution is in flight: the worker flushes answers at least every 20 ms and
announces an execution that runs longer. When it could not (user code holding the GIL in C,
or a crash), the runner re-runs the uncertain executions one per batch ("probe mode"), so
the failure is pinned on the execution that really caused it.

Everything the worker sends is checked against what the runner expects: each frame must echo
its batch's random token, answers must come in sequence, and a batch must end after its last
answer. User code that writes forged frames to the protocol channel (it shares the worker's
process and can find the descriptor) breaks that sequence; the worker is killed, its batch is
re-run one execution at a time and the forger's execution becomes a ``protocol_error``. A
grader that reads the token out of the worker's memory can still forge answers, but only for
the executions of its own unit: every unit has its own sandbox, so a grader can only ever
change its own task's scores.

After every sample that left files, the worker wipes its scratch directory and checks it is
empty and free again; when it is not (a mount, a file it still holds open), it sends a
``replace`` frame after its answers and exits, and the rest of the work continues in a
fresh sandbox (no execution is blamed).

Limits (:class:`~evalkube.sandbox.backends.SandboxLimits`): the backend applies memory,
pids and /tmp limits around the sandbox; the worker sets its rlimits (address space, file
size, open files, CPU seconds per execution) on itself before any user code runs.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalkube import limits
from evalkube.sandbox.backends import (
    SandboxBackend,
    SandboxLimits,
    SandboxUnavailable,
    SpawnRequest,
    WorkerProcess,
)
from evalkube.sandbox.environment import LocalEnvironment, default_site_packages
from evalkube.sandbox.execution import Execution, Status, from_answer, host_error
from evalkube.sandbox.protocol import FrameError, encode, read_frame

#: Executions that can be in doubt after an unannounced failure: the worker's unflushed
#: answers (at most its flush count) plus the one in flight.
PROBE_ITEMS = 257
STARTUP_TIMEOUT = float(limits.SANDBOX_START_TIMEOUT_SECONDS)
MAX_CONSECUTIVE_START_FAILURES = 3


@dataclass(frozen=True, slots=True)
class Program:
    """User code to load into the worker."""

    name: str
    source: str
    filename: str
    entrypoint: str


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start); not attributable to one execution."""


class ProgramLoadError(Exception):
    """User code failed to load (syntax error, missing function, import-time exception)."""

    def __init__(self, program: str, error: dict[str, Any]) -> None:
        self.program = program
        self.error = error
        super().__init__(f"{program}: {error.get('type')}: {error.get('message')}")


class _Live:
    """One running worker with its reader, writer and stderr-drain threads."""

    def __init__(self, process: WorkerProcess) -> None:
        self.process = process
        #: ``(kind, frame, arrival time)``: deadlines count from when a frame arrived, not
        #: from when the (possibly busy) consumer looked at it.
        self.frames: queue.SimpleQueue[tuple[str, Any, float]] = queue.SimpleQueue()
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.stderr_tail = b""
        #: Answers this worker has sent: it asks to be replaced only after a sample's answer
        #: (the one that left what it cannot wipe), so a ``replace`` before any is forged.
        self.answers = 0
        self._threads = [
            threading.Thread(target=self._read, name="evalkube-sandbox-read", daemon=True),
            threading.Thread(target=self._write, name="evalkube-sandbox-write", daemon=True),
            threading.Thread(target=self._drain, name="evalkube-sandbox-stderr", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        try:
            while (frame := read_frame(self.process.stdout)) is not None:
                self.frames.put(("frame", frame, time.monotonic()))
        except FrameError as exc:
            self.frames.put(("bad", str(exc), time.monotonic()))
            return
        except (OSError, ValueError):
            pass
        self.frames.put(("eof", None, time.monotonic()))

    def _write(self) -> None:
        while True:
            data = self.outbox.get()
            if data is None:
                return
            try:
                self.process.stdin.write(data)
                self.process.stdin.flush()
            except (OSError, ValueError):
                return

    def _drain(self) -> None:
        keep = limits.WORKER_STDERR_TAIL_BYTES
        try:
            while chunk := self.process.stderr.read1(65_536):  # type: ignore[attr-defined]
                self.stderr_tail = (self.stderr_tail + chunk)[-keep:]
        except (OSError, ValueError):
            return

    def send(self, message: Any) -> None:
        self.outbox.put(encode(message))

    def next(self, deadline: float) -> tuple[str, Any, float]:
        """The next event (``frame``, ``eof``, ``bad``) or ``("timeout", None, now)``."""
        try:
            return self.frames.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return ("timeout", None, time.monotonic())

    def stop(self) -> None:
        self.outbox.put(None)
        self.process.kill()
        for thread in self._threads:
            thread.join(timeout=5)

    def crash_detail(self) -> str:
        try:
            code: int | None = self.process.popen.wait(timeout=2)
        except Exception:  # still running: it stopped answering instead
            code = None
        if code is None:
            detail = "the grader worker stopped answering"
        else:
            reason = self.process.exit_reason(code)
            detail = f"the grader worker exited (code {code}{': ' + reason if reason else ''})"
        tail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        return detail + (": " + " | ".join(tail) if tail else "")


#: One execution to run: ``(index, args, exec_id)`` (a tuple: built for every sample).
_Item = tuple[int, list[Any], str | None]


@dataclass(slots=True)
class _Batch:
    program: str
    items: list[_Item]
    #: Echoed by the worker on every frame about this batch: a frame without it was not
    #: written by the worker's protocol code (user code forging answers).
    token: str
    answered: int = 0


class GraderSandbox:
    """Runs one unit's programs in a sandbox backend, surviving timeouts and crashes."""

    def __init__(
        self,
        backend: SandboxBackend,
        programs: Sequence[Program],
        *,
        task_id: str,
        model_endpoint: str | None = None,
        load_timeout: float = float(limits.TIMEOUT_SECONDS_DEFAULT),
        batch_size: int = limits.WORKER_BATCH_SIZE,
        sandbox_limits: SandboxLimits | None = None,
        isolation: str = "unit",
        environment: LocalEnvironment | None = None,
    ) -> None:
        self.backend = backend
        #: The packages the worker may import (``None``: the managed grader environment).
        self.environment = environment
        #: ``sample``: a fresh process per execution, forked by the worker's zygote (which
        #: never held a sample, so requests may carry many); when the worker has none, the
        #: worker forks it and then must never hold another sample's data when it forks: one
        #: sample per request, one request at a time (:attr:`one_at_a_time`).
        self.isolation = isolation
        self.one_at_a_time = isolation == "sample"
        self.programs = list(programs)
        self.task_id = task_id
        self.model_endpoint = model_endpoint
        self.load_timeout = load_timeout
        self.batch_size = batch_size
        self.limits = sandbox_limits or SandboxLimits()
        self.wants_ctx: dict[str, bool] = {}
        self.restarts = 0
        self._live: _Live | None = None
        secret = os.urandom(8).hex()
        self._tokens = (f"{secret}-{n}" for n in itertools.count())

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start a worker and load the programs; :class:`ProgramLoadError` on bad user code."""
        for attempt in range(1, MAX_CONSECUTIVE_START_FAILURES + 1):
            try:
                self._live = self._spawn_and_load()
                return
            except SandboxError:
                if attempt == MAX_CONSECUTIVE_START_FAILURES:
                    raise

    def _site_packages(self) -> Path | None:
        """The host package directory to mount; none for a pod's grader container (its
        image holds its environment)."""
        if not self.backend.mounts_environment:
            return None
        if self.environment is None:
            return default_site_packages()
        return self.environment.site_packages

    def _spawn_and_load(self) -> _Live:
        request = SpawnRequest(
            limits=self.limits,
            model_endpoint=self.model_endpoint,
            environment=self._site_packages(),
        )
        try:
            process = self.backend.spawn(request)
        except SandboxUnavailable as exc:
            raise SandboxError(f"the {self.backend.name} sandbox cannot start: {exc}") from None
        except OSError as exc:
            raise SandboxError(f"the {self.backend.name} sandbox failed to start: {exc}") from None
        live = _Live(process)
        try:
            kind, frame, _ = live.next(time.monotonic() + STARTUP_TIMEOUT)
            if kind != "frame" or not isinstance(frame, dict) or frame.get("t") != "hello":
                self.backend.worker_did_not_start()
                raise SandboxError(
                    f"worker did not start ({self.backend.name}): {live.crash_detail()}"
                )
            live.send(
                {
                    "op": "load",
                    "task_id": self.task_id,
                    "model_endpoint": process.model_endpoint,
                    "capture_chars": limits.CAPTURED_OUTPUT_CHARS,
                    "payload_bytes": limits.RESULT_PAYLOAD_BYTES,
                    "limits": process.rlimits,
                    # sample: the worker starts the zygote its samples' processes come from
                    "isolation": self.isolation,
                    # wiped after a sample that left files: the sandbox's private /tmp, or
                    # the plain process's own working directory
                    "scratch_dir": "/tmp"
                    if self.backend.isolating
                    else (str(process.workdir) if process.workdir else None),
                    "programs": [asdict(p) for p in self.programs],
                }
            )
            kind, frame, _ = live.next(
                time.monotonic() + self.load_timeout + limits.TIMEOUT_GRACE_SECONDS
            )
            if kind == "timeout":
                raise ProgramLoadError(
                    "program",
                    host_error("Timeout", f"loading took longer than {self.load_timeout:g} s"),
                )
            if kind != "frame" or not isinstance(frame, dict):
                raise SandboxError(f"worker failed while loading programs: {live.crash_detail()}")
            if frame.get("t") == "load_error":
                error = frame.get("error")
                name = str(frame.get("name"))
                raise ProgramLoadError(name, error if isinstance(error, dict) else {})
            if frame.get("t") != "loaded" or not isinstance(frame.get("programs"), dict):
                raise SandboxError("worker answered the load request with an unexpected frame")
            self.wants_ctx = {
                name: bool(info.get("ctx"))
                for name, info in frame["programs"].items()
                if isinstance(info, dict)
            }
            self.one_at_a_time = self.isolation == "sample" and frame.get("zygote") is not True
            return live
        except BaseException:
            live.stop()
            raise

    def close(self) -> None:
        """Stop the worker; nothing is left running."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __enter__(self) -> GraderSandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _restart(self) -> None:
        self.close()
        self.restarts += 1
        self.start()

    # -- executions --------------------------------------------------------------------------
    def execute(
        self,
        program: str,
        items: Iterable[tuple[list[Any], str | None]],
        *,
        timeout: float,
    ) -> Iterator[Execution]:
        """Run ``program`` once per ``(args, exec_id)``; yield executions in input order.

        Closing the iterator early stops the worker (the next call starts a fresh one).
        """
        source = iter(items)
        requeue: deque[_Item] = deque()
        in_flight: deque[_Batch] = deque()
        next_index = 0
        probe_left = 0
        exhausted = False
        announced = -1
        cpu_seconds = self.limits.cpu_seconds or math.ceil(timeout)
        if self._live is None:
            self.start()

        def take(size: int) -> list[_Item]:
            nonlocal next_index, exhausted
            batch: list[_Item] = []
            while requeue and len(batch) < size:
                batch.append(requeue.popleft())
            if not exhausted and len(batch) < size:
                fresh = list(itertools.islice(source, size - len(batch)))
                exhausted = len(batch) + len(fresh) < size
                batch += [
                    (next_index + n, args, exec_id) for n, (args, exec_id) in enumerate(fresh)
                ]
                next_index += len(fresh)
            return batch

        pipeline = 1 if self.one_at_a_time else 2

        def fill() -> None:
            nonlocal probe_left
            assert self._live is not None
            while len(in_flight) < pipeline:
                size = 1 if probe_left > 0 or self.one_at_a_time else self.batch_size
                batch_items = take(size)
                if not batch_items:
                    return
                if probe_left > 0:
                    probe_left -= 1
                batch = _Batch(program, batch_items, next(self._tokens))
                in_flight.append(batch)
                self._live.send(
                    {
                        "op": "run",
                        "program": program,
                        "batch": batch.token,
                        "cpu_seconds": cpu_seconds,
                        "items": [item[1] for item in batch_items],
                        "exec_ids": [item[2] for item in batch_items],
                        "isolation": self.isolation,
                    }
                )

        try:
            fill()
            mark = time.monotonic()
            while in_flight:
                assert self._live is not None
                head = in_flight[0]
                expected = head.answered
                deadline = mark + timeout + limits.TIMEOUT_GRACE_SECONDS
                kind, frame, arrived = self._live.next(deadline)
                failure: Execution | None = None
                replace = False
                if kind == "frame":
                    outcome = self._accept(head, frame)
                    if isinstance(outcome, list):
                        mark = arrived
                        self._live.answers += len(outcome)
                        for local, answer in outcome:
                            yield from_answer(head.items[local][0], answer)
                        continue
                    if outcome == "running":
                        announced = expected
                        continue
                    if outcome == "done":
                        in_flight.popleft()
                        fill()
                        mark = max(arrived, mark)
                        announced = -1
                        continue
                    # "replace": the worker could not wipe its scratch directory back to empty
                    # and free after the last answer it sent: the rest run in a fresh sandbox,
                    # with no one to blame. One before any answer is user code's (it found the
                    # token): blamed, or it could restart the sandbox forever at no cost
                    replace = outcome == "replace" and self._live.answers > 0
                    if outcome == "replace" and not replace:
                        outcome = (
                            "a replace frame before any answer (user code wrote to the "
                            "protocol channel?)"
                        )
                    if not replace:
                        failure = self._blame(head, "protocol_error", "ProtocolError", outcome)
                elif kind == "bad":
                    failure = self._blame(head, "protocol_error", "ProtocolError", str(frame))
                elif kind == "eof":
                    failure = self._blame(
                        head, "crashed", "WorkerCrashed", self._live.crash_detail()
                    )
                else:
                    failure = self._blame(
                        head,
                        "timeout",
                        "Timeout",
                        f"the execution exceeded timeout_seconds={timeout:g}; the sandbox was "
                        "killed and a fresh one continued with the remaining samples",
                    )
                # The worker is no longer trustworthy: kill it, decide whom to blame, go on.
                leftovers = [item for batch in in_flight for item in batch.items[batch.answered :]]
                in_flight.clear()
                if failure is not None and (announced == expected or len(head.items) == 1):
                    yield failure
                    leftovers = leftovers[1:]
                elif leftovers and not replace:
                    probe_left = PROBE_ITEMS
                requeue.extendleft(reversed(leftovers))
                announced = -1
                self._restart()
                fill()
                mark = time.monotonic()
        finally:
            # Abandoned early (``next(iter(execute(...)))``) or failed: a worker still busy
            # with stale work is stopped; one that only owes the end of its batch is kept.
            if in_flight and not self._finish(in_flight):
                self.close()

    def _finish(self, in_flight: deque[_Batch]) -> bool:
        """Read the ends of fully answered batches; False when the worker owes more."""
        if self._live is None or any(b.answered < len(b.items) for b in in_flight):
            return False
        deadline = time.monotonic() + limits.TIMEOUT_GRACE_SECONDS
        while in_flight:
            kind, frame, _ = self._live.next(deadline)
            if kind != "frame" or self._accept(in_flight[0], frame) != "done":
                return False
            in_flight.popleft()
        return True

    @staticmethod
    def _blame(head: _Batch, status: Status, kind: str, message: str) -> Execution | None:
        """The failure of the head batch's first unanswered execution (``None``: all answered)."""
        if head.answered >= len(head.items):
            return None
        return Execution(head.items[head.answered][0], status, error=host_error(kind, message))

    @staticmethod
    def _accept(head: _Batch, frame: Any) -> list[tuple[int, Any]] | str:
        """Check one frame against the head batch; answers, ``running``/``done`` or a violation."""
        if not isinstance(frame, dict):
            return "frame is not an object"
        kind = frame.get("t")
        if frame.get("b") != head.token:
            return (
                f"a {str(kind)[:20]!r} frame that the worker did not write for this batch "
                "(user code wrote to the protocol channel?)"
            )
        if kind == "results":
            answers = frame.get("answers")
            start = frame.get("start")
            if start != head.answered or not isinstance(answers, list) or not answers:
                return f"results for position {start!r} while {head.answered} was expected"
            if head.answered + len(answers) > len(head.items):
                return "more answers than executions in the batch"
            out = [(head.answered + offset, answer) for offset, answer in enumerate(answers)]
            head.answered += len(answers)
            return out
        if kind == "running":
            if frame.get("i") != head.answered:
                return f"announced position {frame.get('i')!r} while {head.answered} was expected"
            return "running"
        if kind == "done":
            if frame.get("n") != len(head.items) or head.answered != len(head.items):
                return "batch ended before every execution was answered"
            return "done"
        if kind == "replace":  # the scratch wipe failed its check: no sample may run here
            return "replace"
        return f"unexpected frame type {kind!r}"
