"""``isolation: sample``: each execution in a fresh process that has never held another
sample's data.

For graders that run model output. The worker forks a **zygote** when it loads the programs,
before any sample exists; the zygote forks each sample's process ahead of time (while the
host handles the previous answer), so the fork is off the sample's path, and a sample's
process is a copy of a process that never saw a sample: no other sample's bytes are anywhere
in its memory, freed or not. The child runs the grader function and hands its answer (as
JSON, size-capped) to the worker over a pipe; the worker decodes it, checks its shape and
encodes the answer itself, so a sample can change only its own result: it cannot patch the
worker's encoder or reach the protocol channel (neither process has it).

Afterwards the worker kills every process the sample started (its process group, then every
process below the worker but the zygote: the worker is a subreaper) and wipes the scratch
directory. Only then, with no process of the sample left, does it wake the zygote (``SIGCONT``)
and, as the next sample starts, ask for the process after it (the next process to read the
request pipe this sample read). What a sample could do to the zygote while it ran is
checked or undone before that fork: the zygote blocks every signal it can, is not dumpable (no
ptrace, no ``/proc/PID/mem``), and compares its rlimits, nice value and CPU affinity (which
its children inherit, and which ``prlimit``/``setpriority``/``sched_setaffinity`` can change
from outside) with those it started with; the worker reads the same of the process forked
for the next sample, from outside it, before it sends that process its sample. A zygote (or
a process) that was killed or changed is gone for good: the worker asks the host for a fresh
sandbox (the ``replace`` frame) rather than fork the next sample from its own memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
from collections.abc import Callable

from evalkube_sandbox.capture import CappedText
from evalkube_sandbox.errors import describe
from evalkube_sandbox.hygiene import Hygiene

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any

#: Keys an isolated answer may carry back (anything else is a protocol violation).
ANSWER_KEYS = frozenset({"ok", "value", "error", "stdout", "stderr", "unserializable", "oversized"})


def run_isolated(
    function: Callable[..., Any],
    args: list[Any],
    *,
    hygiene: Hygiene,
    channel_fds: tuple[int, ...],
    capture_chars: int,
    payload_bytes: int,
) -> dict[str, Any]:
    """One execution of ``function(*args)`` in a child of the worker (no zygote: the
    worker's own memory, with whatever earlier samples left in it, is the child's)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.close(read_end)
            close_all(channel_fds)
            write_all(write_end, run_here(function, args, hygiene, capture_chars))
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        data, complete = _read_answer(read_end, pid, payload_bytes)
    finally:
        os.close(read_end)
        end_group(pid)
        hygiene.clean()
    return decode(data, complete, payload_bytes)


def run_here(
    function: Callable[..., Any], args: list[Any], hygiene: Hygiene, capture_chars: int
) -> bytes:
    """Run the sample in this (child) process, in its own process group; its answer."""
    enter(hygiene)
    return run_captured(function, args, capture_chars)


def enter(hygiene: Hygiene) -> None:
    """Make this (child) process a sample's: its own process group (killed as a whole
    afterwards), the scratch directory as its working and temporary directory."""
    os.setpgid(0, 0)
    if hygiene.scratch:
        os.chdir(hygiene.scratch)
        os.environ["TMPDIR"] = hygiene.scratch
        tempfile: Any = sys.modules.get("tempfile")  # not imported: a module costs each fork
        if tempfile is not None:
            tempfile.tempdir = hygiene.scratch


def run_captured(function: Callable[..., Any], args: list[Any], capture_chars: int) -> bytes:
    """``function(*args)`` with its output captured; the encoded answer."""
    out, err = CappedText(capture_chars), CappedText(capture_chars)
    sys.stdout, sys.stderr = out, err
    try:
        answer: dict[str, Any] = {"ok": True, "value": function(*args)}
    except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt too
        answer = {"ok": False, "error": describe(exc)}
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if out.kept or out.dropped:
        answer["stdout"] = out.text()
    if err.kept or err.dropped:
        answer["stderr"] = err.text()
    return _encode(answer)


def close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _encode(answer: dict[str, Any]) -> bytes:
    try:
        return json.dumps(answer, separators=(",", ":")).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:
        value = answer.pop("value", None)
        answer["unserializable"] = {
            "type": type(value).__name__,
            "repr": _repr(value),
            "reason": str(exc)[:500],
        }
        return json.dumps(answer, separators=(",", ":")).encode("utf-8", "surrogatepass")


def _repr(value: Any, limit: int = 2_000) -> str:
    try:
        return repr(value)[:limit]
    except BaseException:
        return f"<unrepresentable {type(value).__name__}>"


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_answer(fd: int, pid: int, payload_bytes: int) -> tuple[bytes, bool]:
    """The child's bytes and whether they ended at its exit (not at the size cap)."""
    chunks: list[bytes] = []
    size = 0
    exited = False
    while True:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
            if size > payload_bytes + 4096:
                return b"".join(chunks), False
        elif exited:
            # the child is gone but something it started holds the pipe open
            return b"".join(chunks), True
        else:
            if has_exited(pid):
                exited = True
                end_group(pid)


def has_exited(pid: int) -> bool:
    """Whether ``pid`` ended (our child: reaped here; the zygote's: a zombie or gone)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def end_group(pid: int) -> None:
    """Kill the sample's process group; wait for it when it is our child (the zygote's are
    swept by :meth:`Hygiene.clean`, which waits until none is left alive)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def decode(
    data: bytes, complete: bool, payload_bytes: int, size: int | None = None
) -> dict[str, Any]:
    """The parent's own answer from the child's bytes (``size``: as many as the child said
    it sent, when not all were read): shape checked, never trusted."""
    if not complete or len(data) > payload_bytes + 4096:
        return {
            "ok": True,
            "oversized": {"bytes": size or len(data), "limit": payload_bytes, "repr": ""},
        }
    if not data:
        return {
            "ok": False,
            "error": {
                "type": "SampleProcessDied",
                "message": "the sample's process exited without an answer",
                "traceback": "",
            },
        }
    try:
        answer = json.loads(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        answer = None
        reason = str(exc)[:200]
    else:
        reason = "unexpected keys or types"
    if (
        not isinstance(answer, dict)
        or not set(answer) <= ANSWER_KEYS
        or answer.get("ok") not in (True, False)
    ):
        return {
            "ok": False,
            "error": {
                "type": "InvalidSampleAnswer",
                "message": f"the sample's process sent an unreadable answer ({reason})",
                "traceback": "",
            },
        }
    return answer
