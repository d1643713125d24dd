"""OpenAI-compatible upstream calls: provider resolution, credentials, retries, clear errors.

Used by the engine for candidate generation and by the model bridge proxy for the graders'
``ctx`` calls, so both behave the same: one pooled ``aiohttp.ClientSession`` per
:class:`Upstream`; credentials injected per request by :class:`ProviderAuth` (never logged,
never echoed: any text a provider sends back is scrubbed of the key); 429/5xx/timeouts/
connection failures retried with exponential backoff honouring ``Retry-After``; a 401/403
becomes "credentials rejected by provider NAME" without the key.

Why aiohttp and not httpx here: the proxy's hot path is one upstream call per grader call.
Measured on this project's 2-core machines (``docs/proxy.md``), httpx's client costs about
160 µs of CPU per request before any I/O and its default pool collapsed to ~270 calls/s at
64 concurrent requests, while aiohttp's C-accelerated client kept the proxy within budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from evalkube import limits
from evalkube.proxy.chat import CHAT_PATH, ChatTranslationError, chat_request, responses_answer
from evalkube.proxy.egress import SENT_HEADER, EgressGateway, EgressUnavailable, refusal
from evalkube.util.net import bearer_token

#: Shapes of API keys scrubbed from any provider text even when they are not the
#: configured key (a provider echoing some other credential it saw).
_KEY_PATTERNS = re.compile(r"(?:sk|pk|rk|key)-[A-Za-z0-9_\-]{8,}|Bearer\s+[A-Za-z0-9._\-~+/]{8,}=*")
REDACTED = "[redacted]"
#: ``Provider.api`` values: the API a provider serves for ``/responses`` requests.
RESPONSES_API = "responses"
CHAT_COMPLETIONS_API = "chat_completions"
RESPONSES_PATH = "/responses"
#: Connections one :class:`Upstream` keeps open at most (all of them may go to one host).
MAX_CONNECTIONS = 128
#: On a control listener's model answer: the call's requests that may have reached the
#: provider (the runner counts the extra ones as the candidate call's ``retries``).
REQUESTS_HEADER = "X-Evalkube-Upstream-Requests"
#: On the runner's model call to a control listener: its name for the call, the same when it
#: sends the call again after the proxy sidecar was restarted; the native proxy then adds the
#: requests its killed process had sent for it (paid, never answered) to ``REQUESTS_HEADER``.
CALL_KEY_HEADER = "X-Evalkube-Call"


class UpstreamError(RuntimeError):
    """A model call failed; the message is safe to show (it never contains credentials).

    ``status`` is the provider's HTTP status when it answered; ``kind`` says what failed:
    ``credentials``, ``http``, ``timeout``, ``unreachable``, ``invalid_response``,
    ``configuration`` or ``no_credentials``; ``retry_after`` is the seconds the provider asked
    to wait before trying again (its ``Retry-After``), if it did. ``requests``: how many of
    the call's attempts may have reached the provider (:class:`UpstreamReply`).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        provider: str | None = None,
        kind: str = "http",
        retry_after: float | None = None,
        reached: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.provider = provider
        self.kind = kind
        self.retry_after = retry_after
        #: This attempt may have reached the provider (it answered, or the connection broke
        #: or timed out after it was made), so it may be billed.
        self.reached = reached
        self.requests = 1 if reached else 0


@dataclass
class Provider:
    """An OpenAI-compatible endpoint and where its API key comes from.

    ``api_key_file`` (a mounted Secret) wins over ``api_key_env``; the file is re-read when
    its modification time changes, so a rotated Secret is used by the next call. ``api`` is
    ``chat_completions`` for servers without ``/responses``: Responses requests to it are
    translated (:mod:`evalkube.proxy.chat`).
    """

    name: str
    base_url: str
    api_key_env: str | None = None
    api_key_file: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    api: str = RESPONSES_API
    _cached_key: tuple[tuple[int, int, int], str | None] | None = field(default=None, repr=False)

    def key_source(self) -> str | None:
        """Where the key comes from, for error messages (never the key itself)."""
        sources = []
        if self.api_key_file:
            sources.append(f"key file {self.api_key_file}")
        if self.api_key_env:
            sources.append(f"environment variable {self.api_key_env}")
        return " or ".join(sources) or None

    def api_key(self) -> str | None:
        """The current key: the key file when it exists (re-read when it changes: a rotated
        mounted Secret is used by the next call), else the environment variable."""
        if self.api_key_file:
            path = Path(self.api_key_file)
            try:
                stat = path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                if self._cached_key is None or self._cached_key[0] != stamp:
                    self._cached_key = (stamp, path.read_text().strip() or None)
                if self._cached_key[1]:
                    return self._cached_key[1]
            except OSError:
                self._cached_key = None
        return (os.environ.get(self.api_key_env) or None) if self.api_key_env else None


class ProviderAuth:
    """Builds the headers of one upstream request: the provider's extra headers plus its bearer
    token. Client headers never reach the upstream (the proxy builds every request anew), so a
    grader's ``Authorization`` cannot replace or leak next to the provider's."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self._base = {
            name: value
            for name, value in provider.headers.items()
            if name.lower() not in ("authorization", "content-type", "content-length", "host")
        }
        self._base["Content-Type"] = "application/json"

    def headers(self) -> dict[str, str]:
        headers = dict(self._base)
        key = self.provider.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        elif self.provider.key_source() is not None:
            raise UpstreamError(
                f"no API key for provider {self.provider.name}: "
                f"{self.provider.key_source()} is missing or empty",
                provider=self.provider.name,
                kind="no_credentials",
            )
        return headers


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` without any of ``secrets`` nor anything shaped like an API key."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _KEY_PATTERNS.sub(REDACTED, text)


def split_model(model: str) -> tuple[str, str]:
    """``openai:gpt-4.1-mini`` -> ``("openai", "gpt-4.1-mini")``."""
    provider, sep, name = model.partition(":")
    if not sep or not name or not provider:
        raise UpstreamError(f"model {model!r} is not `provider:model`", kind="configuration")
    return provider, name


def retry_after_seconds(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Parse ``Retry-After`` (seconds or an HTTP date) into seconds to wait."""
    if not value:
        return None
    value = value.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """A successful provider answer: the raw JSON bytes (passed on unchanged by the proxy)
    and the decoded object (for ids and token usage).

    ``requests``: the attempts that may have reached the provider, this answer's included.
    Each one may be billed (a timed-out or dropped attempt may have been answered, a 429 or
    5xx was at least received), so they are counted, never hidden behind the one call:
    ``requests - 1`` becomes the call's ``retries`` in the audit and the run's status.
    """

    raw: bytes
    data: dict[str, Any]
    attempts: int
    requests: int = 1


class Upstream:
    """Calls providers' Responses and Embeddings APIs with retries and safe errors.

    Create it inside a running event loop (or use ``async with``); close it with
    :meth:`aclose`. ``on_retry(provider, reason)`` is called before each retry (metrics).
    """

    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        on_retry: Callable[[str, str], None] | None = None,
        egress: EgressGateway | None = None,
    ) -> None:
        """``egress``: send every call through the egress gateway with the run's grant
        (:mod:`evalkube.proxy.egress`); ``None``: direct."""
        self.providers = dict(providers)
        self.retries = retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.on_retry = on_retry
        self.egress = egress
        self._session: aiohttp.ClientSession | None = None
        self._auth = {name: ProviderAuth(p) for name, p in self.providers.items()}
        self._urls: dict[tuple[str, str], URL] = {}
        self._timeouts = {
            name: aiohttp.ClientTimeout(total=p.timeout) for name, p in self.providers.items()
        }

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS),
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def provider(self, name: str) -> Provider:
        try:
            return self.providers[name]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            raise UpstreamError(
                f"provider {name!r} is not configured (configured: {known})",
                provider=name,
                kind="configuration",
            ) from None

    async def call(self, provider_name: str, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``provider``'s ``path``; retry transient failures; return JSON."""
        return (await self.post(provider_name, path, json.dumps(body).encode("utf-8"))).data

    def responses_call(self, provider_name: str, body: Mapping[str, Any]) -> tuple[str, bytes]:
        """Path and payload of the Responses request ``body`` for the provider: as is, or
        translated to Chat Completions for an ``api: chat_completions`` provider (an
        untranslatable request is a ``configuration`` error: nothing is sent)."""
        provider = self.provider(provider_name)
        if provider.api != CHAT_COMPLETIONS_API:
            return RESPONSES_PATH, json.dumps(body).encode("utf-8")
        try:
            chat = chat_request(body)
        except ChatTranslationError as exc:
            raise UpstreamError(
                f"provider {provider_name} speaks Chat Completions (api: chat_completions): {exc}",
                provider=provider_name,
                kind="configuration",
            ) from None
        return CHAT_PATH, json.dumps(chat).encode("utf-8")

    async def post_call(self, provider_name: str, path: str, payload: bytes) -> UpstreamReply:
        """POST what :meth:`responses_call` built; a chat completion comes back as the
        Responses object it stands for (raw bytes and decoded object alike)."""
        reply = await self.post(provider_name, path, payload)
        if path != CHAT_PATH:
            return reply
        try:
            data = responses_answer(reply.data)
        except ChatTranslationError as exc:
            failure = UpstreamError(
                f"provider {provider_name} answered {exc}",
                status=200,
                provider=provider_name,
                kind="invalid_response",
            )
            failure.requests = reply.requests
            raise failure from None
        return UpstreamReply(json.dumps(data).encode("utf-8"), data, reply.attempts, reply.requests)

    async def post(self, provider_name: str, path: str, payload: bytes) -> UpstreamReply:
        """POST the JSON ``payload``; retry transient failures; the raw and decoded answer.

        The retry policy: up to ``retries`` more attempts after a :func:`_transient` failure,
        each after the provider's ``Retry-After`` or else exponential backoff with jitter
        (both capped at ``backoff_max``), ``on_retry`` told before each; a failure that
        used up the retries says after how many attempts.

        Hand-written rather than ``tenacity.AsyncRetrying`` (which the cold paths use): this
        is the proxy's hot path, and tenacity's bookkeeping on every call, even one that
        succeeds at once (a retry state, a future, strategies wrapped into coroutines and
        inspected again at each step, reference cycles left to the GC) cut the Python
        proxy's calls/s in ``benchmarks/proxy.py`` by ~20% at 1 concurrent call and ~40% at
        16 and 64 (its CPU per call +30-80%).
        """
        provider = self.provider(provider_name)
        url = self._urls.get((provider_name, path))
        if url is None:
            url = self._urls[(provider_name, path)] = URL(provider.base_url.rstrip("/") + path)
        attempt = 1
        requests = 0
        while True:
            try:
                raw, data = await self._send(provider_name, provider, url, payload)
            except UpstreamError as failure:
                requests += failure.reached
                failure.requests = requests
                if not _transient(failure):
                    raise
                if attempt > self.retries:
                    if attempt > 1:
                        failure.args = (f"{failure.args[0]} (after {attempt} attempts)",)
                    raise
                if self.on_retry is not None:
                    reason = failure.kind if failure.status is None else str(failure.status)
                    self.on_retry(provider_name, reason)
                wait = failure.retry_after
                if wait is None:
                    wait = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
                    wait *= 0.5 + random.random() / 2
                await asyncio.sleep(min(wait, self.backoff_max))
                attempt += 1
            else:
                return UpstreamReply(raw, data, attempt, requests + 1)

    async def _send(
        self, name: str, provider: Provider, url: URL, payload: bytes
    ) -> tuple[bytes, dict[str, Any]]:
        """One attempt: the raw and decoded answer, or an :class:`UpstreamError` saying what
        failed (whether to retry is :meth:`post`'s decision)."""
        headers = self._auth[name].headers()
        try:
            proxy, proxy_headers, sent = None, None, headers
            if self.egress is not None:
                # The grant goes on CONNECT for https providers, on the request itself
                # (absolute-form, to the gateway, which strips it) for http ones.
                proxy = self.egress.proxy
                proxy_headers = {"Proxy-Authorization": self.egress.proxy_authorization()}
                if url.scheme == "http":
                    sent = {**headers, **proxy_headers}
            async with self._client().post(
                url,
                data=payload,
                headers=sent,
                timeout=self._timeouts[name],
                allow_redirects=False,
                proxy=proxy,
                proxy_headers=proxy_headers,
            ) as response:
                status = response.status
                raw = await response.read()
                retry_after = response.headers.get("Retry-After")
                reason = response.reason or ""
                refused = refusal(response.headers, status, reason)
                forwarded = bool(response.headers.get(SENT_HEADER))
        except EgressUnavailable as exc:
            raise _unreachable(name, provider.base_url, f"connection failed ({exc})") from None
        except TimeoutError as exc:
            raise UpstreamError(
                f"provider {name} timed out after {provider.timeout:g} s",
                provider=name,
                kind="timeout",
                # past connecting, the request may have been read and answered meanwhile
                reached=not isinstance(exc, aiohttp.ConnectionTimeoutError),
            ) from None
        except aiohttp.ClientError as exc:
            raise _unreachable(
                name, provider.base_url, _transport_reason(exc), reached=_reached(exc)
            ) from None
        if refused is not None:  # the gateway had sent it on when it failed: may be billed
            raise _unreachable(
                name, provider.base_url, f"connection failed ({refused})", reached=forwarded
            )
        if status < 400:
            return raw, _decode(raw, name, status)
        if status in (401, 403):
            raise UpstreamError(
                f"credentials rejected by provider {name} (HTTP {status}); "
                f"check its {provider.key_source() or 'API key'}",
                status=status,
                provider=name,
                kind="credentials",
                reached=True,
            )
        message = scrub(_error_message(raw, reason), [bearer_token(headers) or ""])
        raise UpstreamError(
            f"provider {name} answered HTTP {status}: {message}",
            status=status,
            provider=name,
            retry_after=retry_after_seconds(retry_after),
            reached=True,
        )


def _transient(failure: UpstreamError) -> bool:
    """Worth another attempt: a timeout, an unreachable provider or refusing gateway (a rotated
    grant or key may be mounted meanwhile), HTTP 429 or 5xx; never 401/403 nor other 4xx."""
    if failure.kind in ("timeout", "unreachable"):
        return True
    return failure.kind == "http" and (failure.status == 429 or (failure.status or 0) >= 500)


def _reached(exc: aiohttp.ClientError) -> bool:
    """Whether a transport failure came after a connection was made (a dropped or reset
    connection, a broken answer): the provider may have read the request and billed it.
    Connecting, or the egress gateway refusing the tunnel, sends it nothing."""
    return not isinstance(
        exc, aiohttp.ClientConnectorError | aiohttp.ClientHttpProxyError | aiohttp.InvalidURL
    )


def _decode(raw: bytes, provider_name: str, status: int) -> dict[str, Any]:
    try:
        data, problem = json.loads(raw), "a non-object"
    except ValueError:
        data, problem = None, "invalid JSON"
    if not isinstance(data, dict):
        raise UpstreamError(
            f"provider {provider_name} answered with {problem}",
            status=status,
            provider=provider_name,
            kind="invalid_response",
            reached=True,
        )
    return data


def _unreachable(
    provider_name: str, base_url: str, reason: str, *, reached: bool = False
) -> UpstreamError:
    """A transport failure, a refusing egress gateway or an unreadable grant: unreachable,
    hence retried (a rotated grant or key may be mounted by the next attempt)."""
    return UpstreamError(
        f"provider {provider_name} is unreachable at {_origin(base_url)}: {reason}",
        provider=provider_name,
        kind="unreachable",
        reached=reached,
    )


def _origin(base_url: str) -> str:
    scheme, _, rest = base_url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme}://{host}" if rest else base_url


def _transport_reason(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return f"connection failed (egress gateway refused: {exc.message or exc.status})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = exc.os_error
        reason = os.strerror(error.errno) if error.errno else type(error).__name__
        return f"connection failed ({reason})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return type(exc).__name__


def _error_message(raw: bytes, reason: str) -> str:
    """The provider's own explanation: ``error.message``, ``error``, or ``message`` (vLLM's
    ``{"object": "error", "message": ...}``); a body that is not JSON as text."""
    try:
        data = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace").strip()
        return (text or reason or "error")[: limits.PROVIDER_ERROR_CHARS]
    message = data.get("error") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if isinstance(data, dict) and not isinstance(message, str):
        message = data.get("message")
    return message[: limits.PROVIDER_ERROR_CHARS] if isinstance(message, str) else reason or "error"


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
