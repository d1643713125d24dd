"""Per-execution audit of model calls: counts, response ids, token usage, latencies.

The proxy records every call it forwards under the caller's execution id; the runner takes
(and so removes) the records of the executions it is about to store, so each sample carries
its own model calls and response ids. Not thread-safe by itself: the proxy touches it from
its event loop only (the in-process bridge hops onto that loop to take usage).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: Token usage fields summed per execution (Responses and Embeddings APIs).
TOKEN_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "prompt_tokens")


@dataclass
class ExecutionUsage:
    """What one grader execution did through the proxy."""

    calls: int = 0
    errors: int = 0
    response_ids: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    latency_ms: list[float] = field(default_factory=list)
    by_purpose: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    """Requests sent again for these calls that may have reached the provider (after a
    429, a 5xx, a timeout or a dropped connection): each may be billed, so each is counted;
    ``calls + retries`` is what the provider received, when every call reached it."""


def token_usage(answer: Mapping[str, Any]) -> dict[str, int]:
    """The integer token counts of an API answer's ``usage`` object."""
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {
        name: value
        for name in TOKEN_FIELDS
        if isinstance(value := usage.get(name), int) and not isinstance(value, bool)
    }


class UsageLedger:
    """Usage by execution id, until the runner takes it."""

    def __init__(self) -> None:
        self._executions: defaultdict[str, ExecutionUsage] = defaultdict(ExecutionUsage)

    def record(
        self,
        execution_id: str,
        purpose: str,
        *,
        latency_ms: float,
        response_id: str | None = None,
        tokens: Mapping[str, int] | None = None,
        ok: bool = True,
        requests: int = 1,
    ) -> None:
        """One call; ``requests``: its attempts that may have reached the provider."""
        entry = self._executions[execution_id]
        entry.calls += 1
        entry.retries += max(requests - 1, 0)
        if not ok:
            entry.errors += 1
        entry.by_purpose[purpose] = entry.by_purpose.get(purpose, 0) + 1
        entry.latency_ms.append(round(latency_ms, 3))
        if response_id:
            entry.response_ids.append(response_id)
        for name, value in (tokens or {}).items():
            entry.usage[name] = entry.usage.get(name, 0) + value

    def take(self, execution_ids: Iterable[str] | None) -> dict[str, dict[str, Any]]:
        """Remove and return the usage of ``execution_ids`` (ids without calls are absent;
        ``None``: of every execution)."""
        taken: dict[str, dict[str, Any]] = {}
        for execution_id in list(self._executions) if execution_ids is None else execution_ids:
            entry = self._executions.pop(execution_id, None)
            if entry is not None:
                taken[execution_id] = asdict(entry)
        return taken

    def __len__(self) -> int:
        return len(self._executions)
