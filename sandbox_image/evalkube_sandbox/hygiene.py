"""What one sample leaves behind never reaches the next: files in the scratch directory and
processes it started.

Cleaning costs syscalls (listing /tmp, scanning /proc), which under gVisor's ptrace platform
cost 6-7 µs each: more than grading an exact-match sample. So the worker watches with a
Python audit hook (no syscall; a flag) for what can leave something behind (opening a file
for writing, creating or renaming files, starting processes, any use of ctypes) and cleans
only after a sample that did one of those. Audit hooks cannot be removed; a grader that
patches the worker itself can still evade this: ``isolation: sample`` is the mode for code
that must not be trusted with the next sample (:mod:`evalkube_sandbox.isolation`).

The worker makes itself a child subreaper, so processes whose parent exits (a daemonized
grandchild) are re-parented to it and found by the scan.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from typing import Any

#: Audit events after which processes may outlive the sample.
PROCESS_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.exec",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "pty.spawn",
    }
)
#: Audit events after which files may be left in the scratch directory.
FILE_EVENTS = frozenset(
    {
        "os.mkdir",
        "os.rename",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.chmod",
        "os.utime",
        "shutil.copyfile",
        "shutil.copytree",
        "shutil.move",
        "shutil.make_archive",
        "shutil.unpack_archive",
        "tempfile.mkstemp",
        "tempfile.mkdtemp",
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PR_SET_CHILD_SUBREAPER = 36


class Hygiene:
    """Watches a worker's executions and cleans up after the ones that left something."""

    def __init__(self, scratch: str | None) -> None:
        #: The directory wiped between samples (the sandbox's private /tmp); ``None``: none.
        self.scratch = scratch
        self.dirty = False
        self._installed = False

    def install(self) -> None:
        """Become a child subreaper and start watching (before any user code runs); once."""
        if self._installed:
            return
        self._installed = True
        become_subreaper()
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.dirty:
            return
        if event == "open":
            mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, None)
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags >= 0 and flags & _WRITE_FLAGS
            ):
                self.dirty = True
        elif event in PROCESS_EVENTS or event in FILE_EVENTS or event.startswith("ctypes."):
            self.dirty = True

    def after_sample(self) -> None:
        """Clean up if the sample did something that can leave state behind."""
        if self.dirty:
            self.clean()

    def clean(self) -> None:
        kill_descendants()
        if self.scratch:
            wipe(self.scratch)
        self.dirty = False


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process (Linux prctl); False if not."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError, ImportError):
        return False


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc: threads are not processes there)."""
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(name))
    return found


def kill_descendants(rounds: int = 50) -> int:
    """SIGKILL every descendant of this process, reaping them; how many were killed.

    Killing a child re-parents its own children to us (subreaper): repeat until none is left.
    """
    me = os.getpid()
    killed = 0
    for _ in range(rounds):
        children = _children(me)
        if not children:
            break
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        for child in children:
            # wait for each to be gone (SIGKILL cannot be caught): a killed child that has not
            # exited yet would otherwise still be there when the next sample starts
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)
        reap()
    reap()
    return killed


def reap() -> None:
    """Collect every exited child (no zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wipe(directory: str) -> None:
    """Remove everything inside ``directory`` (not the directory itself)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for name in entries:
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass
