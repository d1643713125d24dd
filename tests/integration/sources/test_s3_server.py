"""The S3 store the dataset-source tests read from (tests/support/s3_server.py): a real
SeaweedFS ``weed server`` process, reached with real clients (s3fs, botocore, plain HTTP)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import require
from tests.integration.sources.conftest import CountingRelay
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


def test_put_get_head_round_trip_through_s3fs(s3_server: S3Server, bucket: str) -> None:
    fs = s3_server.filesystem()
    data = b'{"question": "2+2?", "answer": "4"}\n' * 100
    fs.pipe(f"{bucket}/rows.jsonl", data)

    assert fs.cat(f"{bucket}/rows.jsonl") == data
    head = s3_server.head(bucket, "rows.jsonl")
    assert head["size"] == len(data)
    # a single-part upload's ETag is the MD5 of its bytes, quoted
    assert head["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert "VersionId" not in head  # the bucket has no versioning
    assert fs.info(f"{bucket}/rows.jsonl")["ETag"] == head["ETag"]
    assert fs.ls(bucket) == [f"{bucket}/rows.jsonl"]

    # the same bytes again: the same ETag; other bytes: another one
    assert s3_server.put(bucket, "rows.jsonl", data)["ETag"] == head["ETag"]
    changed = s3_server.put(bucket, "rows.jsonl", data + b'{"question": "3+3?"}\n')
    assert changed["ETag"] != head["ETag"]
    assert changed["size"] == len(data) + 21
    fs.invalidate_cache()
    assert fs.info(f"{bucket}/rows.jsonl")["ETag"] == changed["ETag"]


def test_a_client_finds_the_server_and_its_keys_in_the_environment(
    s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    s3_server.put(bucket, "env.txt", b"from the environment")
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    fs = s3fs.S3FileSystem(
        skip_instance_cache=True, config_kwargs={"s3": {"addressing_style": "path"}}
    )
    assert fs.cat(f"{bucket}/env.txt") == b"from the environment"


def test_a_ranged_read_downloads_only_its_range(
    s3_server: S3Server, bucket: str, relay: CountingRelay
) -> None:
    data = os.urandom(8 * 1024 * 1024)  # 8 MiB: two of the filer's 4 MiB chunks
    s3_server.put(bucket, "big.bin", data)
    fs = s3_server.filesystem(endpoint_url=f"http://127.0.0.1:{relay.port}")

    offset = 5 * 1024 * 1024 + 12345  # inside the second chunk
    with fs.open(f"{bucket}/big.bin", "rb", block_size=64 * 1024) as f:
        f.seek(offset)
        assert f.read(1000) == data[offset : offset + 1000]
        f.seek(100)
        assert f.read(10) == data[100:110]
    assert fs.cat_file(f"{bucket}/big.bin", start=len(data) - 7) == data[-7:]
    # at most two 64 KiB blocks (s3fs reads ahead one block), a 7-byte tail and the answers'
    # headers: nothing like the object's 8 MiB
    assert 1017 < relay.downloaded < 256 * 1024, relay.downloaded

    # the server answers a Range request with 206 and exactly those bytes
    client = s3_server.filesystem()
    got = client.cat_file(f"{bucket}/big.bin", start=4 * 1024 * 1024 - 3, end=4 * 1024 * 1024 + 3)
    assert got == data[4 * 1024 * 1024 - 3 : 4 * 1024 * 1024 + 3]  # across the chunk boundary


def test_unsigned_and_wrongly_signed_requests_are_refused(s3_server: S3Server, bucket: str) -> None:
    s3_server.put(bucket, "secret.txt", b"not for anonymous eyes")
    for url in (
        f"{s3_server.endpoint_url}/",
        f"{s3_server.endpoint_url}/{bucket}",
        f"{s3_server.endpoint_url}/{bucket}/secret.txt",
    ):
        answer = httpx.get(url, timeout=10)
        assert answer.status_code == 403, (url, answer.status_code, answer.text)
        assert b"not for anonymous" not in answer.content
        assert "AccessDenied" in answer.text
    assert httpx.put(f"{s3_server.endpoint_url}/{bucket}/x", content=b"x").status_code == 403

    wrong_secret = s3_server.filesystem(secret="not-" + s3_server.secret_key)
    with pytest.raises(PermissionError):
        wrong_secret.cat(f"{bucket}/secret.txt")
    unknown_key = s3_server.filesystem(key="AKNOBODY0000000000", secret="x" * 40)
    with pytest.raises(PermissionError):
        unknown_key.ls(bucket)
    anonymous = s3_server.filesystem(anon=True, key=None, secret=None)
    with pytest.raises(PermissionError):
        anonymous.cat(f"{bucket}/secret.txt")
    # ... and nothing was written by them
    assert s3_server.filesystem().ls(bucket) == [f"{bucket}/secret.txt"]


def test_versioned_bucket_keeps_old_versions_readable(s3_server: S3Server) -> None:
    bucket = f"v-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket, versioning=True)
    first = s3_server.put(bucket, "data.jsonl", b'{"row": 1}\n')
    second = s3_server.put(bucket, "data.jsonl", b'{"row": 1}\n{"row": 2}\n')

    assert first["VersionId"]
    assert second["VersionId"]
    assert first["VersionId"] != second["VersionId"]
    assert s3_server.head(bucket, "data.jsonl") == second
    assert s3_server.head(bucket, "data.jsonl", version_id=first["VersionId"]) == first
    assert s3_server.get(bucket, "data.jsonl", version_id=first["VersionId"]) == b'{"row": 1}\n'

    fs = s3_server.filesystem(version_aware=True)
    path = f"{bucket}/data.jsonl"
    assert fs.info(path)["VersionId"] == second["VersionId"]
    with fs.open(path, "rb", version_id=first["VersionId"]) as f:
        assert f.read() == b'{"row": 1}\n'
    assert fs.cat(path) == b'{"row": 1}\n{"row": 2}\n'
    versions = {v["VersionId"] for v in fs.object_version_info(path)}
    assert versions == {first["VersionId"], second["VersionId"]}


def test_a_server_of_its_own_starts_answers_and_stops_with_every_process(
    weed: Path, tmp_path: Path
) -> None:
    server = S3Server(weed, tmp_path / "s3")
    with server:
        assert server.process is not None
        pid = server.process.pid
        assert server.startup_seconds is not None
        assert server.startup_seconds < 60
        server.create_bucket("own")
        assert server.put("own", "k", b"v")["size"] == 1
        assert (tmp_path / "s3" / "data").is_dir()
    assert server.process is None
    assert not Path(f"/proc/{pid}").exists()  # weed is gone (and reaped)
    assert _process_group(pid) == []  # and so is anything else in its process group
    for name, (_, grpc) in server.ports.items():  # and the unix sockets weed made in /tmp
        assert not Path(f"/tmp/seaweedfs-{name}-grpc-{grpc}.sock").exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.endpoint_url, timeout=2)


def _process_group(pgid: int) -> list[int]:
    """The processes of group ``pgid``, from /proc (field 5 of /proc/PID/stat)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


NETNS_HOST = "203.0.113.10"  # TEST-NET-3, on the loopback of a namespace of this test only


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        require("a network namespace needs root, ip (iproute2) and nsenter (util-linux)")
    name = f"eks3-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(
            ["ip", "-n", name, "addr", "add", f"{NETNS_HOST}/32", "dev", "lo"], check=True
        )
        yield name
    finally:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            subprocess.run(["kill", "-KILL", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_server_in_a_network_namespace_serves_there(
    weed: Path, tmp_path: Path, netns: str
) -> None:
    with S3Server(weed, tmp_path / "s3", netns=netns, host=NETNS_HOST) as server:
        assert server.endpoint_url.startswith(f"http://{NETNS_HOST}:")
        server.create_bucket("outside", versioning=True)
        row = b'{"a": 1}\n'
        put = server.put("outside", "rows.jsonl", row)
        assert put["ETag"] == f'"{hashlib.md5(row).hexdigest()}"'
        assert put["VersionId"]
        assert server.head("outside", "rows.jsonl") == put
        assert server.get("outside", "rows.jsonl") == row
        listening = subprocess.run(
            ["ip", "netns", "exec", netns, "ss", "-Htln"], capture_output=True, text=True
        ).stdout
        addresses = {line.split()[3] for line in listening.splitlines()}
        # only the gateway on the namespace's address: its S3 port, which checks signatures, and
        # its gRPC port (weed has no switch for it); master, volume server and filer on loopback
        s3_http, s3_grpc = server.ports["s3"]
        on_host = {a for a in addresses if a.startswith(f"{NETNS_HOST}:")}
        assert on_host == {f"{NETNS_HOST}:{s3_http}", f"{NETNS_HOST}:{s3_grpc}"}
        assert len(addresses) == 8
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    assert pids.stdout.split() == []  # nothing of weed's is left in the namespace
