"""Paired comparison of two runs: per task x model x metric, the mean difference over the
samples both runs share, with a paired bootstrap confidence interval, and the samples whose
score changed.

Pairing matters: two runs of one suite grade the same rows, and most of the variance between
their means is which rows are hard, not which run is better. Bootstrapping the per-row
differences keeps that variance out, so a real 2-point drop on 1,000 rows is detected while
the same drop from a handful of flipped rows is not. A score a sample lacks counts 0, as in
the aggregates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

Scores = dict[str, dict[str, float]]
#: ``(task, model, key, status, scores)`` of one sample, as :meth:`ResultStore.iter_keyed_scores`
#: streams them.
KeyedScore = tuple[str, str, str, str, dict[str, float]]


class KeyedScores(Protocol):
    """The store read a comparison needs (:class:`evalkube.store.ResultStore` has it)."""

    def iter_keyed_scores(self, run_id: str) -> Iterable[KeyedScore]: ...


#: Bootstrap resamples (seeded: the same runs always give the same interval).
RESAMPLES = 2_000
#: Cap on the bootstrap's index matrix per chunk (elements), to bound its memory.
CHUNK_ELEMENTS = 4_000_000
#: Flipped sample keys listed per metric (all of them are counted).
FLIPPED_LISTED = 50


@dataclass(slots=True)
class MetricDelta:
    """One metric of one task x model, run against baseline."""

    task: str
    model: str
    metric: str
    shared: int
    """Samples both runs hold (the pairs)."""
    baseline_mean: float
    mean: float
    ci_low: float
    ci_high: float
    """Bootstrap interval of ``mean - baseline_mean`` over the pairs."""
    confidence: float
    improved: int = 0
    regressed: int = 0
    flipped: list[dict[str, object]] = field(default_factory=list)
    """Up to FLIPPED_LISTED samples whose score changed: ``{key, baseline, score}``."""

    @property
    def delta(self) -> float:
        return self.mean - self.baseline_mean

    def significant_drop(self, allowance: float = 0.0) -> bool:
        """The whole interval lies below ``-allowance``: a drop larger than allowed, beyond
        what resampling the rows explains."""
        return self.ci_high < -allowance

    def to_dict(self) -> dict[str, object]:
        return {
            "task": self.task,
            "model": self.model,
            "metric": self.metric,
            "shared": self.shared,
            "baselineMean": self.baseline_mean,
            "mean": self.mean,
            "delta": self.delta,
            "ciLow": self.ci_low,
            "ciHigh": self.ci_high,
            "confidence": self.confidence,
            "improved": self.improved,
            "regressed": self.regressed,
            "flipped": self.flipped,
        }


def bootstrap_interval(
    differences: np.ndarray, confidence: float, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the mean of ``differences`` under resampling with replacement."""
    import numpy as np  # only comparisons pay for it, not every CLI start

    n = len(differences)
    if n == 0:
        return (float("nan"), float("nan"))
    if np.all(differences == differences[0]):
        return (float(differences[0]), float(differences[0]))
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, CHUNK_ELEMENTS // n)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        picks = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = differences[picks].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def _by_unit(rows: Iterable[KeyedScore]) -> Iterator[tuple[tuple[str, str], Scores]]:
    """Group a run's keyed scores by task x model (rows come ordered by task, model)."""
    for unit, group in groupby(rows, key=lambda row: (row[0], row[1])):
        yield unit, {key: scores for _task, _model, key, _status, scores in group}


def compare_runs(
    store: KeyedScores,
    baseline_run: str,
    run: str,
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
) -> list[MetricDelta]:
    """Every metric of every task x model the two runs share, ``run`` against ``baseline_run``."""
    return compare_scores(
        store.iter_keyed_scores(baseline_run),
        store.iter_keyed_scores(run),
        confidence=confidence,
        resamples=resamples,
    )


def compare_scores(
    baseline_rows: Iterable[KeyedScore],
    rows: Iterable[KeyedScore],
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
) -> list[MetricDelta]:
    """:func:`compare_runs` over keyed scores from anywhere (a store, or the operator's API),
    each ordered by task, model."""
    import numpy as np

    baseline = dict(_by_unit(baseline_rows))
    deltas: list[MetricDelta] = []
    for unit, scores in _by_unit(rows):
        before = baseline.get(unit, {})
        keys = [k for k in scores if k in before]
        if not keys:
            continue
        for metric in sorted({m for k in keys for m in (*scores[k], *before[k])}):
            a = np.array([before[k].get(metric, 0.0) for k in keys], dtype=float)
            b = np.array([scores[k].get(metric, 0.0) for k in keys], dtype=float)
            low, high = bootstrap_interval(b - a, confidence, resamples)
            changed = np.nonzero(a != b)[0]
            deltas.append(
                MetricDelta(
                    task=unit[0],
                    model=unit[1],
                    metric=metric,
                    shared=len(keys),
                    baseline_mean=float(a.mean()),
                    mean=float(b.mean()),
                    ci_low=low,
                    ci_high=high,
                    confidence=confidence,
                    improved=int(np.count_nonzero(b > a)),
                    regressed=int(np.count_nonzero(b < a)),
                    flipped=[
                        {"key": keys[i], "baseline": float(a[i]), "score": float(b[i])}
                        for i in changed[:FLIPPED_LISTED]
                    ],
                )
            )
    return deltas
