"""The zygote of ``isolation: sample``: each sample's process forked ahead of time, from a
process that never held a sample.

The worker forks the zygote when it has loaded the programs, before any sample reaches it.
While one sample runs, the zygote forks the process for the next, so the fork is off the
samples' path; and a sample's process is a copy of a process that never saw a sample: no
other sample's bytes are anywhere in its memory, freed or not (a child of the worker holds
what earlier requests left in the worker's heap:
``tests/security/test_sample_zygote.py::test_no_sample_finds_the_bytes_of_the_samples_before_it_in_its_memory``).
The worker never forks a sample then, so the host may send many samples a request.

Five pipes, made before the fork, connect them; a sample's process keeps only its two:

- ``ask`` (worker -> zygote): one byte per process to fork;
- ``born`` (zygote -> worker): that process's pid;
- two ``request`` pipes (worker -> sample), taken in turn: its one sample, length-prefixed.
  Each process closes the other one before anything else, and the process after next (the
  next one to read this one's pipe) is asked for only once every process of this sample is
  gone, so no process reads another's request; and the next process is forked and warmed up
  while this one runs, its whole start off the samples' path;
- ``answer`` (sample -> worker): its answer, length-prefixed.

Before the next sample is sent, the worker makes sure every process of the last one has
exited (a killed process may run on until the kill lands), wipes the scratch directory, wakes
the zygote and the next process (``SIGCONT``) and drains the answer pipe: nothing the last
sample did reaches the next one. What a running sample can do to the two processes beside it
(same user, same sandbox), each attacked in ``tests/security/test_sample_zygote.py``:

- signals: both block every signal they can; the next process drains what is pending
  before it unblocks, and ``SIGCONT`` undoes a ``SIGSTOP``;
- ptrace, ``/proc/PID/mem``, ``/proc/PID/fd``: neither is dumpable;
- what children inherit and another process can change (``prlimit``, ``setpriority``,
  ``sched_setaffinity``): the zygote compares it with what it started with before every
  fork, and the worker reads it from outside the next process, once no process of a sample
  is left, before it sends that process its sample (the same as the first process had);
- killing either, or changing what they inherit: the worker asks the host for a fresh
  sandbox (its ``replace`` frame) rather than fork a sample from its own memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import select
import signal
from collections.abc import Callable, Mapping

from evalkube_sandbox.ctx import Context
from evalkube_sandbox.hygiene import Hygiene, reap
from evalkube_sandbox.isolation import (
    close_all,
    decode,
    end_group,
    enter,
    has_exited,
    run_captured,
    write_all,
)
from evalkube_sandbox.shared_files import SharedFiles

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any

PR_SET_DUMPABLE = 4
#: ``ioctl`` request: bytes waiting in a pipe (the same on x86_64 and aarch64).
FIONREAD = 0x541B
HEADER_BYTES = 8
#: The inherited limits a process of the same user can change from outside.
_RLIMITS = tuple(
    getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_")
)
_POLL_SECONDS = 0.05
#: The limit the worker moves itself (the CPU budget of each execution).
_MOVED_BY_WORKER = frozenset({resource.RLIMIT_CPU})


class Zygote:
    """The worker's end: ask for the next sample's process, run a sample in it."""

    def __init__(
        self,
        pid: int,
        hygiene: Hygiene,
        ask: int,
        born: int,
        requests: tuple[tuple[int, int], tuple[int, int]],
        answer: tuple[int, int],
    ):
        self.pid = pid
        self._hygiene = hygiene
        self._ask, self._born, self._answer = ask, born, answer[0]
        #: The two request pipes, each ``(read end, write end)``: the read ends, like the
        #: answer pipe's write end, are kept here only to set them back after each sample
        #: (:class:`SharedFiles`, with this process's standard streams, which samples inherit).
        self._requests = requests
        self._shared_fds = (requests[0][0], requests[1][0], answer[1])
        self._shared = SharedFiles((*self._shared_fds, 0, 1, 2))
        self._asked = False
        #: Processes taken from the zygote so far: the n-th reads ``requests[n % 2]``.
        self._taken = 0
        #: The process forked for the next sample, taken from the zygote: its pid, a pidfd
        #: of it, and the request pipe it reads.
        self._next: tuple[int, int | None, tuple[int, int]] | None = None
        #: The worker's own limits and scheduling, as before any sample (a sample may change
        #: them from outside: the worker then handles no other sample).
        self._worker_state: tuple[Any, ...] = ()
        #: What each sample's process inherits (read from the first one, before any sample
        #: ran; a sample may change the next process's from outside while it runs).
        self._inherited: tuple[Any, ...] | None = None
        #: What the last sample left was swept (after it, while the next fork went on).
        self._swept = False
        self.alive = True
        hygiene.newborn = self._newborn

    @classmethod
    def start(
        cls,
        programs: Mapping[str, Callable[..., Any]],
        *,
        hygiene: Hygiene,
        channel_fds: tuple[int, ...],
        capture_chars: int,
    ) -> Zygote | None:
        """Fork the zygote and have it fork the first sample's process; ``None``: no fork."""
        ask, born, answer = os.pipe(), os.pipe(), os.pipe()
        requests = (os.pipe(), os.pipe())
        everything = (*ask, *born, *answer, *requests[0], *requests[1])
        try:
            pid = os.fork()
        except OSError:
            close_all(everything)
            return None
        if pid == 0:  # never returns
            close_all((*channel_fds, ask[1], born[0], answer[0], requests[0][1], requests[1][1]))
            read_ends = (requests[0][0], requests[1][0])
            _zygote(ask[0], born[1], read_ends, answer[1], programs, hygiene, capture_chars)
        close_all((ask[0], born[1]))
        for _, write_end in requests:
            os.set_blocking(write_end, False)
        zygote = cls(pid, hygiene, ask[1], born[0], requests, answer)
        zygote._worker_state = inherited(_MOVED_BY_WORKER)
        hygiene.keep = frozenset({pid})
        zygote.ask()
        return zygote

    def ask(self) -> None:
        """Have the process after the one taken last forked now: only once every process of
        the sample before that one, which read the same request pipe, is gone."""
        if not self.alive or self._asked:
            return
        try:
            os.write(self._ask, b"f")
            self._asked = True
        except OSError:  # the zygote is gone; a sample may be running: its pipes stay open
            self.alive = False
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)

    def run(
        self, program: str, args: list[Any], ctx: list[Any] | None, *, payload_bytes: int
    ) -> dict[str, Any] | None:
        """One sample in the process forked for it; ``None`` when that cannot be: the zygote
        or the process is gone or was changed, or the scratch directory is not clean
        (:attr:`Hygiene.unclean`). The next sample's process is forked while this one runs
        (asked for once the sample before this one was swept), and what this one left is
        swept while the next one starts (:meth:`_sweep`)."""
        taken = self._next if self._next is not None else self._take()
        self._next = None
        if taken is None:
            return None
        pid, pidfd, (request_read_end, request_pipe) = taken
        size: int | None = None
        hygiene = self._hygiene
        try:
            if not self._swept:  # the first sample: what loading the programs left
                hygiene.keep = frozenset({self.pid, pid})
                hygiene.clean()
            self._swept = False
            if hygiene.unclean is not None or inherited(_MOVED_BY_WORKER) != self._worker_state:
                return None
            # no process of a sample is left (swept): what this one inherits stays as read
            state = _inherited_by(pid)
            if self._inherited is None:
                self._inherited = state
            if state is None or state != self._inherited:
                return None  # gone, or changed by the sample before it
            for woken in (self.pid, pid):
                with contextlib.suppress(OSError):
                    os.kill(woken, signal.SIGCONT)
            _drain(self._answer)
            request = json.dumps([program, args, ctx]).encode("utf-8", "surrogatepass")
            if _gone(pid, pidfd):
                return None  # killed before its sample (the zygote reaps it on the next ask)
            # every process of the sample before, the last reader of the next process's
            # request pipe, is gone, and no process of a sample runs: ask for it now
            self.ask()
            if not _send(request_pipe, _framed(request), pid):
                return None  # it died first: what it read of the pipe is unknown
            data, size = _receive(self._answer, pid, payload_bytes)
            if not data and size is None and _unread(request_read_end):
                # it died before it read its sample (a kill the sample before it had the
                # kernel send, landing late): not this sample's doing
                return None
        finally:
            end_group(pid)
            self._ended(pid, pidfd)
            with contextlib.suppress(OSError):  # a zygote the sample stopped forks on
                os.kill(self.pid, signal.SIGCONT)
            self._sweep()
            if self._next is None:
                self._next = self._take()
        return decode(data, size is None, payload_bytes, size)

    def _sweep(self) -> None:
        """Kill what the sample started and wipe its files (:meth:`Hygiene.clean`) while the
        zygote forks the next sample's process: the sweep keeps the zygote and that process,
        and waits for the fork (:meth:`_newborn`) only when /proc shows a process it does
        not know, which may be the one being forked."""
        hygiene = self._hygiene
        hygiene.keep = frozenset({self.pid} if self._next is None else {self.pid, self._next[0]})
        hygiene.clean()
        if hygiene.unclean is None:  # no process of the sample is left to arm them again
            hygiene.unclean = self._shared.restore()
        self._swept = True

    def _newborn(self) -> int | None:
        """The pid of the process being forked for the next sample, once forked; ``None``
        when no fork was asked for (or the zygote is gone)."""
        if self._next is None and self._asked:
            self._next = self._take()
        return None if self._next is None else self._next[0]

    def settle(self) -> str | None:
        """Wait for every process of the samples so far to be gone and wipe their files; why
        this worker must not read another request (``None``: it may). Between batches: a
        sample may have changed the worker's own limits, and a request is decoded here."""
        hygiene = self._hygiene
        if not self._swept:
            self._sweep()
        if hygiene.unclean is not None:
            return hygiene.unclean
        if inherited(_MOVED_BY_WORKER) != self._worker_state:
            return "a sample changed the worker's limits or scheduling from outside"
        return None

    def _ended(self, pid: int, pidfd: int | None) -> None:
        """``pid`` ran the last sample: killed through its pidfd too (it may have left the
        process group :func:`end_group` killed), so the sweep may skip it once it has exited
        (:attr:`Hygiene.ended`); the pidfd of the sample before it is closed."""
        if pidfd is not None:
            with contextlib.suppress(OSError, AttributeError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        hygiene = self._hygiene
        if hygiene.ended is not None:
            with contextlib.suppress(OSError):
                os.close(hygiene.ended[1])
        hygiene.ended = None if pidfd is None else (pid, pidfd)

    def _take(self) -> tuple[int, int | None, tuple[int, int]] | None:
        """The process forked for the next sample, a pidfd of it (``None`` where pidfds
        are not supported) and the request pipe it reads, asking for it if need be."""
        self.ask()
        if not self.alive:
            return None
        self._asked = False
        data = b""
        with contextlib.suppress(OSError):
            data = os.read(self._born, HEADER_BYTES)
        if len(data) != HEADER_BYTES:  # it exited: killed, or changed by a sample
            self.close()
            return None
        pid = int.from_bytes(data, "little", signed=True)
        request_pipe = self._requests[self._taken % 2]
        self._taken += 1
        # the zygote reaps a process of its own only when asked for the next one: until
        # then this pid is this process's, alive or not (opened now, before it runs anything)
        try:
            return pid, os.pidfd_open(pid), request_pipe
        except (AttributeError, OSError):
            return pid, None, request_pipe

    def close(self) -> None:
        if self.alive:
            self.alive = False
            write_ends = tuple(write_end for _, write_end in self._requests)
            close_all((self._ask, self._born, self._answer, *write_ends, *self._shared_fds))
            self._hygiene.keep = frozenset()  # what it forked is swept like any process
            self._hygiene.newborn = None
            if self._next is not None and self._next[1] is not None:
                close_all((self._next[1],))
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


def _unread(read_end: int) -> int:
    """Bytes waiting in a pipe (``FIONREAD`` on a read end)."""
    count = bytearray(4)
    try:
        fcntl.ioctl(read_end, FIONREAD, count)
    except OSError:
        return 0
    return int.from_bytes(count, "little", signed=True)


def _gone(pid: int, pidfd: int | None) -> bool:
    """Whether a process of the zygote's has exited (a pidfd reads ready once it has)."""
    if pidfd is None:
        return has_exited(pid)
    return bool(select.select([pidfd], [], [], 0)[0])


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(HEADER_BYTES, "little") + data


def _drain(fd: int) -> None:
    """Read what is in a pipe no live process writes to (or reads from)."""
    while select.select([fd], [], [], 0)[0] and os.read(fd, 1 << 16):
        pass


def _send(fd: int, data: bytes, pid: int) -> bool:
    """Write ``data`` to a pipe only ``pid`` reads; False when it died first."""
    view = memoryview(data)
    while view:
        _, ready, _ = select.select([], [fd], [], _POLL_SECONDS)
        if ready:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:  # no reader left
                return False
        elif has_exited(pid):
            return False
    return True


def _receive_exactly(fd: int, pid: int, size: int) -> bytes:
    """``size`` bytes from ``pid``'s pipe; fewer when it died first."""
    chunks: list[bytes] = []
    got = 0
    while got < size:
        if select.select([fd], [], [], _POLL_SECONDS)[0]:
            chunk = os.read(fd, min(size - got, 1 << 20))
            chunks.append(chunk)
            got += len(chunk)
        elif has_exited(pid) and not select.select([fd], [], [], 0)[0]:
            break  # gone, and nothing it wrote before it exited is left to read
    return b"".join(chunks)


def _receive(fd: int, pid: int, payload_bytes: int) -> tuple[bytes, int | None]:
    """The sample's answer (empty when its process died without one), or the size it
    announced past the cap."""
    header = _receive_exactly(fd, pid, HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        return b"", None
    size = int.from_bytes(header, "little")
    if size > payload_bytes + 4096:
        return b"", size
    answer = _receive_exactly(fd, pid, size)
    return (answer, None) if len(answer) == size else (b"", None)


def _zygote(
    ask: int,
    born: int,
    requests: tuple[int, int],
    answer: int,
    programs: Mapping[str, Callable[..., Any]],
    hygiene: Hygiene,
    capture_chars: int,
) -> None:
    """Fork a sample's process per byte asked, each reading the request pipes in turn, until
    the worker hangs up or something changed what the processes would inherit."""
    status = 0
    forked = 0
    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        set_dumpable(False)
        with contextlib.suppress(OSError, ValueError):  # its own CPU time is no sample's
            resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY,) * 2)
        started = inherited()
        while os.read(ask, 1):
            reap()  # the processes the worker killed
            if inherited() != started:
                status = 3  # a sample changed it from outside
                break
            request, other = requests if forked % 2 == 0 else requests[::-1]
            pid = os.fork()
            if pid == 0:  # never returns
                close_all((ask, born, other))
                _sample(request, answer, programs, hygiene, capture_chars, mask)
            forked += 1
            os.write(born, pid.to_bytes(HEADER_BYTES, "little", signed=True))
    except BaseException:
        status = 1
    finally:
        os._exit(status)


def _sample(
    request: int,
    answer: int,
    programs: Mapping[str, Callable[..., Any]],
    hygiene: Hygiene,
    capture_chars: int,
    mask: set[int | signal.Signals],
) -> None:
    """A sample's process: waits, signals blocked, for its one sample (what it inherited is
    checked from outside, by the worker, before that is sent); runs the sample; answers."""
    status = 1
    try:
        enter(hygiene)
        _warm_up(capture_chars)
        header = _read_exactly(request, HEADER_BYTES)
        if len(header) < HEADER_BYTES:  # the worker went away first
            status = 0
            return
        body = _read_exactly(request, int.from_bytes(header, "little"))
        program, args, ctx = json.loads(body.decode("utf-8", "surrogatepass"))
        del header, body
        if ctx is not None:
            args = [*args, Context(*ctx)]
        pending = signal.sigpending()
        while pending and signal.sigtimedwait(pending, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        write_all(answer, _framed(run_captured(programs[program], args, capture_chars)))
        status = 0
    finally:
        os._exit(status)


def _warm_up(capture_chars: int) -> None:
    """Take the first-write faults of a fresh fork on the pages a sample's run touches, while
    it waits for its sample (off the sample's path): under gVisor each costs microseconds."""
    json.loads(json.dumps(["program", [[""], {"": 0.0}], None]))
    run_captured(lambda: {"scores": {"": 0.0}}, [], capture_chars)
    signal.sigpending()


def _read_exactly(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0 and (chunk := os.read(fd, min(size, 1 << 20))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def inherited(skip: frozenset[int] = frozenset(), pid: int = 0) -> tuple[Any, ...]:
    """What a forked child inherits and a process of the same user can change from outside:
    rlimits (but ``skip``), nice value, CPU affinity, scheduling policy and priority, I/O
    priority; of process ``pid`` (0: this one)."""
    return (
        [resource.prlimit(pid, which) for which in _RLIMITS if which not in skip],
        os.getpriority(os.PRIO_PROCESS, pid),
        sorted(os.sched_getaffinity(pid)),
        os.sched_getscheduler(pid),
        os.sched_getparam(pid).sched_priority,
        _io_priority(pid),
    )


def _inherited_by(pid: int) -> tuple[Any, ...] | None:
    """:func:`inherited` of another process, read from outside (it need not run, and so
    takes no page faults for it); ``None`` when it is gone."""
    try:
        return inherited(pid=pid)
    except OSError:
        return None


#: ``ioprio_get`` by machine (no Python wrapper; ``None``: not read).
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)


_libc: Any = None


def _io_priority(pid: int = 0) -> int | None:
    global _libc
    if _IOPRIO_GET is None:
        return None
    if _libc is None:
        import ctypes  # already loaded: the worker made itself a subreaper with it

        _libc = ctypes.CDLL(None, use_errno=True)
    return int(_libc.syscall(_IOPRIO_GET, 1, pid))


def set_dumpable(dumpable: bool) -> None:
    """Whether processes of the same user may ptrace this one or open its /proc files
    (``fd``, ``mem``, ...); forked children inherit it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0)
