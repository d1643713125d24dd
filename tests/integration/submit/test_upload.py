"""``evalkube submit``'s uploads to a real S3 store (SeaweedFS): a HEAD first, the file streamed
in parts (memory does not grow with its size), its bytes exactly, progress part by part."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from evalkube import limits
from evalkube.models import ConfigError, S3StorageSpec
from evalkube.submit.objects import ObjectStore
from evalkube.submit.plan import LocalFile, Upload
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

#: Uploads a file in a fresh process and reports its peak memory before and after the upload.
MEASURE = """
import json, resource, sys
from pathlib import Path
from evalkube.models import S3StorageSpec
from evalkube.submit.objects import ObjectStore
from evalkube.submit.plan import LocalFile, Upload

path, bucket, endpoint = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
local = LocalFile.as_is(path, "tasks[big].dataset.path")
upload = Upload(local, bucket, f"big/{local.sha256}/{local.filename}")
store = ObjectStore(S3StorageSpec(endpoint_url=endpoint))
assert not store.has(upload)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
parts = []
store.put(upload, parts.append)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before": before * 1024, "after": after * 1024, "parts": parts,
                  "key": upload.key, "sha256": local.sha256, "there": store.has(upload)}))
"""


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


def _credentials(s3: S3Server) -> dict[str, str]:
    """This machine's AWS chain as a user has it (the endpoint is the run file's)."""
    return {k: v for k, v in s3.env.items() if k != "AWS_ENDPOINT_URL"}


def test_a_large_file_is_streamed_in_parts_and_arrives_whole(
    s3_server: S3Server, bucket: str, tmp_path: Path
) -> None:
    size = 128 * 1024 * 1024
    line = (json.dumps({"q": "x" * 1000, "a": "1"}) + "\n").encode()
    big = tmp_path / "big.jsonl"
    with big.open("wb") as out:
        for _ in range(size // len(line)):
            out.write(line)
    size = big.stat().st_size
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(big), bucket, s3_server.endpoint_url],
        env={**os.environ, **_credentials(s3_server)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    part = limits.SUBMIT_UPLOAD_PART_BYTES
    assert sum(report["parts"]) == size  # the progress bar's feed, one step a part
    assert len(report["parts"]) == -(-size // part)
    assert report["there"]
    # at most a few parts in memory at once, never the file (a whole read would add `size`)
    grown = report["after"] - report["before"]
    assert grown < 2 * part * limits.SUBMIT_UPLOAD_CONCURRENCY + 16 * 1024 * 1024, grown
    assert grown < size / 2
    digest = hashlib.sha256()
    with s3_server.filesystem().open(f"{bucket}/{report['key']}", "rb") as stored:
        for block in iter(lambda: stored.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == report["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()


def test_a_json_array_is_uploaded_as_its_jsonl_and_found_by_a_head_next_time(
    s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in _credentials(s3_server).items():
        monkeypatch.setenv(key, value)
    rows = [{"q": "1?", "a": "1"}, {"q": "2?", "a": "2"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    local = LocalFile.jsonl(tmp_path / "rows.json", "tasks[qa].dataset.path")
    upload = Upload(local, bucket, f"qa/{local.sha256}/{local.filename}")
    store = ObjectStore(S3StorageSpec(endpoint_url=s3_server.endpoint_url))
    assert not store.has(upload)
    sent: list[int] = []
    store.put(upload, sent.append)
    assert sum(sent) == local.size
    stored = s3_server.get(bucket, upload.key)
    assert [json.loads(line) for line in stored.splitlines()] == rows
    assert hashlib.sha256(stored).hexdigest() == local.sha256
    assert store.has(upload)


def test_a_missing_bucket_and_wrong_keys_are_named(
    s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in _credentials(s3_server).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "qa.jsonl").write_text('{"q": 1}\n')
    local = LocalFile.as_is(tmp_path / "qa.jsonl", "tasks[qa].dataset.path")
    spec = S3StorageSpec(endpoint_url=s3_server.endpoint_url)
    missing = Upload(local, "no-such-bucket-here", "qa/x/qa.jsonl")
    with pytest.raises(ConfigError, match="bucket 'no-such-bucket-here' does not exist"):
        ObjectStore(spec).put(missing, lambda _: None)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(ConfigError, match="access denied by http://"):
        ObjectStore(spec).put(Upload(local, bucket, "qa/x/qa.jsonl"), lambda _: None)
