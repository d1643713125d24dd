"""Open file descriptions a sample's process shares with the worker, set back after it.

A file inherited through ``fork`` is one open file description in every process that holds
it: its status flags (``O_NONBLOCK``, ``O_ASYNC``, ``O_DIRECT``), its owner and signal
(``F_SETOWN``, ``F_SETSIG``) and, for a pipe, the pipe's size outlive the process that set
them. A sample could arm them against the samples after it: have the kernel SIGKILL the next
sample's process when the worker reads the answer pipe, or make every later answer's write
fail (found by an attacker review: ``tests/security/test_sample_zygote.py``). The worker
keeps each such description open (the sample zygote's pipes, its own standard streams) and,
once every process of a sample is gone, sets each back as it was before any sample ran.
"""

from __future__ import annotations

import fcntl

F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def _pipe_size(fd: int) -> int | None:
    try:
        return int(fcntl.fcntl(fd, F_GETPIPE_SZ))
    except OSError:  # not a pipe
        return None


class SharedFiles:
    """The state of some open file descriptions, read now, to set back with :meth:`restore`."""

    def __init__(self, fds: tuple[int, ...]) -> None:
        self._saved: list[tuple[int, int, int | None]] = []
        for fd in fds:
            try:
                self._saved.append((fd, fcntl.fcntl(fd, fcntl.F_GETFL), _pipe_size(fd)))
            except OSError:  # not open
                continue

    def restore(self) -> str | None:
        """Set each back (status flags, no owner, no signal, the pipe's size); why that
        failed, or ``None``."""
        for fd, flags, size in self._saved:
            try:
                fcntl.fcntl(fd, fcntl.F_SETOWN, 0)
                fcntl.fcntl(fd, F_SETSIG, 0)
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
                if size is not None and _pipe_size(fd) != size:
                    fcntl.fcntl(fd, F_SETPIPE_SZ, size)
            except OSError as exc:
                return f"a file the samples share (fd {fd}) could not be set back: {exc}"
        return None
