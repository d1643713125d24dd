"""What the isolating backends show of the host: a read-only system and the worker package.

gVisor, nsjail and bwrap all build the same root: an empty, read-only directory holding
read-only binds of the system's ``/usr`` (plus ``/bin``, ``/lib``, ``/lib64`` as the host has
them: symlinks into ``/usr`` on merged-/usr systems, binds otherwise) and
``/etc/alternatives``, the worker package at :data:`INSIDE_WORKER_ROOT`, a fresh ``/proc``,
a minimal ``/dev`` and a size-capped tmpfs ``/tmp``. No ``/etc`` (no passwd, no shadow, no
resolv.conf), no ``/home``, ``/root``, ``/var`` or ``/work``, no host ``/tmp``.

The model bridge, when a program has model access, is the only host object added: the
proxy's unix socket itself (not its directory), bound at :data:`INSIDE_BRIDGE_SOCKET`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from evalkube.sandbox.backends import WORKER_ROOT, SandboxUnavailable, resource_name, worker_argv
from evalkube.sandbox.environment import INSIDE_ENVIRONMENT

#: The interpreter inside isolating sandboxes (the host's system Python, bound from /usr).
INSIDE_PYTHON = "/usr/bin/python3"
#: Where the worker package appears inside (``sys.path`` entry).
INSIDE_WORKER_ROOT = "/opt/evalkube"
#: Where the model bridge's unix socket appears inside.
INSIDE_BRIDGE_SOCKET = "/run/evalkube/model.sock"
#: The sandbox user (``nobody``): no host file is theirs.
SANDBOX_UID = 65534
SANDBOX_GID = 65534
#: Read-only system directories bound into the sandbox, when they exist on the host.
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/etc/alternatives")


@dataclass(frozen=True, slots=True)
class SystemEntry:
    """One top-level system path: a symlink (``target`` set) or a read-only bind."""

    path: str
    target: str | None = None


def system_entries() -> list[SystemEntry]:
    """The system paths to show inside, as the host has them."""
    entries: list[SystemEntry] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            entries.append(SystemEntry(path, os.readlink(path)))
        elif os.path.isdir(path):
            entries.append(SystemEntry(path))
    return entries


def python_problem() -> str | None:
    """Why the system Python cannot run the worker, or ``None``."""
    if not os.access(INSIDE_PYTHON, os.X_OK):
        return f"{INSIDE_PYTHON} is missing (install Debian's python3: apt-get install python3)"
    return None


def inside_worker_argv(environment: bool) -> list[str]:
    """The worker command inside an isolating sandbox, which mounts the grader environment
    (when there is one) at :data:`~evalkube.sandbox.environment.INSIDE_ENVIRONMENT`."""
    return worker_argv(
        INSIDE_PYTHON, INSIDE_WORKER_ROOT, INSIDE_ENVIRONMENT if environment else None
    )


def _world_readable(path: Path) -> bool:
    """True when the sandbox user can reach ``path`` and read every ``.py`` file in it."""
    try:
        return sandbox_user_can_reach(path) and all(
            p.stat().st_mode & stat.S_IROTH for p in path.rglob("*.py")
        )
    except OSError:
        return False


def sandbox_user_can_reach(path: Path) -> bool:
    """True when every directory down to ``path`` lets "other" (uid 65534) search it."""
    try:
        return all(part.stat().st_mode & stat.S_IXOTH for part in [*reversed(path.parents), path])
    except OSError:
        return False


@cache
def worker_package_dir() -> Path:
    """A host directory holding ``evalkube_sandbox`` that the sandbox user can read.

    The installed package when the sandbox user can read it where it is; otherwise a copy
    staged once per process (removed at exit) — e.g. when the project lives under /root.
    """
    source = WORKER_ROOT / "evalkube_sandbox"
    if _world_readable(source):
        return source
    staged = Path(tempfile.mkdtemp(prefix=resource_name("pkg") + "-"))
    atexit.register(shutil.rmtree, staged, True)
    target = staged / "evalkube_sandbox"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [staged, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    target.chmod(0o755)
    return target


def bridge_mount(endpoint: str | None) -> tuple[Path | None, str | None]:
    """``(host socket to bind, endpoint inside)`` for the model bridge at ``endpoint``.

    Isolating sandboxes have no network, so only a unix-socket bridge can be reached. The
    socket must be connectable by the sandbox user (mode 0o666 and a directory the user may
    traverse); :class:`SandboxUnavailable` says what to change when it is not.
    """
    if endpoint is None:
        return None, None
    if not endpoint.startswith("unix:"):
        raise SandboxUnavailable(
            f"the model bridge at {endpoint!r} is a network address, and isolating sandboxes "
            "have no network: serve the bridge on a unix socket (unix:/path) for model access"
        )
    socket_path = Path(endpoint[len("unix:") :])
    try:
        mode = socket_path.stat().st_mode
        dir_mode = socket_path.parent.stat().st_mode
    except OSError as exc:
        raise SandboxUnavailable(
            f"the model bridge socket {socket_path} is not there: {exc}"
        ) from None
    if not stat.S_ISSOCK(mode):
        raise SandboxUnavailable(f"the model bridge {socket_path} is not a unix socket")
    if mode & 0o002 == 0 or dir_mode & 0o001 == 0:
        # The sandbox user is not the proxy's user: let it connect (and traverse the socket's
        # directory without listing it). The socket only leads to the budgeted bridge.
        try:
            os.chmod(socket_path, stat.S_IMODE(mode) | 0o666)
            os.chmod(socket_path.parent, stat.S_IMODE(dir_mode) | 0o001)
        except OSError as exc:
            raise SandboxUnavailable(
                f"the sandbox user (uid {SANDBOX_UID}) cannot connect to the model bridge "
                f"{socket_path} ({exc}): make the socket mode 0o666 and its directory 0o711"
            ) from None
    return socket_path, f"unix:{INSIDE_BRIDGE_SOCKET}"
