"""Shards of plain JSONL and CSV objects in a real S3 store (SeaweedFS), read as a unit's runner
reads them: from the pinned row index's offset, line by line with the bounded reader."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from evalkube.models import S3StorageSpec
from evalkube.sources import SourceAccess, parse_uri, prepare, read_pinned
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.timeout(180)

ROWS = [{"id": f"r{i}", "q": f"{i}?", "a": str(i)} for i in range(2_500)]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_shard_in_the_middle_of_a_plain_object_reads_just_its_rows(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    import json

    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    if fmt == "jsonl":
        data = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
    else:
        data = ("id,q,a\n" + "".join(f"{r['id']},{r['q']},{r['a']}\n" for r in ROWS)).encode()
    s3_server.put(bucket, f"rows.{fmt}", data)
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    access = SourceAccess(s3=S3StorageSpec(endpoint_url=s3_server.endpoint_url))
    source = parse_uri(f"s3://{bucket}/rows.{fmt}", "f", base_dir=Path("/"))
    pin = prepare(source, access, "f")
    assert pin.rows == len(ROWS)
    assert pin.seek_point(1_700)[0] > 0  # the shard starts at an indexed offset, not at 0
    assert list(read_pinned(pin, access, "f", start=1_700, stop=1_750)) == ROWS[1_700:1_750]
