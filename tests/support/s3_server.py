"""A real S3-compatible object store for the tests: SeaweedFS's ``weed server`` (master, volume
server, filer and S3 gateway in one process) from the binary ``.ci/seaweedfs.sh`` builds
(``EVALKUBE_WEED_BIN``, else that script's cache).

Requests must be signed: the gateway gets an identity file with one admin (all actions on all
buckets), so an anonymous or wrongly signed request is refused (403). Only the gateway listens
on ``host``; the master, volume server and filer, whose own HTTP and gRPC APIs check nothing,
listen on loopback. The gateway's gRPC port (identity management, unauthenticated: weed has no
switch to turn it off) is on ``host`` too: a test that lets pods reach the store admits its S3
port (``port``) only. Data lives under the given root; every port (HTTP and gRPC of each
component) is picked free and named on the command line, so two servers on one machine never
meet. :meth:`S3Server.start` returns once a write goes through (~10 s: the master holds volume
allocation for a few seconds after it first leads, and the filer joins the lock ring that
writes take after ~8 s); :meth:`S3Server.stop` ends the server's process group, and only it.

``weed server``, not ``weed mini`` (writable after ~5 s): mini also runs an admin server and a
maintenance worker, and binds its S3 gateway on the same address as everything else.

``netns=NAME`` starts the server inside the network namespace ``/run/netns/NAME`` (the
real-node tier's "outside" host), listening on ``host`` there; the helpers then run their
requests from inside that namespace too (this module as a script, under ``nsenter``), since the
test process cannot reach that address::

    with outside_netns(node) as ns, S3Server(weed, tmp, netns=ns, host=OUTSIDE_IP) as s3:
        s3.create_bucket("data")
        s3.put("data", "rows.jsonl", b'{"q": 1}\\n')

A client in the test process: ``s3.filesystem()`` (an ``s3fs.S3FileSystem``),
``s3.storage_options`` for ``fsspec.open("s3://...", **s3.storage_options)``, or ``s3.env``
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...) for a client that reads the environment, as
``evalkube run`` and the runner do.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from evalkube.util.process import signal_on_parent_death
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
#: the components of ``weed server`` that listen, each on an HTTP port and a gRPC port
COMPONENTS = ("master", "volume", "filer", "s3")


def weed_bin() -> Path | None:
    """The ``weed`` binary, or ``None`` when it is not built (``bash .ci/seaweedfs.sh``)."""
    given = os.environ.get("EVALKUBE_WEED_BIN")
    if given:
        return Path(given)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalkube-seaweedfs"
    built = sorted(glob.glob(str(root / "*" / "weed")), key=os.path.getmtime)
    return Path(built[-1]) if built else None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now, outside the ephemeral range (where
    polling them before weed listens could connect a socket to itself: tests.support.ports)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port(host)) not in ports:
            ports.append(port)
    return ports


class S3Server:
    """``weed server -filer -s3`` in a process group of its own, serving signed S3 on
    ``endpoint_url``; a context manager (start on enter, stop on exit)."""

    def __init__(
        self,
        weed: Path,
        root: Path,
        *,
        host: str = "127.0.0.1",
        netns: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = REGION,
    ) -> None:
        self.weed, self.root, self.host, self.netns, self.region = weed, root, host, netns, region
        self.access_key = access_key or "EK" + secrets.token_hex(9).upper()
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        # (in a netns these are free here, and the netns is expected to have little running)
        picked = free_ports(2 * len(COMPONENTS))
        self.ports = {name: (picked[2 * i], picked[2 * i + 1]) for i, name in enumerate(COMPONENTS)}
        self.port = self.ports["s3"][0]
        self.endpoint_url = f"http://{_url_host(host)}:{self.port}"
        self.log = root / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: seconds from the process start until weed accepted a write (``timings["writable"]``)
        self.startup_seconds: float | None = None
        #: seconds from the process start to the first answered signed request ("answers") and
        #: to the first accepted write ("writable")
        self.timings: dict[str, float] = {}

    # -- life cycle ---------------------------------------------------------------------------

    def command(self) -> list[str]:
        data, config = self.root / "data", self.root / "config"
        ports = {
            f"-{name}.port{suffix}": str(port)
            for name, pair in self.ports.items()
            for suffix, port in zip(("", ".grpc"), pair, strict=True)
        }
        return [
            *(["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []),
            str(self.weed),
            "-logtostderr",
            # toml files (filer.toml, security.toml, ...) from this empty folder, not the host's
            f"-config_dir={config}",
            "server",
            f"-dir={data}",
            # master, volume server and filer (unauthenticated HTTP and gRPC APIs) on loopback
            # only; the S3 gateway, which checks every signature, on the given address
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.ip.bind={self.host}",
            "-filer",
            "-s3",
            *[f"{flag}={value}" for flag, value in ports.items()],
            f"-s3.config={self.root / 's3.json'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # no bucket appears because somebody wrote into it
            "-s3.autoCreateBucket=false",
            # no usage report to the internet (the default is on)
            "-master.telemetry=false",
            # small volumes, as many as the disk holds: each bucket is a collection of its own
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            # the unix sockets weed makes beside its TCP ports: in the data dir, not /tmp
            f"-filer.localSocket={data / 'filer.sock'}",
            f"-s3.localSocket={data / 's3.sock'}",
        ]

    def start(self, timeout: float = 90) -> S3Server:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "config").mkdir(exist_ok=True)
        (self.root / "s3.json").write_text(json.dumps(self.identities(), indent=2))
        # weed adds an identity for AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY when they are set
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WEED_", "S3_"))}
        parent = os.getpid()
        started = time.monotonic()
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=env,
                start_new_session=True,
                preexec_fn=lambda: signal_on_parent_death(signal.SIGTERM, parent) and None,
            )
        process = self.process
        try:
            if self.netns is None:
                alive = lambda: process.poll() is None  # noqa: E731
                self.timings = _wait_ready(self._client_config(), timeout, alive, started)
            else:
                self.timings = self._rpc(
                    "wait", timeout=timeout, deadline=timeout, pid=process.pid, started=started
                )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = self.timings["writable"]
        return self

    def stop(self, grace: float = 2) -> None:
        """End the server's process group and wait for it; nothing else is signalled. SIGTERM
        first; what is left after ``grace`` seconds is killed (weed's filer spends ~15 s
        retrying to flush its metadata log once the volume server in the same process has
        stopped, and these tests keep nothing)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)
        # whatever is left of the group (weed itself after the grace, a child that outlived it)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        for name, (_, grpc) in self.ports.items():  # weed's gRPC sockets are always in /tmp
            Path(f"/tmp/seaweedfs-{name}-grpc-{grpc}.sock").unlink(missing_ok=True)

    def __enter__(self) -> S3Server:
        return self.start() if self.process is None else self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def identities(self) -> dict[str, Any]:
        """The gateway's identity file: one admin with every action on every bucket."""
        return {
            "identities": [
                {
                    "name": "evalkube-test-admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }

    # -- clients ------------------------------------------------------------------------------

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options reaching this server (``fsspec.open(url, **storage_options)``)."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": self.region},
            # path-style addressing: no bucket.host DNS names on loopback
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }

    @property
    def env(self) -> dict[str, str]:
        """The environment a botocore/s3fs client reads to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def filesystem(self, **options: Any) -> Any:
        """A fresh ``s3fs.S3FileSystem`` on this server (not fsspec's cached instance)."""
        import s3fs

        return s3fs.S3FileSystem(**{**self.storage_options, "skip_instance_cache": True, **options})

    def create_bucket(self, name: str, *, versioning: bool = False) -> None:
        self._rpc("create_bucket", bucket=name, versioning=versioning)

    def enable_versioning(self, bucket: str) -> None:
        self._rpc("enable_versioning", bucket=bucket)

    def put(self, bucket: str, key: str, data: bytes) -> dict[str, Any]:
        """Write an object; returns its :meth:`head`."""
        head: dict[str, Any] = self._rpc(
            "put", bucket=bucket, key=key, data=base64.b64encode(data).decode()
        )
        return head

    def get(self, bucket: str, key: str, version_id: str | None = None) -> bytes:
        out = self._rpc("get", bucket=bucket, key=key, version_id=version_id)
        return base64.b64decode(out["data"])

    def head(self, bucket: str, key: str, version_id: str | None = None) -> dict[str, Any]:
        """``{"ETag": ..., "size": ..., "VersionId": ...}`` (``VersionId`` only when the bucket
        has versioning)."""
        head: dict[str, Any] = self._rpc("head", bucket=bucket, key=key, version_id=version_id)
        return head

    def _rpc(self, op: str, timeout: float = 60, **args: Any) -> Any:
        request = {"op": op, "server": self._client_config(), **args}
        if self.netns is None:
            return _serve(request)
        done = subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.netns}", sys.executable, "-m", __name__],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=timeout + 30,
        )  # fmt: skip
        if done.returncode != 0:
            raise S3Error(f"{op} in netns {self.netns} failed: {done.stderr.strip()[-3000:]}")
        return json.loads(done.stdout)

    def _client_config(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint_url,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
            "log": str(self.log),
        }


class S3Error(RuntimeError):
    pass


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# -- the requests, run in this process or (netns) in this module as a script ---------------------


def _client(server: dict[str, Any]) -> Any:
    import botocore.config
    import botocore.session

    session = botocore.session.get_session()
    return session.create_client(
        "s3",
        endpoint_url=server["endpoint_url"],
        region_name=server["region"],
        aws_access_key_id=server["access_key"],
        aws_secret_access_key=server["secret_key"],
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


def _head(client: Any, bucket: str, key: str, version_id: str | None) -> dict[str, Any]:
    extra = {"VersionId": version_id} if version_id else {}
    meta = client.head_object(Bucket=bucket, Key=key, **extra)
    out = {"ETag": meta["ETag"], "size": meta["ContentLength"]}
    if meta.get("VersionId") and meta["VersionId"] != "null":
        out["VersionId"] = meta["VersionId"]
    return out


def _serve(request: dict[str, Any]) -> Any:
    server, op = request["server"], request["op"]
    if op == "wait":  # in the netns: weed is not this process's child
        pid = request["pid"]
        return _wait_ready(server, request["deadline"], lambda: _alive(pid), request["started"])
    client = _client(server)
    if op == "create_bucket":
        client.create_bucket(Bucket=request["bucket"])
        if request.get("versioning"):
            _enable_versioning(client, request["bucket"])
        return None
    if op == "enable_versioning":
        _enable_versioning(client, request["bucket"])
        return None
    if op == "put":
        client.put_object(
            Bucket=request["bucket"], Key=request["key"], Body=base64.b64decode(request["data"])
        )
        return _head(client, request["bucket"], request["key"], None)
    if op == "head":
        return _head(client, request["bucket"], request["key"], request.get("version_id"))
    if op == "get":
        extra = {"VersionId": request["version_id"]} if request.get("version_id") else {}
        body = client.get_object(Bucket=request["bucket"], Key=request["key"], **extra)["Body"]
        return {"data": base64.b64encode(body.read()).decode()}
    raise ValueError(f"unknown op {op!r}")


def _enable_versioning(client: Any, bucket: str) -> None:
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})


def _wait_ready(
    server: dict[str, Any], timeout: float, alive: Callable[[], bool], started: float
) -> dict[str, float]:
    """Until a signed ListBuckets answers, then until an object can be written (a bucket made,
    an object put, both deleted): weed's gateway answers within seconds, but its master defers
    volume allocation for ~4 s after it first becomes leader and its filer joins the lock ring
    writes need ~8 s after start. Returns the seconds from ``started`` (``time.monotonic()``,
    the same clock in every process) to each."""
    from botocore.exceptions import ClientError

    client = _client(server)
    deadline = time.monotonic() + timeout
    probe = f"evalkube-ready-{secrets.token_hex(6)}"
    timings: dict[str, float] = {}
    last: object = None
    while time.monotonic() < deadline:
        if not alive():
            raise S3Error(f"weed exited: {_tail(server['log'])}")
        try:
            if "answers" not in timings:
                client.list_buckets()
                timings["answers"] = time.monotonic() - started
            try:
                client.create_bucket(Bucket=probe)
            except ClientError as exc:  # made by a try that failed later
                if exc.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                    raise
            client.put_object(Bucket=probe, Key="probe", Body=b"ready")
            client.delete_object(Bucket=probe, Key="probe")
            client.delete_bucket(Bucket=probe)
            timings["writable"] = time.monotonic() - started
            return timings
        except Exception as exc:  # not up yet: connection refused, 503 while the filer starts
            last = exc
        time.sleep(0.1)
    raise S3Error(
        f"weed's S3 gateway was not ready in {timeout} s ({last}): {_tail(server['log'])}"
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (and is no zombie waiting for its parent)."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _tail(log: str, lines: int = 40) -> str:
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main() -> None:
    """One request (JSON on stdin), its answer (JSON on stdout): the helpers in a netns."""
    json.dump(_serve(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    main()
