"""The proxy sidecar's way out: every upstream call through the egress gateway, with a grant.

In a cluster a work-unit pod reaches nothing but the egress gateway (``evalkube-proxy
gateway``, see ``docs/security.md``), which forwards a request only when it carries the run's
grant, a token the operator signs and mounts into the ``proxy`` container only. With
``--egress-proxy``/``--egress-grant-file`` set, :class:`~evalkube.proxy.upstream.Upstream`
sends every call through the gateway (``CONNECT`` for https providers, absolute-form requests
for http ones) with ``Proxy-Authorization: Basic base64("evalkube:" + grant)``; the grant file
is read again when the mounted Secret changes. Unset (local runs), calls go direct.

The native proxy does the same in ``operator/evalkube-proxy/egress.go``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from yarl import URL

__all__ = [
    "GRANT_USER",
    "REFUSED_HEADER",
    "SENT_HEADER",
    "EgressGateway",
    "EgressUnavailable",
    "check_gateway_url",
    "refusal",
]

#: The user name of the grant's Basic credentials (the gateway checks it).
GRANT_USER = "evalkube"
#: Header the gateway puts on its own refusals of forwarded plain-HTTP calls, so they are not
#: mistaken for a provider's 403.
REFUSED_HEADER = "X-Evalkube-Egress"
#: On the gateway's 502 for a forwarded call: the call failed after it was sent to the
#: destination, so the provider may have read and billed it.
SENT_HEADER = "X-Evalkube-Egress-Sent"


class EgressUnavailable(RuntimeError):
    """The grant cannot be read; the message names the file (never a grant)."""


def check_gateway_url(url: str) -> str:
    """``url`` when it is ``http://host:port`` (the gateway speaks plain HTTP), else ValueError."""
    parts = urlsplit(url)
    usable = parts.scheme == "http" and parts.hostname and not parts.username
    if not usable or parts.path not in ("", "/"):
        raise ValueError(f"the egress proxy must be http://host:port, not {url!r}")
    return url


@dataclass
class EgressGateway:
    """Where the gateway is and where the run's grant is mounted."""

    url: str
    grant_file: Path
    _cached: tuple[tuple[int, int, int], str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_gateway_url(self.url)
        self.proxy = URL(self.url)

    def proxy_authorization(self) -> str:
        """The current grant as a ``Proxy-Authorization`` value (the file is re-read when it
        changes): ``Basic base64("evalkube:" + grant)``."""
        raw = f"{GRANT_USER}:{self.grant()}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def proxy_url(self) -> str:
        """The gateway as a proxy URL carrying the current grant as its Basic credentials
        (for clients configured with a proxy URL: botocore, httpx)."""
        return str(self.proxy.with_user(GRANT_USER).with_password(self.grant()))

    def grant(self) -> str:
        """The current grant (re-read when the file changes)."""
        try:
            stat = self.grant_file.stat()
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if self._cached is None or self._cached[0] != stamp:
                self._cached = (stamp, self.grant_file.read_text().strip())
        except OSError as exc:
            self._cached = None
            raise EgressUnavailable(
                f"egress grant {self.grant_file} unreadable: {exc.strerror or exc}"
            ) from None
        if not self._cached[1]:
            raise EgressUnavailable(f"egress grant {self.grant_file} unreadable: it is empty")
        return self._cached[1]


def refusal(headers: Mapping[str, str], status: int, reason: str) -> str | None:
    """The gateway's reason when it refused a forwarded call itself, else None."""
    return f"egress gateway refused: {reason or status}" if headers.get(REFUSED_HEADER) else None
