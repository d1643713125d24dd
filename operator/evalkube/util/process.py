"""Process helpers shared by layers that must not import one another.

The sandbox backends arm a parent-death signal in each forked worker, the parallel engine in
each child process, and the proxy launcher in the native proxy: one helper at the bottom of
the package (below ``sandbox`` and ``proxy``) so neither imports the other for it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

__all__ = ["signal_on_parent_death"]

_PR_SET_PDEATHSIG = 1
try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def signal_on_parent_death(signum: int, parent: int) -> bool:
    """Have the kernel send ``signum`` to this process when ``parent`` dies; False when
    ``parent`` is already gone (or the platform cannot do it and it is gone)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    return os.getppid() == parent
