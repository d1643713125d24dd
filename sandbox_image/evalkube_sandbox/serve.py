"""The grader container's first process in a work-unit pod: it starts the runner's workers and
ends everything they leave behind.

Grader code is hostile and runs as the same user as this supervisor, in the same container.
What this design leaves it:

- **No channel of its own to the runner.** The runner (another user) listens on a socket in a
  volume this container mounts read-only and accepts one connection: this one, made when the
  container starts, before any grader code exists. Each worker's channel is one end of a
  socket pair the runner makes and passes over that connection (``SCM_RIGHTS``); no socket
  is ever looked up by path again, so a socket a grader plants is never dialed.
- **No hold on this process.** It is not dumpable: no ptrace, no ``/proc/1/mem``, no
  ``/proc/1/fd`` for its own user. It is the init of the container's PID namespace: a grader
  can kill it (gVisor does not shield a namespace's init from its members), but then the
  kernel ends every process of the namespace with it, the runner's connection closes, and the
  runner, which never reconnects, fails the unit: a grader can fail its own unit, nothing more.
- **Nothing outlives a worker.** When a worker ends (it exits, the runner ends it, or its
  processes hold too much memory), every other process of the container is killed and
  reaped before the runner hears of it and before the next worker starts.
- **A clean scratch directory for every worker.** The grader's ``/tmp`` is the pod's
  ``emptyDir``: a new worker does not get a new one, as a local sandbox would. A worker wipes it
  after each sample that wrote files, but one that was killed (a timeout), crashed or gave up
  (its wipe failed its check) may leave it full. So before each worker starts, with no
  grader process left, this process wipes it and checks it is empty and free
  (:mod:`evalkube_sandbox.hygiene`); when it is not, the worker is not started: the runner
  hears at once that it ended, and why, and fails the unit after its retries.
- **The local sandbox's limits.** Each worker starts with ``RLIMIT_AS`` (per process) and
  ``RLIMIT_NPROC`` (this user's processes), and a watchdog sums the resident memory of every
  grader process every :data:`WATCH_SECONDS`: past the limit they are all killed and the
  runner is told "out of memory", so the sample fails and the runner and the proxy (other
  containers of the same gVisor sandbox, whose memory the pod's cgroup counts together) live.
- **Bounded logs.** A worker's stderr is a pipe this process reads: it keeps the tail for
  the runner and copies at most ``--log-bytes`` of all workers' output to the container's log
  (the node's disk).

Control messages are JSON lines. Runner to supervisor: ``{"op": "spawn", "id": N}`` with the
worker's socket attached, ``{"op": "end", "id": N}``. Supervisor to runner:
``{"t": "hello", "v": 1}``, ``{"t": "started", "id": N}``, ``{"t": "ended", "id": N, "code":
C, "reason": R, "stderr": TAIL}`` (also, right after ``started``, for a worker refused because
the scratch directory could not be emptied).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import sys
import time
from collections import deque

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any

PROTOCOL = 1
#: Seconds between two looks at the grader's memory and processes while a worker runs.
WATCH_SECONDS = 0.02
#: Bytes of a worker's stderr kept for the runner's crash report.
STDERR_TAIL_BYTES = 16_384
POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)
HANGUP = POLLRDHUP | select.POLLHUP | select.POLLERR
PR_SET_DUMPABLE = 4
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
#: The exit code reported for a worker not started: its scratch directory was not clean.
SCRATCH_UNCLEAN_CODE = 75


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError, ImportError):
        return False


def _log(message: str) -> None:
    os.write(2, f"evalkube-sandbox: {message}\n".encode())


def connect(path: str, *, interval: float = 0.1) -> socket.socket:
    """The control connection to the runner's socket, waiting for the runner to listen."""
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            time.sleep(interval)


def _process_tree() -> dict[int, list[int]]:
    """``parent pid -> child pids`` of every process visible in ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return children


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (from ``/proc``'s parent links; for the namespace's init,
    every other process it sees)."""
    if root == 1:
        return [int(name) for name in os.listdir("/proc") if name.isdigit() and name != "1"]
    children = _process_tree()
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def resident_bytes(pids: list[int]) -> int:
    """The resident memory of ``pids`` (``/proc/PID/statm``; shared pages count in each)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as statm:
                total += int(statm.read().split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            continue
    return total


def cgroup_memory_file() -> str | None:
    """The file with this process's memory cgroup usage (the grader container's own cgroup in
    a pod), or ``None``. gVisor charges each page to the cgroup that allocated it, so pages a
    forked child shares with its parent count once (resident sizes count them in each)."""
    try:
        with open("/proc/self/cgroup") as lines:
            entries = [line.strip().split(":", 2) for line in lines]
    except OSError:
        return None
    candidates = []
    for entry in entries:
        if len(entry) != 3:
            continue
        _id, controllers, path = entry
        if "memory" in controllers.split(","):
            candidates += [
                f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes",
                "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            ]
        elif controllers == "":
            candidates += [f"/sys/fs/cgroup{path}/memory.current", "/sys/fs/cgroup/memory.current"]
    for candidate in candidates:
        if _read_int(candidate) is not None:
            return candidate.replace("//", "/")
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def end_everything(me: int) -> dict[int, int]:
    """Kill and reap every process of the container but this one; the wait statuses reaped.

    As the namespace's init, ``kill(-1)`` reaches them all at once; elsewhere (tests, a runtime
    where this is not PID 1) every descendant is killed, round after round, until none is
    left (killed processes' children come back to this subreaper)."""
    reaped: dict[int, int] = {}
    for _ in range(200):
        if me == 1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
        left = descendants(me)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:  # a killed process is gone once reaped: wait for each
            with contextlib.suppress(ChildProcessError):
                reaped[pid] = os.waitpid(pid, 0)[1]
        reaped.update(_reap_all())
        if not left:
            break
    return reaped


def _reap_all() -> dict[int, int]:
    """Collect every exited child (init's job); ``pid -> wait status``."""
    reaped: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = status


class _Worker:
    """One worker: its process, its channel (this process's copy), its stderr pipe."""

    def __init__(self, worker_id: int, pid: int, channel: int, stderr: int) -> None:
        self.id = worker_id
        self.pid = pid
        self.channel = channel
        self.stderr = stderr
        self.tail = b""
        self.status: int | None = None


class Supervisor:
    """Serves the runner's control connection until it closes."""

    def __init__(
        self,
        control: socket.socket,
        *,
        memory_bytes: int,
        processes: int,
        log_bytes: int,
        memory_file: str | None = None,
        scratch: str | None = None,
    ) -> None:
        self.control = control
        #: The grader's scratch directory (the container's ``/tmp``), wiped and checked before
        #: every worker starts; ``None``: none.
        self.scratch = scratch
        #: Its permission bits before any worker ran (restored before each one).
        self.scratch_mode: int | None = None
        if scratch:
            from evalkube_sandbox.hygiene import scratch_mode

            self.scratch_mode = scratch_mode(scratch)
        self.memory_bytes = memory_bytes
        #: Where the grader's memory is read: a cgroup's usage, else resident sizes summed.
        self.memory_file = memory_file
        self.processes = processes
        self.log_left = log_bytes
        self.log_dropped = 0
        self.me = os.getpid()
        self.worker: _Worker | None = None
        self._buffer = b""
        self._fds: deque[int] = deque()

    # -- control channel --------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        self.control.sendall(json.dumps(message).encode() + b"\n")

    def _receive(self) -> list[dict[str, Any]] | None:
        """The complete messages that arrived (their sockets queued); ``None`` at EOF."""
        data, fds, _flags, _addr = socket.recv_fds(self.control, 65_536, 4)
        self._fds.extend(fds)
        if not data:
            return None
        self._buffer += data
        if len(self._buffer) > 1_000_000:
            raise ValueError("the runner sent a control line longer than 1 MB")
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    # -- workers ----------------------------------------------------------------------------
    def _spawn(self, worker_id: int) -> None:
        if not self._fds:
            raise ValueError("a spawn request came without its socket")
        channel = self._fds.popleft()
        self._end_worker("the runner started another worker")
        unclean = self._clear_scratch()
        if unclean is not None:
            self._refuse(worker_id, channel, unclean)
            return
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            self._child(channel, write_end)
        os.close(write_end)
        self.worker = _Worker(worker_id, pid, channel, read_end)
        self._send({"t": "started", "id": worker_id})

    def _clear_scratch(self) -> str | None:
        """Empty the scratch directory for the next worker, with no grader process left; why
        it could not be (``None``: it is empty and free)."""
        if not self.scratch:
            return None
        from evalkube_sandbox.hygiene import restore_mode, verify, wipe

        end_everything(self.me)  # nothing may write there while it is wiped
        restore_mode(self.scratch, self.scratch_mode)
        wipe(self.scratch)
        return verify(self.scratch, self.scratch_mode)

    def _refuse(self, worker_id: int, channel: int, unclean: str) -> None:
        """Tell the runner the worker ended before it started, and why."""
        reason = (
            f"the grader's scratch directory {self.scratch} could not be emptied for a new "
            f"worker ({unclean}); no grader runs here on leftovers of another sample"
        )
        _log(reason)
        with contextlib.suppress(OSError):
            os.close(channel)
        self._send({"t": "started", "id": worker_id})
        self._send(
            {
                "t": "ended",
                "id": worker_id,
                "code": SCRATCH_UNCLEAN_CODE,
                "reason": reason,
                "why": "scratch",
                "stderr": "",
            }
        )

    def _child(self, channel: int, stderr: int) -> None:
        """The worker process: the channel as stdin and stdout, the pipe as stderr, limits."""
        try:
            os.setsid()
            os.dup2(channel, 0)
            os.dup2(channel, 1)
            os.dup2(stderr, 2)
            os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            _prctl(PR_SET_DUMPABLE, 1)  # its own /proc entries readable again (not ours)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if self.memory_bytes > 0:
                resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
            if self.processes > 0:
                resource.setrlimit(resource.RLIMIT_NPROC, (self.processes, self.processes))
            from evalkube_sandbox.worker import main

            code = main()
        except BaseException:
            code = 70
        os._exit(code)

    def _end_worker(self, why: str, reason: str = "") -> None:
        """End the current worker and everything else in the container; tell the runner."""
        worker = self.worker
        if worker is None:
            return
        self.worker = None
        reaped = end_everything(self.me)
        if worker.status is None:
            worker.status = reaped.get(worker.pid)
        self._drain(worker, final=True)
        for fd in (worker.channel, worker.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)
        status = worker.status
        code = None
        if status is not None:
            code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            self._send(
                {
                    "t": "ended",
                    "id": worker.id,
                    "code": code,
                    "reason": reason,
                    "why": why,
                    "stderr": worker.tail.decode("utf-8", "replace"),
                }
            )

    def _drain(self, worker: _Worker, *, final: bool = False) -> None:
        """Read what the worker wrote to stderr: keep the tail, copy into the log while the
        budget lasts."""
        while True:
            try:
                chunk = os.read(worker.stderr, 65_536)
            except BlockingIOError:
                return
            except OSError:
                return
            if not chunk:
                return
            worker.tail = (worker.tail + chunk)[-STDERR_TAIL_BYTES:]
            kept = chunk[: max(0, self.log_left)]
            if kept:
                os.write(2, kept)
                self.log_left -= len(kept)
            dropped = len(chunk) - len(kept)
            if dropped and not self.log_dropped:
                _log("grader output past the log budget is dropped (the runner keeps its tail)")
            self.log_dropped += dropped
            if not final:
                return

    def _watch(self) -> None:
        """The worker's exit, and the memory of every grader process."""
        worker = self.worker
        if worker is None:
            return
        reaped = _reap_all()
        if worker.pid in reaped:
            worker.status = reaped[worker.pid]
            self._end_worker("the worker exited")
            return
        if self.memory_bytes <= 0:
            return
        used = _read_int(self.memory_file) if self.memory_file else None
        if used is None:
            used = resident_bytes(descendants(self.me))
        if used > self.memory_bytes:
            reason = (
                f"out of memory: the grader's processes held {used / 2**20:.0f} MiB, over "
                f"the sandbox's {self.memory_bytes / 2**20:.0f} MiB"
            )
            _log(reason)
            self._end_worker("memory", reason)

    # -- the loop ---------------------------------------------------------------------------
    def serve(self) -> int:
        self._send({"t": "hello", "v": PROTOCOL, "pid": self.me})
        while True:
            poller = select.poll()
            poller.register(self.control.fileno(), select.POLLIN | HANGUP)
            worker = self.worker
            if worker is not None:
                os.set_blocking(worker.stderr, False)
                poller.register(worker.stderr, select.POLLIN)
                poller.register(worker.channel, POLLRDHUP)
            timeout = int(WATCH_SECONDS * 1000) if worker is not None else None
            events = dict(poller.poll(timeout))
            if worker is not None:
                if events.get(worker.stderr):
                    self._drain(worker)
                if events.get(worker.channel, 0) & HANGUP:
                    self._end_worker("the runner hung up")
            if events.get(self.control.fileno()):
                messages = self._receive()
                if messages is None:
                    self._end_worker("the runner closed the control connection")
                    return 0
                for message in messages:
                    op = message.get("op") if isinstance(message, dict) else None
                    if op == "spawn":
                        self._spawn(int(message["id"]))
                    elif op == "end" and self.worker and self.worker.id == message.get("id"):
                        self._end_worker("the runner ended it")
            self._watch()


def _arguments(argv: list[str]) -> dict[str, str]:
    options = dict(zip(argv[0::2], argv[1::2], strict=False))
    if "--connect" not in options:
        raise SystemExit("usage: evalkube_sandbox --connect PATH [--memory-bytes N] ...")
    return options


def main(argv: list[str]) -> int:
    """``--connect PATH [--memory-bytes N] [--memory-from cgroup] [--processes N]
    [--log-bytes N] [--scratch DIR]``; ``--memory-from cgroup``: the container's own memory
    cgroup (a pod's grader container), else the resident sizes of the supervisor's
    descendants. ``--scratch``: the directory wiped before every worker starts (the workers'
    ``scratch_dir``); by default ``/tmp`` when this is the container's first process (PID 1:
    its ``/tmp`` is the grader's own), none otherwise; ``--scratch ""``: none."""
    options = _arguments(argv)
    _prctl(PR_SET_DUMPABLE, 0)
    # orphans come here to be reaped and killed (init is one already, this says so elsewhere)
    from evalkube_sandbox.hygiene import become_subreaper

    become_subreaper()
    import evalkube_sandbox.worker  # noqa: F401 - imported once here, warm in every fork

    memory_file = cgroup_memory_file() if options.get("--memory-from") == "cgroup" else None
    control = connect(options["--connect"])
    where = memory_file or "resident sizes"
    _log(f"connected to the runner at {options['--connect']}; memory read from {where}")
    supervisor = Supervisor(
        control,
        memory_bytes=int(options.get("--memory-bytes", "0")),
        processes=int(options.get("--processes", "0")),
        log_bytes=int(options.get("--log-bytes", str(1 << 20))),
        memory_file=memory_file,
        scratch=options.get("--scratch", "/tmp" if os.getpid() == 1 else "") or None,
    )
    try:
        return supervisor.serve()
    finally:
        end_everything(supervisor.me)
        if supervisor.log_dropped:
            _log(f"{supervisor.log_dropped} bytes of grader output were not logged")


if __name__ == "__main__":  # pragma: no cover - run through evalkube_sandbox.__main__
    sys.exit(main(sys.argv[1:]))
