"""Model calls through the egress gateway, with real processes on loopback.

``evalkube-proxy gateway`` (the binary ``.ci/proxy.sh`` builds) sits between ``evalkube
proxy`` (each engine, started as the pod's sidecar is, with ``--egress-proxy`` and
``--egress-grant-file``) and a fake OpenAI provider, over https (a CONNECT tunnel, the
provider's certificate trusted through ``SSL_CERT_FILE``) and over http (absolute-form
forwarding). A grant minted by the operator's code lets the call through; a grant for another
host, a tampered grant and an expired grant do not, and nothing reaches the provider; a client
without a grant (the grader's position: same pod network, no Secret) gets 407.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from evalkube.controller.egress_grants import mint_grant, url_authority
from tests.integration.proxy.conftest import native_or_skip
from tests.integration.proxy.fake_upstream import FakeUpstream

GRANT_KEY = b"integration-grant-key-0123456789abcdefghijklmnop"
PROVIDER_KEY = "sk-egress-test-0123456789abcdef"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the fake provider's)."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(params=["https", "http"])
def provider(
    request: pytest.FixtureRequest, certificate: tuple[Path, Path]
) -> Iterator[FakeUpstream]:
    context = None
    if request.param == "https":
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*certificate)
    with FakeUpstream(ssl_context=context) as fake:
        yield fake


def _ready_line(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"the gateway exited with {process.wait(5)} before serving")
    ready: dict[str, Any] = json.loads(line)
    return ready


@contextmanager
def _running_gateway(tmp_path: Path, *flags: str) -> Iterator[dict[str, Any]]:
    """``evalkube-proxy gateway`` on loopback, with the grant key in a file."""
    binary = native_or_skip()
    key_file = tmp_path / "grant-key"
    key_file.write_bytes(GRANT_KEY + b"\n")
    with open(tmp_path / "gateway.log", "wb") as log:
        process = subprocess.Popen(
            [binary, "gateway", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--grant-key-file", str(key_file), "--dial-timeout", "2s", *flags],
            stdout=subprocess.PIPE,
            stderr=log,
        )  # fmt: skip
    try:
        ready = _ready_line(process)
        yield {"url": f"http://{ready['endpoint']}", "metrics": ready["metrics_endpoint"]}
    finally:
        process.terminate()
        process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[dict[str, Any]]:
    # the fake provider is on loopback, which the gateway denies by default
    with _running_gateway(tmp_path, "--deny-cidrs", "") as running:
        yield running


def _write_grant(path: Path, grant: str) -> None:
    """Replace the grant as kubelet updates a mounted Secret: a new file swapped in."""
    staging = path.with_suffix(".new")
    staging.write_text(grant)
    os.replace(staging, path)


def _wait_for_socket(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"evalkube proxy exited: {log.read_text()}")
        if path.exists():
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(path))
                    return
                except OSError:
                    pass
        time.sleep(0.05)
    raise RuntimeError(f"evalkube proxy did not listen on {path}: {log.read_text()}")


@pytest.fixture
def sidecar(
    tmp_path: Path,
    engine: str,
    provider: FakeUpstream,
    gateway: dict[str, Any],
    certificate: tuple[Path, Path],
) -> Iterator[Callable[[dict[str, Any]], httpx.Response]]:
    """``evalkube proxy`` as in a pod, through the gateway; yields ``call(body)`` on its
    control listener (the runner's own calls)."""
    spec = {
        "models": ["fake:model-1"],
        "judgeModel": "fake:judge-1",
        "generation": {"retries": 0},
        "providers": {"fake": {"baseURL": provider.base_url, "apiKeyEnv": "FAKE_API_KEY"}},
    }
    (tmp_path / "run.json").write_text(json.dumps(spec))
    control = tmp_path / "control.sock"
    log = tmp_path / "proxy.log"
    env = {
        **os.environ,
        "FAKE_API_KEY": PROVIDER_KEY,
        "SSL_CERT_FILE": str(certificate[0]),
    }
    evalkube = str(Path(sys.executable).parent / "evalkube")
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [evalkube, "proxy", "--engine", engine,
             "--listen", f"unix:{tmp_path / 'model.sock'}", "--control-listen", f"unix:{control}",
             "--run-spec", str(tmp_path / "run.json"),
             "--egress-proxy", gateway["url"], "--egress-grant-file", str(tmp_path / "grant")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )  # fmt: skip
    client = httpx.Client(
        base_url="http://bridge", transport=httpx.HTTPTransport(uds=str(control)), timeout=30
    )
    try:
        _wait_for_socket(control, process, log)
        yield lambda body: client.post("/v1/responses", json=body)
    finally:
        client.close()
        process.terminate()
        process.wait(10)


def _grant(hosts: list[str], expires_in: float = 3600) -> str:
    return mint_grant(GRANT_KEY, "evals", "nightly", "uid-1", hosts, int(time.time() + expires_in))


def test_model_calls_pass_only_with_the_runs_grant(
    tmp_path: Path,
    sidecar: Callable[[dict[str, Any]], httpx.Response],
    provider: FakeUpstream,
    gateway: dict[str, Any],
) -> None:
    grant_file = tmp_path / "grant"
    body = {"model": "auto", "input": "2+2?"}
    granted = url_authority(provider.base_url)

    # A grant for another host: the gateway's 403, nothing reaches the provider.
    _write_grant(grant_file, _grant(["api.openai.com:443"]))
    answer = sidecar(body)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["type"] == "upstream_unreachable"
    assert "egress gateway refused: Forbidden" in answer.json()["error"]["message"]

    # A tampered grant (its hosts widened, the old signature kept) and an expired one: 407.
    good = _grant([granted])
    head, _payload, mac = good.split(".")
    forged = _grant([granted, "api.openai.com:443"]).split(".")[1]
    for bad in (f"{head}.{forged}.{mac}", _grant([granted], expires_in=-1)):
        _write_grant(grant_file, bad)
        answer = sidecar(body)
        assert answer.status_code == 502, answer.text
        assert "egress gateway refused: Proxy Authentication Required" in answer.text
    assert provider.received == []

    # The run's grant, swapped in as a rotated Secret is: the call goes through.
    _write_grant(grant_file, good)
    answer = sidecar(body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"][0]["content"][0]["text"] == "echo: 2+2?"
    (seen,) = provider.received
    assert seen.headers["Authorization"] == f"Bearer {PROVIDER_KEY}"
    assert not {name.lower() for name in seen.headers} & {"proxy-authorization", "via"}
    assert good not in json.dumps(seen.headers)
    kind = "connect" if provider.base_url.startswith("https") else "http"
    metrics = httpx.get(f"http://{gateway['metrics']}/metrics", timeout=10).text
    assert f'evalkube_egress_requests_total{{kind="{kind}",outcome="ok"}} 1' in metrics
    assert f'evalkube_egress_requests_total{{kind="{kind}",outcome="forbidden"}} 1' in metrics
    assert f'evalkube_egress_requests_total{{kind="{kind}",outcome="unauthorized"}} 2' in metrics


def test_a_client_without_the_grant_is_refused(
    gateway: dict[str, Any], provider: FakeUpstream
) -> None:
    """The grader's position: it shares the pod's network, so it reaches the gateway, but it
    cannot read the grant."""
    target = url_authority(provider.base_url)
    host, port = gateway["url"].removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert conn.recv(100).startswith(b"HTTP/1.1 407")
    with httpx.Client(proxy=gateway["url"], timeout=10) as client:
        answer = client.post(f"http://{target}/v1/responses", json={"input": "x"})
    assert answer.status_code == 407
    assert answer.headers["proxy-authenticate"].startswith("Basic")
    # A grant for another host, sent directly: 403.
    other = _grant(["api.openai.com:443"])
    with httpx.Client(
        proxy=httpx.Proxy(gateway["url"], auth=("evalkube", other)), timeout=10
    ) as client:
        answer = client.post(f"http://{target}/v1/responses", json={"input": "x"})
    assert answer.status_code == 403
    assert provider.received == []
    metrics = httpx.get(f"http://{gateway['metrics']}/metrics", timeout=10).text
    assert 'evalkube_egress_requests_total{kind="connect",outcome="unauthorized"} 1' in metrics
    assert 'evalkube_egress_requests_total{kind="http",outcome="forbidden"} 1' in metrics


def test_by_default_loopback_is_denied_even_when_granted(
    tmp_path: Path, provider: FakeUpstream
) -> None:
    """A run whose provider URL names (or resolves to) loopback or the metadata address gets
    nowhere: the default ``--deny-cidrs`` is checked on the address actually dialed."""
    target = url_authority(provider.base_url)
    grant = _grant([target])
    with (
        _running_gateway(tmp_path) as running,
        httpx.Client(proxy=httpx.Proxy(running["url"], auth=("evalkube", grant)), timeout=10) as c,
    ):
        if provider.base_url.startswith("https"):
            with pytest.raises(httpx.ProxyError, match="403"):
                c.post(f"https://{target}/v1/responses", json={"input": "x"})
        else:
            assert c.post(f"http://{target}/v1/responses", json={"input": "x"}).status_code == 403
        metrics = httpx.get(f"http://{running['metrics']}/metrics", timeout=10).text
    assert provider.received == []
    assert 'outcome="denied"} 1' in metrics
