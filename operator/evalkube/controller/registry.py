"""Which runs the API serves and their ingest tokens (only SHA-256 digests are kept)."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

#: What a bearer token may look like (``secrets.token_urlsafe`` makes them): anything else is
#: refused before a run is looked up.
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_shaped(token: str) -> bool:
    """Whether ``token`` could be an ingest token at all (checked before any lookup)."""
    return _TOKEN_SHAPE.fullmatch(token) is not None


def token_matches(entry: RunEntry, token: str) -> bool:
    """Whether ``token`` is ``entry``'s ingest token (constant-time; a finished run, whose
    digest is empty, accepts none)."""
    return bool(entry.token_digest) and hmac.compare_digest(entry.token_digest, digest(token))


@dataclass(frozen=True)
class RunEntry:
    """A run the operator manages: its store id and the digest of its ingest token."""

    namespace: str
    name: str
    run_id: str
    suite: str
    token_digest: str


class RunRegistry:
    """(namespace, name) -> run; filled by the reconciler, read by the API."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], RunEntry] = {}

    def register(self, entry: RunEntry) -> None:
        self._runs[(entry.namespace, entry.name)] = entry

    def forget(self, namespace: str, name: str) -> None:
        self._runs.pop((namespace, name), None)

    def get(self, namespace: str, name: str) -> RunEntry | None:
        return self._runs.get((namespace, name))
