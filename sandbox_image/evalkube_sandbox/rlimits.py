"""Resource limits the worker puts on itself before any user code runs.

The host sends the values in the load request (they come from ``evalkube.limits``). The
sandbox backends add what a process cannot do to itself (cgroups for memory and pids, a
size-capped /tmp, no network); these rlimits are the part every backend shares, including
the plain-process one.

CPU time is limited per execution: ``RLIMIT_CPU``'s soft limit is re-armed to "CPU used so
far + the budget" whenever the worker flushes answers or announces a long execution, and
``SIGXCPU`` raises :class:`CpuTimeLimitExceeded` inside the user code that overran. The hard
limit stays open so the soft one can be moved; the runner's wall-clock kill is what a grader
that ignores signals meets.
"""

from __future__ import annotations

import math
import resource
import signal
import time
from collections.abc import Callable
from types import FrameType

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any


class CpuTimeLimitExceeded(BaseException):
    """Raised in the grader when one execution used more than its CPU seconds.

    A ``BaseException`` so that ``except Exception`` in user code does not swallow it.
    """


#: ``rlimit name in the load request -> resource constant``. Soft and hard are set alike.
_FIXED = {
    "memory_bytes": resource.RLIMIT_AS,
    "file_bytes": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
    # Per-user process count: only sent where the sandbox has its own user accounting
    # (gVisor's kernel); elsewhere a pids cgroup does this job.
    "processes": resource.RLIMIT_NPROC,
}


def apply_fixed(values: dict[str, Any]) -> dict[str, str]:
    """Lower the fixed rlimits named in ``values``; return the ones that could not be set."""
    failed: dict[str, str] = {}
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, which in _FIXED.items():
        value = values.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            continue
        try:
            _soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as exc:
            failed[name] = str(exc)
    return failed


class CpuBudget:
    """Per-execution CPU seconds on top of the process-wide ``RLIMIT_CPU``."""

    def __init__(self, in_user_code: Callable[[], bool]) -> None:
        self.seconds: float | None = None
        self._in_user_code = in_user_code
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            signal.signal(signal.SIGXCPU, self._on_sigxcpu)
            self._installed = True

    def set(self, seconds: float | None) -> None:
        """Use ``seconds`` per execution from now on (``None``: no CPU limit)."""
        self.seconds = seconds
        self.arm()

    def arm(self, seconds: float | None = None) -> None:
        """Move the soft limit to "used so far + budget" (cheap: two syscalls)."""
        if seconds is None:
            seconds = self.seconds
        if seconds is None:
            return
        soft = math.ceil(time.process_time() + seconds)
        try:
            _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        except (OSError, ValueError):
            pass

    def _on_sigxcpu(self, signum: int, frame: FrameType | None) -> None:
        seconds = self.seconds
        self.arm(1.0)  # keep the signal coming if user code swallows the exception
        if seconds is not None and self._in_user_code():
            raise CpuTimeLimitExceeded(
                f"the grader used more than {seconds:g} CPU seconds in one execution"
            )
