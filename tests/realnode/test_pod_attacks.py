"""Hostile graders in gVisor work pods on the real node, each attacking one wall the earlier
tests did not try, next to an honest task that must keep its exact scores:

- ``ipv6``: every TCP port the node listens on over IPv6, dialed at the node's link-local
  address (kubelet, kube-proxy, the API server), and any IPv6 route at all. A gVisor pod in the
  same namespace without the run's labels and without the sysctl reaches those ports (so they
  are real); the run's pods have no IPv6 (``work.ipv6=disable``).
- ``takeover`` (``isolation: sample``): a sample binds a socket of its own where the worker's
  was and kills its worker, hoping to answer the samples after it.
- ``flood``: samples returning 5,000 score names each (80,000 in all); ``many``: 2,400
  distinct names in all, 60 a sample. The status stays bounded, Prometheus exports only the
  declared metric.
- ``logs``: 100 MB written to file descriptor 2; the node keeps about the budget (1 MiB).
- ``memory``: three processes holding 1.3 GiB in all in a 1 GiB grader; ``procs``: 200
  processes. The sample fails "out of memory" and the runner and proxy live; at most 64
  processes start.
- ``oracle``: a forged token at the ingest port, for this run and for a run that does not exist.

Each check on its own fails on the code before these defences (the issue's findings).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from evalkube import limits
from tests.cluster.realnode import RealNode
from tests.realnode.support import (
    OPERATOR_NS,
    RELEASE,
    diagnose,
    eval_run,
    stored_samples,
    wait_finished,
)

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]

HONEST = "def grade(sample, item):\n    return float(sample['output_text'] == item['answer'])\n"

IPV6 = """
import socket
TARGETS = {targets!r}

def routes():
    found = []
    for index, name in socket.if_nameindex():
        if name == "lo":
            continue
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                s.connect(("ff02::1", 9, 0, index))
                found.append(name)
        except OSError:
            pass
    return found

def grade(sample, item):
    reached = []
    for host, port in TARGETS:
        try:
            with socket.create_connection((host, port), timeout=3):
                reached.append(f"[{{host}}]:{{port}}")
        except OSError:
            pass
    found = routes()
    return {{"scores": {{"escaped": float(bool(reached or found))}},
            "judge": {{"reached": reached, "routes": found}}}}
"""

TAKEOVER = """
import os, socket
PATH = {path!r}

def grade(sample, item):
    if item["answer"] == "attack":
        try:
            os.unlink(PATH)
        except OSError:
            pass
        try:
            server = socket.socket(socket.AF_UNIX)
            server.bind(PATH)
            server.listen(8)
            if os.fork() == 0:
                os.setsid()
                while True:
                    conn, _ = server.accept()
                    conn.sendall(b'{{"t": "hello"}}\\n')
        except OSError:
            pass
        os.kill(os.getppid(), 9)  # the worker this sample was forked from
        os.kill(os.getpid(), 9)
    return float(sample["output_text"] == item["answer"])
"""

PLANT = """
import os, socket
def grade(sample, item):
    planted = 0.0
    try:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(os.path.join({folder!r}, "planted.sock"))
            planted = 1.0
    except OSError:
        pass
    return {{"scores": {{"planted": planted}}}}
"""

FLOOD = """
def grade(sample, item):
    base = int(item["answer"]) * 5000
    return {"scores": {f"flood_{base + n}": 1.0 for n in range(5000)}}
"""

MANY = """
def grade(sample, item):
    base = int(item["answer"]) * 60
    return {"scores": {"score": 1.0, **{f"many_{base + n}": 1.0 for n in range(60)}}}
"""

LOGS = """
import os
def grade(sample, item):
    chunk = b"x" * 65536
    for _ in range(1600):
        os.write(2, chunk)
    return 1.0
"""

MEMORY = """
import os, time
def grade(sample, item):
    if item["answer"] == "hog":
        for _ in range(3):
            if os.fork() == 0:
                block = bytearray(450 * 1024 * 1024)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(120)
        time.sleep(120)
    return 1.0
"""

PROCS = """
import os, time
def grade(sample, item):
    started = 0
    for _ in range(200):
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            started += 1
        except OSError:
            break
    return {"scores": {"started": float(started)}}
"""

ORACLE = """
import hashlib, socket
HOST, PORT, PATHS = {host!r}, {port!r}, {paths!r}

def post(path):
    body = b'{{"samples": []}}'
    request = (f"POST {{path}} HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer "
               "forged-token-0123456789abcdef\\r\\nContent-Type: application/json\\r\\n"
               f"Connection: close\\r\\nContent-Length: {{len(body)}}\\r\\n\\r\\n").encode() + body
    with socket.create_connection((HOST, PORT), timeout=5) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    head, _, payload = answer.partition(b"\\r\\n\\r\\n")
    return head.split(b"\\r\\n", 1)[0].decode(), hashlib.sha256(payload).hexdigest()

def grade(sample, item):
    answers = [post(path) for path in PATHS]
    return {{"scores": {{"alike": float(len(set(answers)) == 1)}},
            "judge": {{"answers": answers}}}}
"""


def task(task_id: str, source: str, answers: list[str], **grader: Any) -> dict[str, Any]:
    rows = [{"id": f"{task_id}-{i}", "answer": a, "out": a} for i, a in enumerate(answers)]
    return {
        "id": task_id,
        "dataset": {"rows": rows},
        "prompt": "{{ item.answer }}",
        "target": "{{ item.answer }}",
        "outputs": {"column": "out"},
        "grader": {"type": "python", "source": source, "timeoutSeconds": 60, **grader},
    }


def start_run(node: RealNode, namespace: str, name: str, tasks: list[dict[str, Any]]) -> None:
    """An EvalSuite of ``tasks`` and an EvalRun of it, both called ``name``."""
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tasks": tasks},
    }
    node.apply(suite)
    node.apply(eval_run(namespace, name, name))


def node_ipv6_targets(node: RealNode) -> list[tuple[str, int]]:
    """``(fe80::...%eth0, port)`` for every TCP port the node listens on over IPv6, at the
    bridge's link-local address (what a pod's interface reaches on its own link)."""
    addr = subprocess.run(
        ["ip", "-n", node.netns, "-6", "-j", "addr", "show", "dev", "cni0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    link_local = next(
        a["local"]
        for link in json.loads(addr)
        for a in link.get("addr_info", [])
        if a.get("scope") == "link"
    )
    listening = subprocess.run(
        ["ip", "netns", "exec", node.netns, "ss", "-Htln6"], capture_output=True, text=True
    ).stdout
    ports = sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in listening.splitlines()})
    assert ports, "the node listens on no IPv6 port: nothing to attack"
    return [(f"{link_local}%eth0", port) for port in ports]


def control_pod(namespace: str, image: str, targets: list[tuple[str, int]]) -> dict[str, Any]:
    """A gVisor pod without the run's labels or sysctl, dialing the same IPv6 targets."""
    probe = (
        "import socket\n"
        f"for host, port in {targets!r}:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=3).close()\n"
        "        print(f'reached [{host}]:{port}', flush=True)\n"
        "    except OSError as exc:\n"
        "        print(f'blocked [{host}]:{port} {exc}', flush=True)\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "control6", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "runtimeClassName": "gvisor",
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", probe],
                }
            ],
        },
    }


def log_bytes(node: RealNode, namespace: str, container: str) -> int:
    """Bytes the node holds in the logs of ``container`` of the namespace's pods."""
    logs = Path(node.workdir) / "pod-logs"
    return sum(
        f.stat().st_size
        for d in logs.glob(f"{namespace}_*")
        for f in (d / container).glob("*")
        if f.is_file()
    )


def score_series(node: RealNode, suite: str) -> list[str]:
    """The metric label of every ``evalkube_score`` series of ``suite`` the operator exports."""
    text = node.kubectl(
        "get", "--raw",
        f"/api/v1/namespaces/{OPERATOR_NS}/services/{RELEASE}:8081/proxy/metrics",
    ).stdout  # fmt: skip
    return [
        line.split('metric="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("evalkube_score{") and f'suite="{suite}"' in line
    ]


def test_work_pods_hold_under_attack_while_the_honest_task_keeps_its_scores(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    node = evalkube_on_node
    targets = node_ipv6_targets(node)
    operator = node.kubectl_json("get", "service", RELEASE, "-n", OPERATOR_NS)["spec"]["clusterIP"]
    run_path = f"/api/v1/namespaces/{node_namespace}/evalruns/attacks/samples"
    absent_path = f"/api/v1/namespaces/{node_namespace}/evalruns/absent-run/samples"
    from evalkube.controller import manifests

    tasks = [
        task("honest", HONEST, ["a", "b", "c", "d"]),
        task("ipv6", IPV6.format(targets=targets), ["x"], metricId="escaped"),
        task(
            "takeover",
            TAKEOVER.format(path=manifests.WORKER_SOCKET),
            ["right", "attack", "wrong", "right", "wrong"],
            isolation="sample",
        ),
        task("plant", PLANT.format(folder=manifests.WORKER_DIR), ["x"], metricId="planted"),
        task("flood", FLOOD, [str(i) for i in range(16)]),
        task("many", MANY, [str(i) for i in range(40)]) | {"metrics": ["score"]},
        task("logs", LOGS, ["x"]),
        task("memory", MEMORY, ["ok", "hog", "ok"]),
        task("procs", PROCS, ["x"], metricId="started"),
        task(
            "oracle",
            ORACLE.format(host=operator, port=8080, paths=[run_path, absent_path]),
            ["x"],
            metricId="alike",
        ),
    ]
    # the takeover's "right"/"wrong" rows are graded by exact match on purpose
    tasks[2]["outputs"] = {"column": "out"}
    for row in tasks[2]["dataset"]["rows"]:
        row["out"] = {"right": "right", "attack": "attack", "wrong": "nope"}[row["answer"]]
    start_run(node, node_namespace, "attacks", tasks)
    image = f"localhost/evalkube-sandbox:{node.version}"
    node.apply(control_pod(node_namespace, image, targets))
    run = wait_finished(node, node_namespace, "attacks", timeout=900)
    node.kubectl(
            "wait", "-n", node_namespace, "--for=jsonpath={.status.phase}=Succeeded",
            "pod/control6", "--timeout=180s",
        )  # fmt: skip
    control = node.pod_log(node_namespace, "control6", "probe")
    status = run["status"]
    failures = {
        s.sample_id: (s.task_id, s.status, s.error)
        for s in stored_samples(node, run)
        if s.status != "valid"
    }
    evidence = (
        json.dumps(failures, indent=1, default=str)[:20_000]
        + json.dumps(status, indent=1)[:20_000]
        + diagnose(node, node_namespace)[:20_000]
    )
    assert status["phase"] == "Succeeded", evidence
    results = {r["task"]: r for r in status["results"]}

    # the honest neighbour: exact scores, every sample valid
    assert results["honest"]["metrics"] == {"score": 1.0}, evidence
    assert results["honest"]["counts"]["valid"] == 4, evidence

    # IPv6: the targets are real (a pod without the sysctl reaches them), the run's pods
    # have no IPv6 at all
    assert "reached [" in control, control
    assert results["ipv6"]["metrics"]["escaped"] == 0.0, evidence
    assert results["ipv6"]["counts"]["valid"] == 1, evidence

    # the worker channel: the samples after the attack keep their honest verdicts
    takeover = results["takeover"]
    assert takeover["counts"] == {"samples": 5, "valid": 4, "invalid": 1, "errored": 0}, evidence
    assert takeover["metrics"]["score"] == pytest.approx(2 / 5), evidence
    assert results["plant"]["metrics"] == {"planted": 0.0}, evidence  # the folder is read-only

    # score names: flooding samples are invalid, the status is bounded, one series
    assert results["flood"]["counts"]["invalid"] == 16, evidence
    many = results["many"]
    assert many["metrics"]["score"] == 1.0, evidence
    assert len(many["metrics"]) == 64, evidence
    assert many["metricsOmitted"] >= limits.METRIC_NAMES_TRACKED - 64, evidence
    assert len(json.dumps(status)) < 64_000, len(json.dumps(status))
    series = score_series(node, "attacks")
    assert sorted(set(series)) == ["alike", "escaped", "planted", "score", "started"], series

    # logs: 100 MB written, about the budget kept on the node
    assert results["logs"]["counts"]["valid"] == 1, evidence
    assert log_bytes(node, node_namespace, "grader") < 2 * 2**20

    # memory and processes: out of memory named, the unit not retried, at most 64 processes
    memory = results["memory"]
    assert memory["counts"] == {"samples": 3, "valid": 2, "invalid": 1, "errored": 0}, evidence
    [hog] = [s for s in stored_samples(node, run) if s.task_id == "memory" and s.status != "valid"]
    assert hog.error is not None
    assert "out of memory" in hog.error["message"], hog.error
    jobs = node.kubectl_json("get", "jobs", "-n", node_namespace)["items"]
    assert all(not (j.get("status") or {}).get("failed") for j in jobs), evidence
    assert 0 < results["procs"]["metrics"]["started"] <= 64, evidence

    # the ingest port answers alike for this run and for none, without a valid token
    assert results["oracle"]["metrics"]["alike"] == 1.0, evidence


REGICIDE = """
import os, signal, time
def grade(sample, item):
    if item["answer"] == "x":
        os.kill(1, signal.SIGKILL)  # the grader container's supervisor
        time.sleep(30)
    return 1.0
"""


def test_a_grader_that_kills_its_supervisor_fails_only_its_own_unit(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    """The grader container's PID 1 can be killed from inside (gVisor does not shield a
    namespace's init), but the whole container dies with it (the kubelet starts a new one,
    whose supervisor finds no runner listening) and the runner, which never reconnects, cannot
    grade the unit's other samples: the unit fails, no sample of it is valid, and the other
    tasks of the run keep their exact scores."""
    node = evalkube_on_node
    tasks = [
        task("honest", HONEST, ["a", "b", "c"]),
        task("regicide", REGICIDE, ["x", "y", "z"]),
    ]
    start_run(node, node_namespace, "regicide", tasks)
    run = wait_finished(node, node_namespace, "regicide", timeout=900)
    status = run["status"]
    evidence = json.dumps(status, indent=1) + diagnose(node, node_namespace)[:20_000]
    assert status["phase"] == "Failed", evidence
    failed = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert failed["reason"] == "UnitsFailed", evidence
    assert "regicide" in failed["message"], evidence
    results = {r["task"]: r for r in status["results"]}
    assert results["honest"]["metrics"] == {"score": 1.0}, evidence
    assert results["honest"]["counts"]["valid"] == 3, evidence
    stored = [s for s in stored_samples(node, run) if s.task_id == "regicide"]
    assert all(s.status != "valid" for s in stored), stored
