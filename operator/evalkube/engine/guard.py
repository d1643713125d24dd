"""Stop a run that only produces failures, before it spends the whole dataset on them.

A missing API key, a provider without the endpoint or a grader that raises on every sample
would otherwise run to the end, make every paid call and "succeed" with 100% errors. The
guard counts, per task x model, model calls that failed (as their answers arrive) and
finished samples that are errored or invalid; once ``min_samples`` of either have ended and
the failed share reached ``max_rate``, :class:`RunAborted` stops the run, which ends
``Failed`` with the reason (resume it once the cause is fixed). Only runs that pay for model
calls are guarded: one over precomputed outputs costs nothing and shows every failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalkube import limits


class RunAborted(RuntimeError):
    """Too many failures in one task x model; the message says which, how many and why."""


@dataclass
class _Meter:
    ended: int = 0
    failed: int = 0
    last_error: str = ""


@dataclass
class ErrorGuard:
    """Failure rates of a run, per task x model, of model calls and of samples."""

    max_rate: float = limits.MAX_ERROR_RATE_DEFAULT
    min_samples: int = limits.ERROR_RATE_MIN_SAMPLES
    _meters: dict[tuple[str, str, str], _Meter] = field(default_factory=dict)

    def count(self, what: str, task_id: str, model: str, error: str | None) -> None:
        """One call or sample ended (``error``: why it failed); raise past the limit."""
        meter = self._meters.setdefault((what, task_id, model), _Meter())
        meter.ended += 1
        if error is None:
            return
        meter.failed += 1
        meter.last_error = error
        if meter.ended >= self.min_samples and meter.failed >= self.max_rate * meter.ended:
            raise RunAborted(
                f"task {task_id!r} · {model}: {meter.failed} of the first {meter.ended} "
                f"{what} failed (--max-error-rate {self.max_rate:g}); last error: "
                f"{meter.last_error[:500]}"
            )
