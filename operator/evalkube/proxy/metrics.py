"""Prometheus metrics of the model bridge proxy, on a registry the caller owns.

Never the global registry: each proxy (and each test) passes its own
``CollectorRegistry``, so two proxies in one process never collide. Labels carry purposes,
provider names and outcomes only: no model request content, no execution ids (unbounded),
no credentials.
"""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

PURPOSES = ("candidate", "judge", "embedding")
#: Call latency buckets (seconds): loopback fakes answer in under a millisecond, real
#: providers in seconds.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

__all__ = ["PURPOSES", "ProxyMetrics"]


class ProxyMetrics:
    """The proxy's counters and histograms (all named ``evalkube_proxy_*``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.calls = Counter(
            "evalkube_proxy_model_calls",
            "Model calls through the proxy by purpose, provider and outcome "
            "(ok, error, budget_exhausted).",
            ["purpose", "provider", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "evalkube_proxy_model_call_duration_seconds",
            "Wall time of forwarded model calls (upstream time including retries).",
            ["purpose"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "evalkube_proxy_tokens",
            "Tokens reported by providers, by purpose and kind (input, output, total, prompt).",
            ["purpose", "kind"],
            registry=registry,
        )
        self.retries = Counter(
            "evalkube_proxy_upstream_retries",
            "Upstream retries by provider and reason (HTTP status, timeout, unreachable).",
            ["provider", "reason"],
            registry=registry,
        )
        self.budget_rejections = Counter(
            "evalkube_proxy_budget_rejections",
            "Calls refused because a budget was exhausted, by scope (execution, unit).",
            ["scope"],
            registry=registry,
        )
        # Children of the per-call metrics, looked up once: ``labels()`` takes a lock and
        # checks its values on every call.
        self._calls = functools.cache(self.calls.labels)
        self._latency = functools.cache(self.latency.labels)
        self._tokens = functools.cache(self.tokens.labels)
        for purpose in PURPOSES:
            self._latency(purpose)

    def call(self, purpose: str, provider: str, outcome: str, seconds: float | None) -> None:
        self._calls(purpose, provider, outcome).inc()
        if seconds is not None:
            self._latency(purpose).observe(seconds)

    def add_tokens(self, purpose: str, tokens: dict[str, int]) -> None:
        for name, value in tokens.items():
            self._tokens(purpose, name.removesuffix("_tokens")).inc(value)

    def retry(self, provider: str, reason: str) -> None:
        self.retries.labels(provider, reason).inc()

    def rejected(self, scope: str) -> None:
        self.budget_rejections.labels(scope).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
