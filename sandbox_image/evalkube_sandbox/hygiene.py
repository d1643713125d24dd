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
import select
import signal
import stat
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from collections.abc import Callable
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
        "socket.bind",  # a unix socket is a file
        "sqlite3.connect",  # a database file, and its journal beside it
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
        #: Why the last wipe left the scratch directory unlike a fresh one (``None``: it
        #: did not): the worker then has the host replace the sandbox.
        self.unclean: str | None = None
        #: Processes the sweep leaves alive (the sample zygote; what they start is swept).
        self.keep: frozenset[int] = frozenset()
        #: The last sample's process and a pidfd of it (``None``: none): once its whole
        #: thread group has exited, the sweep need not read its /proc entry
        #: (:func:`kill_descendants`). Only the last one: its parent, the zygote, reaps it
        #: no earlier than the next fork, so its pid cannot be another process's yet.
        self.ended: tuple[int, int] | None = None
        #: The pid of a process forked for the next sample while the sweep runs, once it is
        #: forked (``None``: none): called, and kept, when /proc shows a process the sweep
        #: does not know (the sample zygote's :meth:`~evalkube_sandbox.zygote.Zygote._newborn`).
        self.newborn: Callable[[], int | None] | None = None
        #: The scratch directory's permission bits before any user code ran (``None``: not
        #: read): a sample may own the directory itself (bwrap, nsjail) and change them.
        self.scratch_mode: int | None = None
        self._installed = False

    def install(self) -> None:
        """Become a child subreaper and start watching (before any user code runs); once."""
        if self._installed:
            return
        self._installed = True
        if self.scratch:
            self.scratch_mode = scratch_mode(self.scratch)
        become_subreaper()
        sys.addaudithook(self._audit)
        self._flag_unaudited()

    def _flag_unaudited(self) -> None:
        """Calls that leave processes or files behind but raise no audit event (creating a
        FIFO or a device node, ``_posixsubprocess.fork_exec`` called directly) mark the
        sample too: wrapped where graders find them, before any grader code runs."""

        def flagging(call: Any) -> Any:
            def flagged(*args: Any, **kwargs: Any) -> Any:
                self.dirty = True
                return call(*args, **kwargs)

            return flagged

        import posix

        for name in ("mkfifo", "mknod"):
            if hasattr(os, name):
                wrapped = flagging(getattr(os, name))
                setattr(os, name, wrapped)
                setattr(posix, name, wrapped)
        try:
            import _posixsubprocess
        except ImportError:
            return
        _posixsubprocess.fork_exec = flagging(_posixsubprocess.fork_exec)

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
        """Kill what the sample started, empty the scratch directory and check that it is
        empty and free again (:attr:`unclean` says why not)."""
        try:
            self.keep -= kill_descendants(self.keep, ended=self.ended, newborn=self.newborn)
        except ProcessesSurvived as exc:
            self.unclean = str(exc)  # the worker has the host replace the sandbox
            self.dirty = False
            return
        if self.scratch:
            restore_mode(self.scratch, self.scratch_mode)
            wipe(self.scratch)
            self.unclean = verify(self.scratch, self.scratch_mode)
        self.dirty = False


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process (Linux prctl); False if not."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError, ImportError):
        return False


def _process_table() -> dict[int, tuple[int, bool]]:
    """``pid -> (parent pid, whether it may still run)`` of every process in /proc (threads
    are not listed). A process shown as a zombie may run on: its first thread exited, the
    others did not (``num_threads``; gVisor has no ``/proc/PID/task`` for it)."""
    table: dict[int, tuple[int, bool]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            running = fields[0] not in (b"Z", b"X") or int(fields[17]) > 1
            table[int(name)] = (int(fields[1]), running)
        except (OSError, IndexError, ValueError):
            continue
    return table


def live_descendants(root: int, keep: frozenset[int] = frozenset()) -> list[int]:
    """Every process below ``root`` that may still run, but the ``keep`` processes
    themselves (what they started is listed)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _running) in table.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            todo.append(child)
            if child not in keep and table[child][1]:
                found.append(child)
    return found


def kill_descendants(
    keep: frozenset[int] = frozenset(),
    rounds: int = 200,
    ended: tuple[int, int] | None = None,
    newborn: Callable[[], int | None] | None = None,
) -> set[int]:
    """SIGKILL every process below this one but ``keep`` (our children), until none is left
    alive, reaping our own children; the pids reaped.

    When /proc lists no process but this one, its parent, the kept ones and ``ended`` (a pid
    and a pidfd of it) whose whole thread group has exited, there is nothing to kill and the
    scan that reads every process's /proc entry (about a millisecond each under gVisor) is
    skipped: in a sandbox of its own (a PID namespace), the common case after a sample.
    A process it does not know may be one being forked for the next sample: ``newborn()``
    says its pid (waiting for the fork), and it is kept.

    Killing a child re-parents its own children to us (subreaper); a process below a kept one
    is not ours to reap: each round looks again until only exited processes remain. A kept
    child that is reaped here has exited: its pid, which a new process may get, is kept no
    longer.
    """
    me = os.getpid()
    reaped = reap()
    keep = keep - reaped
    strangers = _strangers(me, keep, ended)
    if strangers and newborn is not None and (born := newborn()) is not None:
        keep = keep | {born}
        strangers = [pid for pid in strangers if pid != born]
    if strangers == []:
        return reaped
    for _ in range(rounds):
        alive = live_descendants(me, keep)
        if not alive:
            break
        waited = False
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in alive:
            # wait for each to be gone (SIGKILL cannot be caught): a killed child that has not
            # exited yet would otherwise still be there when the next sample starts
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
                reaped.add(pid)
                waited = True
        reaped |= reap()
        keep -= reaped
        if not waited:
            time.sleep(0.0005)  # not our children: give the kills a moment to land
    else:
        if live_descendants(me, keep):
            raise ProcessesSurvived("processes a sample started survived every kill")
    return reaped | reap()


def _strangers(me: int, keep: frozenset[int], ended: tuple[int, int] | None) -> list[int] | None:
    """The processes /proc lists but this one, its parent, the kept ones and ``ended`` once
    its whole thread group has exited; ``None``: /proc cannot be listed. None of them: no
    process of a sample runs.

    ``ended`` was killed: its exit is awaited (up to :data:`ENDED_EXIT_SECONDS`) *before*
    /proc is listed, since a fork it was in when killed may still complete (gVisor lets it):
    once it has exited, every process it made is in the listing, a stranger."""
    gone = ended is not None and _exited(ended[1], ENDED_EXIT_SECONDS)
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    known = {me, os.getppid(), *keep}
    if gone and ended is not None:
        known.add(ended[0])
    return [int(name) for name in names if name.isdigit() and int(name) not in known]


#: Seconds the sweep waits for the last sample's process (killed) to exit before it scans.
ENDED_EXIT_SECONDS = 0.5


def _exited(pidfd: int, timeout: float = 0.0) -> bool:
    """Whether the process of ``pidfd`` and all its threads have exited (it polls readable
    then, on Linux and gVisor alike), waiting up to ``timeout`` seconds."""
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    except (OSError, ValueError):
        return False


class ProcessesSurvived(RuntimeError):
    """The sweep ran out of rounds with processes still alive."""


def reap() -> set[int]:
    """Collect every exited child (no zombies); their pids."""
    reaped: set[int] = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.add(pid)


#: Entries the wipe removes at most before it gives up (and the sandbox is replaced): a
#: 64 MiB tmpfs holds at most a few hundred thousand.
WIPE_ENTRIES_MAX = 1_000_000
#: How the wipe's staging directory is named in the scratch directory (a random suffix).
STAGING_PREFIX = ".evalkube-wipe-"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def wipe(directory: str) -> None:
    """Remove everything inside ``directory`` (not the directory itself), whatever the
    sample did to it: directories it made unreadable or unwritable (``chmod 0500``/``000``)
    are given back to their owner first, trees deeper than ``PATH_MAX`` are flattened (each
    directory's subdirectories are moved into a staging directory before it is removed, so
    no path grows and no recursion happens), and hard links go with their names. What still
    cannot be removed (a mount point) is left for :func:`verify` to report.

    The sample may have made any name first, the wipe's own included: the staging directory
    is made by the wipe (an exclusive ``mkdir`` under a random name, another name if that
    one exists) and directories are moved into it under names only the wipe gives there.
    When it cannot be made (a full filesystem), directories are moved up into ``directory``
    under random names checked to be free.

    An empty directory (what a sample that wrote nothing leaves) costs one listing.
    """
    with contextlib.suppress(OSError):
        if not os.listdir(directory):
            return
    try:
        root = os.open(directory, _DIR_FLAGS)
    except OSError:
        return
    try:
        staging = _make_staging(root)
        if staging is None:
            _wipe_flat(root, _Stage(root, f"{_staging_name()}-", check=True))
            return
        name, fd = staging
        try:
            _wipe_flat(root, _Stage(fd, ""), skip=name)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=root)
    finally:
        os.close(root)


def _staging_name() -> str:
    return f"{STAGING_PREFIX}{os.urandom(8).hex()}"


def _make_staging(root: int) -> tuple[str, int] | None:
    """A directory the wipe made in ``root`` (its name, an open descriptor); ``None``: none."""
    for _ in range(16):
        name = _staging_name()
        try:
            os.mkdir(name, 0o700, dir_fd=root)  # fails if the name exists: it is ours
        except FileExistsError:
            continue
        except OSError:
            return None
        try:
            return name, os.open(name, _DIR_FLAGS, dir_fd=root)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=root)
            return None
    return None


class _Stage:
    """Where subdirectories are moved: fresh names in a directory (``fd``)."""

    def __init__(self, fd: int, prefix: str, *, check: bool = False) -> None:
        self.fd = fd
        self.prefix = prefix
        #: Names may exist there already (not the wipe's own directory): skip those.
        self.check = check
        self.count = 0

    def fresh(self) -> str:
        while True:
            self.count += 1
            name = f"{self.prefix}{self.count}"
            if not self.check:
                return name
            try:
                os.lstat(name, dir_fd=self.fd)
            except OSError:  # free (or not to be known: a failed rename leaves it stuck)
                return name


def _wipe_flat(root: int, stage: _Stage, skip: str | None = None) -> None:
    """Empty ``root`` (but its entry ``skip``) and the stage, round after round of listing
    both until nothing more can be removed."""
    parents = (root,) if stage.fd == root else (root, stage.fd)
    stuck: set[tuple[int, str]] = set()
    removed = 0
    while removed < WIPE_ENTRIES_MAX:
        progress = False
        for parent in parents:
            try:
                names = os.listdir(parent)
            except OSError:
                return
            for name in names:
                if (parent, name) in stuck or (parent == root and name == skip):
                    continue
                progress = True
                removed += 1
                if _is_dir(parent, name):
                    _empty_into(parent, name, stage)
                    try:
                        os.rmdir(name, dir_fd=parent)
                    except OSError:
                        stuck.add((parent, name))  # a mount point, or a directory that refilled
                else:
                    try:
                        os.unlink(name, dir_fd=parent)
                    except OSError:
                        stuck.add((parent, name))
        if not progress:
            return


def _is_dir(parent: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        return False


def _empty_into(parent: int, name: str, stage: _Stage) -> None:
    """Unlink the files of ``parent/name`` and move its subdirectories into the stage (under
    fresh names)."""
    with contextlib.suppress(OSError):
        os.chmod(name, 0o700, dir_fd=parent)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return
    try:
        for child in os.listdir(fd):
            if _is_dir(fd, child):
                with contextlib.suppress(OSError):  # moving a directory rewrites its ``..``
                    os.chmod(child, 0o700, dir_fd=fd)
                with contextlib.suppress(OSError):
                    os.rename(child, stage.fresh(), src_dir_fd=fd, dst_dir_fd=stage.fd)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(child, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def scratch_mode(directory: str) -> int | None:
    """The permission bits of ``directory`` (``None``: it cannot be read)."""
    try:
        return stat.S_IMODE(os.stat(directory).st_mode)
    except OSError:
        return None


def restore_mode(directory: str, mode: int | None) -> None:
    """Give ``directory`` its permission bits ``mode`` back if a sample changed them (one
    ``stat`` when it did not): a scratch directory made read-only stops every later sample
    from writing there, and a pod's ``/tmp`` outlives a replaced worker."""
    if mode is not None and scratch_mode(directory) not in (mode, None):
        with contextlib.suppress(OSError):
            os.chmod(directory, mode)


def verify(directory: str, mode: int | None = None) -> str | None:
    """Why ``directory`` is not as a fresh sandbox has it (``None``: it is): permission bits
    other than ``mode`` (when given), an entry left, space still in use on its own
    filesystem (a file deleted but held open by this process), or a descriptor of this
    process still open inside it."""
    if mode is not None and (found := scratch_mode(directory)) != mode:
        shown = "unreadable" if found is None else oct(found)
        return f"the scratch directory's permissions are {shown}, not {oct(mode)}"
    try:
        left = os.listdir(directory)
    except OSError as exc:
        return f"the scratch directory cannot be listed ({exc.strerror})"
    if left:
        return f"{len(left)} entries could not be removed (e.g. {left[0][:60]!r})"
    held = _open_inside(directory)
    if held:
        return f"this process still holds {held} file(s) of the scratch directory open"
    try:
        own = os.stat(directory).st_dev != os.stat(os.path.dirname(directory) or "/").st_dev
        usage = os.statvfs(directory)
    except OSError as exc:
        return f"the scratch directory cannot be checked ({exc.strerror})"
    if own and usage.f_bfree < usage.f_blocks:
        used = (usage.f_blocks - usage.f_bfree) * usage.f_frsize
        return f"{used:,} bytes of the scratch filesystem are still in use"
    return None


def _open_inside(directory: str) -> int:
    prefix = directory.rstrip("/") + "/"
    count = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            count += 1
    return count
