"""A misbehaving provider through both proxy engines: 429 and 5xx storms, slow bodies,
dropped connections. What the provider received (its bill) must equal what the proxy
reports, exactly: one per call plus each retry that may have reached it
(``retries`` in the usage a runner takes, ``X-Evalkube-Upstream-Requests`` on the runner's
own calls), and no answer the proxy received is asked for again.

The provider is the real-node tier's fake (``tests/realnode/fake_provider.py``, a real HTTP
server), here on loopback (``tests/support/faulty_provider.py``), switched between
misbehaviours over HTTP as the real-node fault tests do.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller.egress_grants import url_authority
from evalkube.proxy.upstream import REQUESTS_HEADER
from evalkube_sandbox.ctx import Context
from tests.integration.proxy.conftest import MakeBridge
from tests.integration.proxy.test_egress import (
    _grant,
    _running_gateway,
    _wait_for_socket,
    _write_grant,
)
from tests.support.faulty_provider import FakeProvider, running_fake_provider
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(120)

CALLS = 4


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with running_fake_provider() as provider:
        yield provider


#: mode -> (options, requests the provider receives for each call)
FAULTS: dict[str, tuple[dict[str, Any], int]] = {
    "storm429": ({"times": 2, "retry_after": 0}, 3),
    "storm5xx": ({"times": 2, "status": 503}, 3),
    "slow": ({"times": 1, "delay": 4}, 2),  # the provider's timeout is 1 s
    "drop": ({"times": 2}, 3),
}


@pytest.mark.parametrize("mode", sorted(FAULTS))
def test_every_request_the_provider_received_is_counted_and_no_answer_is_asked_twice(
    make_bridge: MakeBridge, fake: FakeProvider, engine: str, tmp_path: Path, mode: str
) -> None:
    options, per_call = FAULTS[mode]
    extra: dict[str, Any] = {}
    if engine == "python":
        extra["control_listen"] = f"unix:{tmp_path}/control.sock"
    bridge = make_bridge(base_url=f"{fake.base}/v1", timeout=1.0, retries=4, **extra)
    assert bridge.endpoint is not None
    assert bridge.control_endpoint is not None
    fake.mode(mode, **options)

    # graders' calls, one execution each
    tokens = [f"t{i}" for i in range(CALLS)]
    bridge.open_executions(tokens)
    answers = [
        Context(bridge.endpoint, token, "task").responses_create(input=f"question {i}")
        for i, token in enumerate(tokens)
    ]
    usage = bridge.take_usage(tokens)
    # the runner's own calls (candidates), on the control listener
    told = []
    for i in range(CALLS):
        status, body, headers = _control_post(bridge.control_endpoint, f"candidate {i}")
        assert status == 200, body
        told.append(int(headers[REQUESTS_HEADER]))
    calls = fake.calls()

    assert [a["output_text"] for a in answers] == [f"answer: question {i}" for i in range(CALLS)]
    expected = (1, 0, per_call - 1)  # (calls, errors, retries) of each execution
    assert {t: (u["calls"], u["errors"], u["retries"]) for t, u in usage.items()} == dict.fromkeys(
        tokens, expected
    )
    assert told == [per_call] * CALLS
    reported = sum(u["calls"] + u["retries"] for u in usage.values()) + sum(told)
    assert len(calls) == reported == 2 * CALLS * per_call
    # each call was answered once: the answer received was never asked for again
    answered = collections.Counter(c["request"] for c in calls if c["answer"] == "ok")
    assert len(answered) == 2 * CALLS
    assert set(answered.values()) == {1}


def test_a_call_that_never_got_an_answer_counts_every_request_it_sent(
    make_bridge: MakeBridge, fake: FakeProvider, engine: str, tmp_path: Path
) -> None:
    """A call that fails after all its attempts still reports each of them: they were
    received (and a dropped one may have been billed)."""
    extra: dict[str, Any] = {}
    if engine == "python":
        extra["control_listen"] = f"unix:{tmp_path}/control.sock"
    bridge = make_bridge(base_url=f"{fake.base}/v1", timeout=1.0, retries=2, **extra)
    assert bridge.control_endpoint is not None
    fake.mode("drop", times=10)
    status, body, headers = _control_post(bridge.control_endpoint, "never answered")
    assert status == 502, body
    assert b"the server closed the connection" in body
    assert int(headers[REQUESTS_HEADER]) == 3 == len(fake.calls())


def _control_post(
    endpoint: str, text: str, model: str = "fake:cand"
) -> tuple[int, bytes, dict[str, str]]:
    """A candidate call as the runner makes it, with the answer's headers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(endpoint.removeprefix("unix:"))
    conn = http.client.HTTPConnection("localhost", timeout=60)
    conn.sock = sock
    body = json.dumps({"model": model, "input": text}).encode()
    conn.request("POST", "/v1/responses", body=body, headers={"X-Evalkube-Purpose": "candidate"})
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    return reply.status, data, dict(reply.getheaders())


def test_requests_that_never_left_are_not_counted(
    make_bridge: MakeBridge, engine: str, tmp_path: Path
) -> None:
    """Connecting failed on every attempt: the provider received nothing, so nothing is
    reported beyond the call itself."""
    closed = free_port()  # nothing listens; outside the ephemeral range: no self-connection
    extra: dict[str, Any] = {}
    if engine == "python":
        extra["control_listen"] = f"unix:{tmp_path}/control.sock"
    bridge = make_bridge(base_url=f"http://127.0.0.1:{closed}/v1", retries=2, **extra)
    assert bridge.control_endpoint is not None
    status, body, headers = _control_post(bridge.control_endpoint, "nobody there")
    assert status == 502, body
    assert b"Connection refused" in body
    assert headers[REQUESTS_HEADER] == "0"


def test_through_the_egress_gateway_a_dropped_request_counts_and_a_refused_one_does_not(
    tmp_path: Path, engine: str, fake: FakeProvider
) -> None:
    """In a pod, calls go through the egress gateway, which answers 502 both when it cannot
    reach the provider and when the provider dropped a request it had sent on: it says
    which (``X-Evalkube-Egress-Sent``), so the dropped one counts and the other does not."""
    closed = free_port()
    spec = {
        "models": ["fake:cand"],
        "judgeModel": "fake:judge",
        "generation": {"retries": 2},
        "providers": {
            "fake": {"baseURL": f"{fake.base}/v1", "apiKeyEnv": "FAKE_API_KEY"},
            "gone": {"baseURL": f"http://127.0.0.1:{closed}/v1", "apiKeyEnv": "FAKE_API_KEY"},
        },
    }
    (tmp_path / "run.json").write_text(json.dumps(spec))
    control, log = tmp_path / "control.sock", tmp_path / "proxy.log"
    with _running_gateway(tmp_path, "--deny-cidrs", "") as gateway:
        granted = [url_authority(fake.base), f"127.0.0.1:{closed}"]
        _write_grant(tmp_path / "grant", _grant(granted))
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "evalkube"), "proxy", "--engine", engine,
                 "--listen", f"unix:{tmp_path / 'model.sock'}", "--control-listen",
                 f"unix:{control}", "--run-spec", str(tmp_path / "run.json"),
                 "--egress-proxy", gateway["url"],
                 "--egress-grant-file", str(tmp_path / "grant")],
                env={**os.environ, "FAKE_API_KEY": "sk-faults-0123456789"},
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )  # fmt: skip
        try:
            _wait_for_socket(control, process, log)
            fake.mode("drop", times=2)
            status, body, headers = _control_post(f"unix:{control}", "dropped twice")
            assert status == 200, body
            assert headers[REQUESTS_HEADER] == "3"
            assert len(fake.calls()) == 3
            status, body, headers = _control_post(f"unix:{control}", "nowhere", "gone:cand")
            assert status == 502, body
            assert b"egress gateway refused: Bad Gateway" in body
            assert headers[REQUESTS_HEADER] == "0"
        finally:
            process.terminate()
            process.wait(10)
