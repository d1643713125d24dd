"""Which runs the API serves and their ingest tokens (only SHA-256 digests are kept)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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

    def authorize(self, namespace: str, name: str, token: str | None) -> RunEntry | None:
        """The run when ``token`` is its ingest token (constant-time compare), else None."""
        entry = self._runs.get((namespace, name))
        if entry is not None and token and hmac.compare_digest(entry.token_digest, digest(token)):
            return entry
        return None
