"""``s3://`` sources against a real S3 store (SeaweedFS on loopback): pinned by ETag (and by
VersionId in a versioned bucket), shards that fetch only their rows, a changed object named,
and ``evalkube run`` over s3:// objects scoring as over the same local files."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from evalkube.models import ConfigError, S3StorageSpec
from evalkube.sources import SourceAccess, parse_uri, prepare, read_pinned
from tests.integration.cluster.operator_support import EVALKUBE
from tests.integration.sources.conftest import CountingRelay
from tests.support.s3_server import S3Server

ROWS = [
    {
        "id": f"r{i}",
        "a": str(i % 10),
        "out": str(i % 7),
        "pad": hashlib.sha256(b"%d" % i).hexdigest(),
    }
    for i in range(20_000)
]


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer, row_group_size=2_000)
    return buffer.getvalue()


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the AWS chain of this process (and its children) reaches the server."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(name)
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return name


def access(server: S3Server) -> SourceAccess:
    return SourceAccess(s3=S3StorageSpec(endpoint_url=server.endpoint_url))


@pytest.mark.parametrize("name", ["rows.parquet", "rows.jsonl", "rows.jsonl.gz"])
def test_s3_shards_read_their_rows_pinned_by_etag(
    s3_server: S3Server, bucket: str, name: str
) -> None:
    data = parquet_bytes(ROWS) if name.endswith("parquet") else jsonl_bytes(ROWS)
    if name.endswith(".gz"):
        data = gzip.compress(data)
    put = s3_server.put(bucket, name, data)
    reach = access(s3_server)
    pin = prepare(parse_uri(f"s3://{bucket}/{name}", "w"), reach, "w")
    assert (pin.rows, pin.size, pin.etag) == (len(ROWS), len(data), put["ETag"])
    for start, stop in ((0, 5), (4_321, 6_000), (19_990, None)):
        assert list(read_pinned(pin, reach, "w", start, stop)) == ROWS[start:stop]


def test_a_shard_fetches_its_rows_not_the_object(
    s3_server: S3Server, bucket: str, relay: CountingRelay
) -> None:
    """Through a relay that counts what the store sends: a 1,000-row shard near the end of a
    plain JSONL object (and of a Parquet one) downloads a small part of it."""
    data = jsonl_bytes(ROWS)
    s3_server.put(bucket, "rows.jsonl", data)
    s3_server.put(bucket, "rows.parquet", parquet_bytes(ROWS))
    reach = SourceAccess(s3=S3StorageSpec(endpoint_url=f"http://127.0.0.1:{relay.port}"))
    for name, size in (("rows.jsonl", len(data)), ("rows.parquet", None)):
        pin = prepare(parse_uri(f"s3://{bucket}/{name}", "w"), reach, "w")
        relay.downloaded = 0
        assert list(read_pinned(pin, reach, "w", 15_000, 16_000)) == ROWS[15_000:16_000]
        whole = size or pin.size
        assert relay.downloaded < whole / 3, (name, relay.downloaded, whole)


def test_a_changed_object_is_named_and_a_versioned_one_is_read_as_pinned(
    s3_server: S3Server, bucket: str
) -> None:
    reach = access(s3_server)
    s3_server.put(bucket, "rows.parquet", parquet_bytes(ROWS))
    pin = prepare(parse_uri(f"s3://{bucket}/rows.parquet", "w"), reach, "tasks[qa].dataset.uri")
    s3_server.put(bucket, "rows.parquet", parquet_bytes(ROWS[:100]))
    with pytest.raises(
        ConfigError, match=rf"s3://{bucket}/rows.parquet changed since the run pinned it \(ETag"
    ):
        list(read_pinned(pin, reach, "tasks[qa].dataset.uri", 0, 10))
    versioned = f"v-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(versioned, versioning=True)
    first = s3_server.put(versioned, "rows.parquet", parquet_bytes(ROWS))
    pin = prepare(parse_uri(f"s3://{versioned}/rows.parquet", "w"), reach, "w")
    assert pin.version_id == first["VersionId"]
    s3_server.put(versioned, "rows.parquet", parquet_bytes(ROWS[:100]))
    # the version the run pinned is still there: it reads those bytes
    assert list(read_pinned(pin, reach, "w", 19_000, 19_003)) == ROWS[19_000:19_003]


def test_a_missing_object_and_wrong_credentials_are_named(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reach = access(s3_server)
    with pytest.raises(ConfigError, match=rf"w: s3://{bucket}/absent.jsonl does not exist"):
        prepare(parse_uri(f"s3://{bucket}/absent.jsonl", "w"), reach, "w")
    s3_server.put(bucket, "rows.jsonl", jsonl_bytes(ROWS[:10]))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ConfigError, match=rf"w: .*s3://{bucket}/rows.jsonl"):
        prepare(parse_uri(f"s3://{bucket}/rows.jsonl", "w"), access(s3_server), "w")


def test_evalkube_run_over_s3_objects_scores_as_over_local_files(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    """The CLI's credentials come from the environment's AWS chain; the endpoint from the
    run file's spec.storage.s3 (AWS_ENDPOINT_URL would do as well)."""
    s3_server.put(bucket, "rows.parquet", parquet_bytes(ROWS))
    outputs = [{"id": r["id"], "output_text": r["out"]} for r in ROWS]
    s3_server.put(bucket, "outputs.jsonl.gz", gzip.compress(jsonl_bytes(outputs)))
    (tmp_path / "rows.parquet").write_bytes(parquet_bytes(ROWS))
    (tmp_path / "outputs.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(outputs)))
    grader = {
        "type": "python",
        "source": (
            "def grade(sample, item):\n    return float(sample['output_text'] == item['a'])\n"
        ),
    }

    def run(dataset: str, out: str, name: str) -> dict[str, Any]:
        suite = {
            "apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite", "metadata": {"name": "s3"},
            "spec": {"tasks": [{"id": "qa", "dataset": {"uri": dataset, "idField": "id"},
                                "outputs": {"uri": out}, "grader": grader}]},
        }  # fmt: skip
        run_doc = {
            "apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": name},
            "spec": {"models": ["precomputed"], "shardSize": 3_000,
                     "storage": {"s3": {"endpointURL": s3_server.endpoint_url}}},
        }  # fmt: skip
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all([suite, run_doc]))
        done = subprocess.run(
            [EVALKUBE, "run", str(tmp_path / f"{name}.yaml"), "--sandbox", "process",
             "--db", str(tmp_path / "r.db"), "--output", str(tmp_path / f"{name}.json")],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        return dict(json.loads((tmp_path / f"{name}.json").read_text())["results"][0])

    remote = run(f"s3://{bucket}/rows.parquet", f"s3://{bucket}/outputs.jsonl.gz", "remote")
    local = run(str(tmp_path / "rows.parquet"), str(tmp_path / "outputs.jsonl.gz"), "local")
    assert remote["metrics"] == local["metrics"]
    assert (
        remote["counts"]
        == local["counts"]
        == {"samples": 20_000, "valid": 20_000, "invalid": 0, "errored": 0}
    )
