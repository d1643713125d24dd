"""https:// sources against a real HTTPS server on loopback: read only when their bytes have
the pinned sha256, refused naming the object otherwise, trusted through a CA file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkube.models import ConfigError
from evalkube.sources import SourceAccess, parse_uri, prepare, read_pinned
from tests.support.https_server import HttpsServer, https_server

ROWS = [{"id": i, "text": f"row {i}"} for i in range(120)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpsServer]:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with https_server(tmp_path / "www", tmp_path) as started:
        yield started


def test_an_https_source_with_its_sha256_is_read(server: HttpsServer, tmp_path: Path) -> None:
    digest = hashlib.sha256((tmp_path / "www" / "rows.jsonl").read_bytes()).hexdigest()
    access = SourceAccess(ca_bundle=server.ca_file)
    source = parse_uri(f"{server.url}/rows.jsonl", "w")
    pin = prepare(source, access, "w", digest)
    assert (pin.rows, pin.sha256) == (120, digest)
    assert list(read_pinned(pin, access, "w", 100, 110)) == ROWS[100:110]


def test_a_wrong_sha256_is_refused_naming_the_object(server: HttpsServer) -> None:
    access = SourceAccess(ca_bundle=server.ca_file)
    source = parse_uri(f"{server.url}/rows.jsonl", "tasks[qa].dataset.uri")
    expected = (
        r"tasks\[qa\].dataset.uri: https://127.0.0.1:\d+/rows.jsonl has sha256 [0-9a-f]{64}, "
        r"not the 0{64} it is pinned to"
    )
    with pytest.raises(ConfigError, match=expected):
        prepare(source, access, "tasks[qa].dataset.uri", "0" * 64)


def test_an_untrusted_certificate_and_a_missing_object_are_named(server: HttpsServer) -> None:
    source = parse_uri(f"{server.url}/rows.jsonl", "w")
    with pytest.raises(ConfigError, match=r"w: cannot fetch https://.*CERTIFICATE_VERIFY_FAILED"):
        prepare(source, SourceAccess(), "w", "0" * 64)
    missing = parse_uri(f"{server.url}/absent.jsonl", "w")
    with pytest.raises(ConfigError, match=r"absent\.jsonl answered HTTP 404"):
        prepare(missing, SourceAccess(ca_bundle=server.ca_file), "w", "0" * 64)
