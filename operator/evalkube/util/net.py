"""Parsing shared by the operator's APIs and the model bridge: listen addresses, bearer
tokens and URL ports, each in one place (yarl does the URL work) so both sides agree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yarl import URL

__all__ = ["bearer_token", "parse_listen", "release", "url_port"]


def parse_listen(value: str, default_host: str = "127.0.0.1") -> tuple[str, int] | str:
    """``unix:/path`` -> the path; ``host:port``, ``[v6]:port`` or ``http://host:port`` ->
    ``(host, port)``, ``default_host`` when the host is empty (``:8080``)."""
    if value.startswith("unix:"):
        path = value[len("unix:") :]
        if not path:
            raise ValueError(
                "unix: listen address needs a path, e.g. unix:/run/evalkube/model.sock"
            )
        return path
    try:
        url = URL(value if "://" in value else f"tcp://{value}")
        port = url.explicit_port
    except ValueError:
        port = None
    if port is None:
        raise ValueError(
            f"listen address {value!r} is neither unix:/path nor host:port "
            "(e.g. 127.0.0.1:8080, [::1]:8080)"
        )
    return url.host or default_host, port


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    return token or None if scheme == "Bearer" else None


def url_port(url: str) -> int:
    """The TCP port an http(s) URL reaches: the explicit one, else 80 for http and 443 for
    anything else (a provider URL is validated elsewhere; a NetworkPolicy needs a port)."""
    try:
        return URL(url).port or 443
    except ValueError:
        return 443


def release(response: Any) -> None:
    """Let an :class:`httpx.Response` whose body was read be freed when its last reference
    goes, instead of at the next full garbage collection.

    httpx (0.28, 0.29) wraps every body in a stream that refers back to its response
    (``response.stream -> BoundSyncStream -> response``, encode/httpx#3733), so a response
    and its request, with the request's whole body, are cyclic garbage. A runner posting
    16 MB sample chunks under relaxed GC thresholds kept 400 MB of them after 20 posts
    (measured); an export kept every page. The body is read, so the stream is spent:
    replacing it breaks the cycle."""
    import httpx

    if response.is_stream_consumed:
        response.stream = httpx.ByteStream(b"")
