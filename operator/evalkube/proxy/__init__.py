"""The model bridge: upstream calls with credentials and retries (and, later, the proxy)."""

from evalkube.proxy.upstream import (
    Provider,
    Upstream,
    UpstreamError,
    response_output_text,
    retry_after_seconds,
    split_model,
)

__all__ = [
    "Provider",
    "Upstream",
    "UpstreamError",
    "response_output_text",
    "retry_after_seconds",
    "split_model",
]
