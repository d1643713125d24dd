"""What the host learned about one execution, normalized from the worker's untrusted answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from evalkube import limits

Status = Literal[
    "returned",  # the function returned ``value``
    "raised",  # the function raised; ``error`` describes it
    "unserializable",  # the return value could not be sent as JSON
    "oversized",  # the return value exceeded the payload limit
    "timeout",  # the runner killed the sandbox at the deadline
    "crashed",  # the worker process died during this execution
    "protocol_error",  # the worker sent something that is not a valid answer
]


@dataclass(slots=True)
class Execution:
    """One execution's outcome as the runner sees it."""

    index: int
    status: Status
    value: Any = None
    error: dict[str, Any] | None = None
    stdout: str | None = None
    stderr: str | None = None
    ms: float | None = None

    @property
    def returned(self) -> bool:
        return self.status == "returned"


def _text(value: Any, cap: int) -> str | None:
    """A capped string from the worker; anything but a string is no text (no ``str()`` of
    arbitrary, possibly huge or deeply nested, values)."""
    return value[:cap] if isinstance(value, str) else None


def _error(payload: Any, default_type: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        payload = {}
    return {
        "type": _text(payload.get("type"), 200) or default_type,
        "message": _text(payload.get("message"), limits.ERROR_MESSAGE_CHARS) or "",
        "traceback": _text(payload.get("traceback"), 20_000) or "",
    }


#: Longest execution the worker may report (ms, a day); anything else is not a duration.
MS_MAX = 86_400_000.0


def _ms(value: Any) -> float | None:
    """A reported duration when it is a plausible one (NaN, infinities, huge ints: no)."""
    if type(value) in (int, float) and 0 <= value <= MS_MAX:
        return float(value)
    return None


def from_answer(index: int, answer: Any) -> Execution:
    """Normalize one worker answer (a dict) into an :class:`Execution`; never raises.

    Everything in ``answer`` is untrusted (a grader can patch the worker that encodes it):
    whatever it holds, the result is one :class:`Execution` of a known status, and anything
    that cannot be understood makes that one execution a ``protocol_error``.
    """
    if type(answer) is dict and answer.get("ok") is True and len(answer) == 3:
        # The common case, kept cheap: {"ok": true, "value": ..., "ms": float}.
        ms = answer.get("ms")
        if "value" in answer and type(ms) is float and 0.0 <= ms <= MS_MAX:
            return Execution(index, "returned", answer["value"], ms=ms)
    try:
        return _from_answer(index, answer)
    except Exception as exc:  # total: an answer the rules below did not foresee
        return Execution(
            index,
            "protocol_error",
            error=host_error("ProtocolError", f"undecodable answer ({type(exc).__name__})"),
        )


def _from_answer(index: int, answer: Any) -> Execution:
    if not isinstance(answer, dict):
        return Execution(
            index, "protocol_error", error=host_error("ProtocolError", "answer is not an object")
        )
    cap = limits.CAPTURED_OUTPUT_CHARS + 100
    execution = Execution(
        index,
        "returned",
        stdout=_text(answer.get("stdout"), cap),
        stderr=_text(answer.get("stderr"), cap),
        ms=_ms(answer.get("ms")),
    )
    if answer.get("ok") is True and "value" in answer:
        execution.value = answer["value"]
    elif answer.get("ok") is False:
        execution.status = "raised"
        execution.error = _error(answer.get("error"), "Exception")
    elif isinstance(answer.get("unserializable"), dict):
        info = answer["unserializable"]
        execution.status = "unserializable"
        execution.value = _text(info.get("repr"), limits.INVALID_PAYLOAD_REPR_CHARS)
        execution.error = host_error(
            "UnserializableResult",
            f"the grader returned a {_text(info.get('type'), 100)} that is not JSON-serializable: "
            f"{_text(info.get('reason'), 300)}",
        )
    elif isinstance(answer.get("oversized"), dict):
        info = answer["oversized"]
        execution.status = "oversized"
        execution.value = _text(info.get("repr"), limits.INVALID_PAYLOAD_REPR_CHARS)
        size = info.get("bytes")
        shown = size if type(size) is int and 0 < size < 2**53 else "too many"
        execution.error = host_error(
            "ResultTooLarge",
            f"the grader's result is {shown} bytes; the limit is "
            f"{limits.RESULT_PAYLOAD_BYTES} bytes (keep `judge` small)",
        )
    else:
        execution.status = "protocol_error"
        execution.error = host_error("ProtocolError", "answer has neither a value nor an error")
    return execution


def host_error(kind: str, message: str) -> dict[str, Any]:
    """An error the host itself attributes to an execution."""
    return {"type": kind, "message": message, "traceback": ""}
