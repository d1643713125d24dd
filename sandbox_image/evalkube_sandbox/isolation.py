"""``isolation: sample``: each execution in a fresh process forked from the warm worker.

For graders that run model output. The child runs the grader function and hands its answer
(as JSON, size-capped) to the parent over a pipe; the parent decodes it, checks its shape
and encodes the answer itself, so a sample can change only its own result: it cannot patch
the parent's encoder, reach the protocol channel (closed in the child), or see another
sample's data (the host sends one sample per request in this mode, so the parent holds no
other when it forks). Afterwards the parent kills every process the sample started (its
process group, then every descendant: the worker is a subreaper) and wipes the scratch
directory, so the next sample starts from the same clean state.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from evalkube_sandbox.capture import CappedText
from evalkube_sandbox.errors import describe
from evalkube_sandbox.hygiene import Hygiene

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
    """One execution of ``function(*args)`` in a child process; the worker's answer dict."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(function, args, read_end, write_end, hygiene, channel_fds, capture_chars)
    os.close(write_end)
    try:
        data, complete = _read_answer(read_end, pid, payload_bytes)
    finally:
        os.close(read_end)
        _end_group(pid)
        hygiene.clean()
    return _decode(data, complete, payload_bytes)


def _child(
    function: Callable[..., Any],
    args: list[Any],
    read_end: int,
    write_end: int,
    hygiene: Hygiene,
    channel_fds: tuple[int, ...],
    capture_chars: int,
) -> None:
    status = 0
    try:
        os.close(read_end)
        for fd in channel_fds:  # the protocol channel is the parent's alone
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setpgid(0, 0)  # its own process group: killed as a whole afterwards
        if hygiene.scratch:
            os.chdir(hygiene.scratch)
            os.environ["TMPDIR"] = tempfile.tempdir = hygiene.scratch
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
        _write_all(write_end, _encode(answer))
    except BaseException:
        status = 1
    finally:
        os._exit(status)


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


def _write_all(fd: int, data: bytes) -> None:
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
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                exited = True
                _end_group(pid)


def _end_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _decode(data: bytes, complete: bool, payload_bytes: int) -> dict[str, Any]:
    """The parent's own answer from the child's bytes: shape checked, never trusted."""
    if not complete or len(data) > payload_bytes + 4096:
        return {
            "ok": True,
            "oversized": {"bytes": len(data), "limit": payload_bytes, "repr": ""},
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
