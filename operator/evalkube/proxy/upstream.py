"""OpenAI-compatible upstream calls: provider resolution, credentials, retries, clear errors.

Used by the engine for candidate generation and by the model bridge proxy for the graders'
``ctx`` calls, so both behave the same: one pooled ``httpx.AsyncClient``; credentials
injected by an ``httpx.Auth`` (never logged, never echoed); 429/5xx/timeouts retried with
exponential backoff honouring ``Retry-After``; a 401/403 becomes "credentials rejected by
provider NAME" without the key.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


class UpstreamError(RuntimeError):
    """A model call failed; the message is safe to show (it never contains credentials)."""

    def __init__(self, message: str, *, status: int | None = None, provider: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.provider = provider


@dataclass
class Provider:
    """An OpenAI-compatible endpoint and where its API key comes from."""

    name: str
    base_url: str
    api_key_env: str | None = None
    api_key_file: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    _cached_key: tuple[float, str | None] | None = field(default=None, repr=False)

    def api_key(self) -> str | None:
        """The current key: re-read from the file when it changes (mounted Secret rotation)."""
        if self.api_key_file:
            path = Path(self.api_key_file)
            try:
                mtime = path.stat().st_mtime
            except OSError:
                return None
            if self._cached_key is None or self._cached_key[0] != mtime:
                self._cached_key = (mtime, path.read_text().strip() or None)
            return self._cached_key[1]
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        return None


class _ProviderAuth(httpx.Auth):
    """Sets the provider's bearer token on each request, replacing anything a client sent."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.pop("Authorization", None)
        key = self.provider.api_key()
        if key:
            request.headers["Authorization"] = f"Bearer {key}"
        yield request


def split_model(model: str) -> tuple[str, str]:
    """``openai:gpt-4.1-mini`` -> ``("openai", "gpt-4.1-mini")``."""
    provider, sep, name = model.partition(":")
    if not sep or not name:
        raise UpstreamError(f"model {model!r} is not `provider:model`")
    return provider, name


def retry_after_seconds(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Parse ``Retry-After`` (seconds or an HTTP date) into seconds to wait."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


class Upstream:
    """Calls providers' Responses and Embeddings APIs with retries and safe errors."""

    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        max_connections: int = 128,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.providers = dict(providers)
        self.retries = retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
            follow_redirects=False,
        )
        self._auth = {name: _ProviderAuth(p) for name, p in self.providers.items()}

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def provider(self, name: str) -> Provider:
        try:
            return self.providers[name]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            raise UpstreamError(f"provider {name!r} is not configured (configured: {known})") from None

    async def call(self, provider_name: str, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``provider``'s ``path``; retry transient failures; return JSON."""
        provider = self.provider(provider_name)
        url = provider.base_url.rstrip("/") + path
        attempt = 0
        while True:
            wait: float | None = None
            try:
                response = await self._client.post(
                    url,
                    json=body,
                    headers=provider.headers,
                    auth=self._auth[provider_name],
                    timeout=provider.timeout,
                )
            except httpx.TimeoutException:
                failure = UpstreamError(
                    f"provider {provider_name} timed out after {provider.timeout:g} s", provider=provider_name
                )
            except httpx.TransportError as exc:
                failure = UpstreamError(
                    f"provider {provider_name} is unreachable: {type(exc).__name__}", provider=provider_name
                )
            else:
                if response.status_code < 400:
                    try:
                        data = response.json()
                    except ValueError:
                        raise UpstreamError(
                            f"provider {provider_name} answered with invalid JSON", status=response.status_code,
                            provider=provider_name,
                        ) from None
                    if not isinstance(data, dict):
                        raise UpstreamError(f"provider {provider_name} answered with a non-object", provider=provider_name)
                    return data
                status = response.status_code
                if status in (401, 403):
                    raise UpstreamError(
                        f"credentials rejected by provider {provider_name} (HTTP {status})",
                        status=status,
                        provider=provider_name,
                    )
                message = _error_message(response)
                failure = UpstreamError(
                    f"provider {provider_name} answered HTTP {status}: {message}", status=status, provider=provider_name
                )
                if status != 429 and status < 500:
                    raise failure
                wait = retry_after_seconds(response.headers.get("Retry-After"))
            if attempt >= self.retries:
                raise failure
            if wait is None:
                wait = min(self.backoff_max, self.backoff_base * (2**attempt)) * (0.5 + random.random() / 2)
            await asyncio.sleep(min(wait, self.backoff_max))
            attempt += 1


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.reason_phrase or "error"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:500]
        if isinstance(error, str):
            return error[:500]
    return response.reason_phrase or "error"


def response_output_text(response: Mapping[str, Any]) -> str:
    """Join the ``output_text`` parts of a Responses API object (as the SDKs' property does)."""
    if isinstance(response.get("output_text"), str):
        return str(response["output_text"])
    parts: list[str] = []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for content in item.get("content") or []:
                if isinstance(content, dict) and content.get("type") == "output_text":
                    parts.append(str(content.get("text", "")))
    return "".join(parts)
