"""Describe a user exception for the host: type, message and the traceback's tail."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: a module costs each fork
if TYPE_CHECKING:
    from typing import Any


MESSAGE_CHARS = 2_000
TRACEBACK_LINES = 12


def describe(exc: BaseException) -> dict[str, Any]:
    """Error payload of an exception raised by user code (kept small)."""
    try:
        message = str(exc)
    except BaseException:  # a hostile __str__
        message = "<unprintable exception>"
    try:
        import traceback  # first failure only: keeps the worker's start short

        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        tail = "".join(lines).splitlines()[-TRACEBACK_LINES:]
    except BaseException:
        tail = []
    return {
        "type": type(exc).__name__,
        "message": message[:MESSAGE_CHARS],
        "traceback": "\n".join(tail),
    }
