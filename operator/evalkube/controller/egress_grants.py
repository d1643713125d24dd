"""Egress grants: what lets a work-unit pod's proxy sidecar through the egress gateway.

Pure functions, called by the run reconciler (:mod:`evalkube.controller.run_reconciler`) when it
sets a run up. A work-unit pod reaches nothing but the egress gateway (``evalkube-proxy gateway``)
and the operator's ingest port; the gateway forwards only requests that carry a grant signed
with the operator's grant key, and only to the ``host:port`` authorities the grant names: the
run's providers. The grant lives in a Secret mounted into the ``proxy`` container only, so the
grader container, which shares the pod's network, cannot use the gateway.

Format (the Go side is ``operator/evalkube-proxy/grant.go``; the shared vectors in
``tests/fixtures/egress_grants.json`` keep both byte-compatible)::

    "v1." + b64url(payload) + "." + b64url(HMAC-SHA256(key, "v1." + b64url(payload)))

with unpadded base64url and ``payload`` the compact JSON
``{"v":1,"run":"ns/name","uid":"...","hosts":["api.openai.com:443"],"exp":<unix seconds>}``.

The grant key file holds one key per line: the first signs, the gateway accepts any, so a key
is rotated by prepending the new one and removing the old one once the grants it signed have
expired.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from yarl import URL

from evalkube.models import EvalRunSpec, EvalSuiteSpec

GRANT_PREFIX = "v1."
#: Shortest grant key accepted (as the gateway, ``minGrantKeyBytes``).
MIN_KEY_BYTES = 32
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def mint_grant(
    key: bytes,
    namespace: str,
    name: str,
    uid: str,
    hosts: Iterable[str],
    expires_at: int,
) -> str:
    """The grant letting run ``namespace/name`` (``uid``) reach ``hosts`` until ``expires_at``
    (unix seconds), signed with ``key``."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the egress grant key must be at least {MIN_KEY_BYTES} bytes")
    payload = {
        "v": 1,
        "run": f"{namespace}/{name}",
        "uid": uid,
        "hosts": sorted({host.lower() for host in hosts}),
        "exp": int(expires_at),
    }
    signed = GRANT_PREFIX + _b64url(
        json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    )
    mac = hmac.new(key, signed.encode("ascii"), hashlib.sha256).digest()
    return f"{signed}.{_b64url(mac)}"


def url_authority(url: str) -> str:
    """``host:port`` of an http(s) URL, the host lower-cased, the port explicit (80 for
    http, 443 for https); IPv6 hosts in brackets, as the gateway compares them."""
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    host = parts.hostname  # lower-cased by urlsplit
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def grant_hosts(spec: EvalRunSpec, suite: EvalSuiteSpec | None = None) -> list[str]:
    """Every authority the run's pods may reach through the gateway, sorted: its providers'
    ``baseURL`` hosts (for the proxy), and the hosts of the suite's ``s3://`` and
    ``https://`` sources (for the runner): the store's ``endpointURL`` (AWS's regional
    endpoints without one), each https:// host."""
    hosts = {url_authority(provider.base_url) for provider in spec.providers.values()}
    s3 = spec.storage.s3 if spec.storage is not None else None
    tasks = suite.tasks if suite is not None else []
    for uri in [s.uri for t in tasks for s in (t.dataset, t.outputs) if s is not None and s.uri]:
        parts = urlsplit(uri)
        if parts.scheme == "https":
            hosts.add(url_authority(uri))
        elif parts.scheme == "s3" and s3 is not None and s3.endpoint_url:
            hosts.add(url_authority(s3.endpoint_url))
        elif parts.scheme == "s3":
            region = (s3.region if s3 is not None else None) or "us-east-1"
            hosts.add(f"s3.{region}.amazonaws.com:443")
            hosts.add(f"{parts.netloc.lower()}.s3.{region}.amazonaws.com:443")
    return sorted(hosts)


def service_of(url: str) -> tuple[str, str] | None:
    """``(namespace, service)`` when ``url``'s host is a Service name
    (``<service>.<namespace>.svc`` or ``...svc.cluster.local``), else ``None``."""
    host = (urlsplit(url).hostname or "").rstrip(".")
    labels = host.split(".")
    if labels[2:] not in (["svc"], ["svc", "cluster", "local"]) or not all(labels[:2]):
        return None
    return labels[1], labels[0]


def with_host(url: str, ip: str) -> str:
    """``url`` with its host replaced by ``ip`` (the port and path kept)."""
    return str(URL(url).with_host(ip))


def read_signing_key(path: Path) -> bytes:
    """The signing key of a grant key file: its first non-empty line."""
    key = next((line.strip() for line in path.read_text().splitlines() if line.strip()), "")
    if not key:
        raise ValueError(f"grant key file {path} holds no key")
    if len(key.encode("utf-8")) < MIN_KEY_BYTES:
        raise ValueError(f"grant key file {path}: the key is shorter than {MIN_KEY_BYTES} bytes")
    return key.encode("utf-8")
