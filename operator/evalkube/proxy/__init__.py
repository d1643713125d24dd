"""The model bridge: upstream calls with credentials and retries, and the proxy graders call.

- :mod:`~evalkube.proxy.upstream`: providers, credentials, retries (engine and proxy alike);
- :mod:`~evalkube.proxy.service`, :mod:`~evalkube.proxy.routes`, :mod:`~evalkube.proxy.server`:
  the aiohttp proxy (one model call; the grader and control listeners; the process);
- :mod:`~evalkube.proxy.bridge`: :class:`ModelBridge`, the proxy in a thread of the local engine;
- :mod:`~evalkube.proxy.cli`: ``evalkube proxy`` (the pod sidecar).

The server-side modules import aiohttp lazily through their own imports; this package's
top level exports only the upstream client so ``import evalkube.proxy`` stays cheap.
"""

from evalkube.proxy.upstream import (
    Provider,
    ProviderAuth,
    Upstream,
    UpstreamError,
    UpstreamReply,
    response_output_text,
    retry_after_seconds,
    scrub,
    split_model,
)

__all__ = [
    "Provider",
    "ProviderAuth",
    "Upstream",
    "UpstreamError",
    "UpstreamReply",
    "response_output_text",
    "retry_after_seconds",
    "scrub",
    "split_model",
]
