"""What a uri names, and what is refused with the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkube.models import ConfigError
from evalkube.sources import parse_uri


@pytest.mark.parametrize(
    ("raw", "scheme", "location", "fmt", "compression"),
    [
        ("s3://bucket/dir/mmlu.parquet", "s3", "bucket/dir/mmlu.parquet", "parquet", None),
        ("s3://bucket/logs.jsonl.zst", "s3", "bucket/logs.jsonl.zst", "jsonl", "zstd"),
        ("pvc://datasets/hella/swag.csv.gz", "pvc", "datasets/hella/swag.csv.gz", "csv", "gzip"),
        (
            "https://example.org/x/data.ndjson",
            "https",
            "https://example.org/x/data.ndjson",
            "jsonl",
            None,
        ),
    ],
)
def test_cluster_uris(
    raw: str, scheme: str, location: str, fmt: str, compression: str | None
) -> None:
    source = parse_uri(raw, "f")
    assert (source.scheme, source.location, source.format, source.compression) == (
        scheme, location, fmt, compression,
    )  # fmt: skip


def test_local_paths_resolve_against_the_suite_and_are_refused_in_a_cluster(tmp_path: Path) -> None:
    assert parse_uri("data/x.jsonl", "f", tmp_path).location == str(tmp_path / "data" / "x.jsonl")
    assert parse_uri("file:///srv/x.csv", "f", tmp_path).location == "/srv/x.csv"
    with pytest.raises(
        ConfigError, match=r"tasks\[0\].dataset.uri: 'data/x.jsonl' is a local path"
    ):
        parse_uri("data/x.jsonl", "tasks[0].dataset.uri")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("s3://bucket", "is not s3://BUCKET/KEY"),
        ("s3://B_/x.jsonl", "is not s3://BUCKET/KEY"),
        ("pvc://claim/../etc/passwd.jsonl", "without '..'"),
        ("pvc://Claim/x.jsonl", "is not pvc://CLAIM/PATH"),
        ("https://user:pw@host/x.jsonl", "without credentials"),
        ("gs://bucket/x.jsonl", "scheme 'gs' is not one evalkube reads"),
        ("s3://bucket/x.txt", "cannot tell the format"),
        ("s3://bucket/x.parquet.gz", "a Parquet file compresses its own pages"),
    ],
)
def test_malformed_uris_are_named_with_the_fix(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_uri(raw, "f")


def test_a_declared_format_wins_over_the_name() -> None:
    assert parse_uri("s3://bucket/export", "f", fmt="parquet").format == "parquet"
    assert parse_uri("s3://bucket/export.gz", "f", fmt="jsonl").compression == "gzip"
