"""A hostile grader in a real gVisor work pod, under the run's NetworkPolicy enforced by a real
implementation (kube-router), next to an honest model-backed grader in the same run.

The hostile grader (a task without model access) tries, from inside its sandbox:

- the network: a listener on the node itself, the fake provider on a host outside the cluster,
  a web server pod in another namespace (directly and through a NodePort Service on the node's
  address), the cluster DNS (UDP and TCP), the Kubernetes API Service, and the operator's
  samples API (its pod and its Service);
- the two destinations its pod's policy does allow, without the credentials only the proxy and
  runner containers hold: the egress gateway (a ``CONNECT`` and an absolute-form request with no
  grant) and the operator's ingest port (a forged sample without the run's token);
- the pod itself: the other containers' processes, the proxy's control and bridge sockets, the
  egress grant, the provider key and a service-account token.

A score of 1 on ``escaped`` means it got through. A pod in the same namespace without the run's
labels reaches every network target (so the targets are real and the blocking comes from the
policy), and the gateway and ingest answer the grader (they were reached and refused).

The honest grader, with ``maxModelCalls: 2``, makes three judge calls per sample through the
proxy sidecar and the egress gateway to the fake provider: two are answered, the third is
refused as ``budget_exhausted``; the EvalRun's status counts 2 judge calls per sample, and the
provider saw exactly those.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalkube.controller import manifests
from tests.cluster.ctrlplane import wait_for
from tests.cluster.realnode import DNS_IP, NODE_IP, RealNode
from tests.realnode.support import (
    OPERATOR_NS,
    OUTSIDE_IP,
    RELEASE,
    SERVE,
    eval_run,
    listening,
    outside_host,
    provider_calls,
    stored_samples,
    wait_finished,
)

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

NODE_PORT = 18080
PROVIDER_PORT = 8443
KEY = "sk-realnode-hostile-0123456789"

# Attacks at once: kube-router programs a pod's policy a few seconds after the pod starts, and
# the runner gives the grader its code only once the policy is enforced (engine/policy_gate.py).
# ``answered``: a refusing HTTP server answered.
HOSTILE = """
import os, socket, struct
TARGETS = {targets!r}
PATHS = {paths!r}

def tcp(host, port, payload=b"GET / HTTP/1.0\\r\\n\\r\\n"):
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(payload)
            return s.recv(200)
    except OSError:
        return b""

def dns_query():
    labels = b"kubernetes.default.svc.cluster.local".split(b".")
    name = b"".join(bytes([len(p)]) + p for p in labels) + b"\\0"
    header = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    return header + name + struct.pack(">HH", 1, 1)

def dns_udp(server):
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(3)
            s.sendto(dns_query(), (server, 53))
            return s.recv(512)
    except OSError:
        return b""

def unix(path):
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(3)
            s.connect(path)
            return b"connected"
    except OSError:
        return b""

def readable(path):
    found = b""
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                with open(os.path.join(root, f), "rb") as fh:
                    found += fh.read(64) or b"empty"
            except OSError:
                pass
    return found

def processes():
    # the runner (`evalkube unit`) and the proxy (`evalkube proxy`) of the same pod
    seen = b""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                    argv = f.read().split(b"\\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"evalkube") or b"evalkube-proxy" in argv[0]:
                seen += b" ".join(argv)
    return seen

def http_status(answer):
    line = answer.split(b"\\r\\n", 1)[0].split()
    if len(line) > 1 and line[0].startswith(b"HTTP/") and line[1].isdigit():
        return int(line[1])
    return 0

def grade(sample, item):
    name = item["target_name"]
    kind, *args = TARGETS[name] if name in TARGETS else PATHS[name]
    if kind == "tcp":
        got = tcp(args[0], args[1])
    elif kind == "http":
        got = tcp(args[0], args[1], args[2].encode())
        status = http_status(got)
        return {{"scores": {{"escaped": 1.0 if 200 <= status < 300 else 0.0,
                            "answered": 1.0 if status else 0.0}},
                "judge": {{"target": name, "answer": got.decode("latin-1")}}}}
    elif kind == "dns":
        got = dns_udp(args[0])
    elif kind == "dns_tcp":
        query = dns_query()
        got = tcp(args[0], 53, struct.pack(">H", len(query)) + query)
    elif kind == "resolver":
        try:
            got = repr(socket.getaddrinfo(args[0], 443)).encode()
        except OSError:
            got = b""
    elif kind == "unix":
        got = unix(args[0])
    elif kind == "files":
        got = readable(args[0])
    else:
        got = processes()
    return {{"scores": {{"escaped": 1.0 if got else 0.0}},
            "judge": {{"target": name, "got": got.decode("latin-1")[:200]}}}}
"""

HONEST = """
from evalkube_sandbox.ctx import ModelCallError

def grade(sample, item, ctx):
    verdicts = []
    for _ in range(2):
        response = ctx.responses_create(model="auto", input=f"Prediction: {sample['output_text']}")
        verdicts.append(response["output_text"])
    try:
        ctx.responses_create(model="auto", input="a third call, past the budget")
        refused = 0.0
    except ModelCallError as exc:
        refused = 1.0 if exc.kind == "budget_exhausted" else 0.0
    correct = all('"correct"' in v for v in verdicts)
    return {"scores": {"judged": 1.0 if correct else 0.0, "third_call_refused": refused}}
"""

# Waits as the grader does: kube-router admits a new pod to the operator's policy (every pod may
# reach its API port) only once it has the pod's address in its ipsets.
PROBE = (
    "sleep 20; for t in {targets}; do r=BLOCKED; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do "
    'n=$(printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 3 ${{t%:*}} ${{t#*:}} | wc -c); '
    'if [ "$n" -gt 0 ]; then r=reachable; break; fi; sleep 5; done; echo "$t $r"; done; '
    "nslookup kubernetes.default.svc.cluster.local {dns} && echo 'dns reachable'"
)


@contextlib.contextmanager
def node_listener(node: RealNode) -> Iterator[None]:
    """An HTTP listener on the node's own address (a process in the node's netns)."""
    server = subprocess.Popen(
        node.in_netns(sys.executable, "-c", SERVE, NODE_IP, str(NODE_PORT)),
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: listening(node.netns, f"{NODE_IP}:{NODE_PORT}"),
            timeout=30,
            what="the node listener",
        )
        yield
    finally:
        server.kill()
        server.wait(timeout=10)


def web_pod(node: RealNode, namespace: str) -> str:
    node.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": namespace, "labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "httpd",
                        "image": "localhost/busybox:1.35",
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "echo ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp",
                        ],
                    }
                ]
            },
        }
    )
    node.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/web", "--timeout=120s")
    ip: str = node.kubectl_json("get", "pod", "web", "-n", namespace)["status"]["podIP"]
    return ip


def node_port(node: RealNode, namespace: str) -> int:
    """A NodePort Service in front of the web pod: its port on the node's own address (in
    the NodePort range, which kube-router exempts for the node's own listeners only)."""
    node.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "web"},
                "ports": [{"port": 8080, "targetPort": 8080, "protocol": "TCP"}],
            },
        }
    )
    service = node.kubectl_json("get", "service", "web", "-n", namespace)
    port: int = service["spec"]["ports"][0]["nodePort"]
    return port


def control_pod(namespace: str, command: str) -> dict[str, Any]:
    """A gVisor pod in the run's namespace without the run's labels: no policy selects it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "control", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "runtimeClassName": "gvisor",
            "containers": [
                {
                    "name": "probe",
                    "image": "localhost/busybox:1.35",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                }
            ],
        },
    }


def cluster_ip(node: RealNode, namespace: str, service: str) -> str:
    ip: str = node.kubectl_json("get", "service", service, "-n", namespace)["spec"]["clusterIP"]
    return ip


def network_state(node: RealNode, destination: str) -> str:
    """The node's iptables, with each rule's packet counters (which rule let a connection
    through), the conntrack entries to ``destination`` and the pods' addresses: read when a
    probe got through, as evidence for docs/security.md's Known gap."""
    commands = [
        ["iptables-legacy-save", "-c"],
        ["iptables-nft-save", "-c"],
        ["conntrack", "-L", "-p", "tcp", "--orig-dst", destination],
    ]
    pods = node.kubectl("get", "pods", "-A", "-o", "wide", check=False)
    found = [f"$ kubectl get pods -A -o wide\n{pods.stdout}{pods.stderr}"]
    for argv in commands:
        try:
            done = subprocess.run(
                node.in_netns(*argv), capture_output=True, text=True, timeout=60, check=False
            )
            found.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            found.append(f"$ {' '.join(argv)}: {exc}")
    return "\n".join(found)


def operator_pod_ip(node: RealNode) -> str:
    pods = node.kubectl_json(
        "get", "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/component=operator"
    )["items"]
    ip: str = next(p["status"]["podIP"] for p in pods if p["status"].get("phase") == "Running")
    return ip


def suite(namespace: str, targets: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
    def rows(names: list[str]) -> list[dict[str, str]]:
        return [{"target_name": n, "out": n} for n in names]

    hostile = HOSTILE.format(targets=targets, paths=paths)
    network = [n for n, t in targets.items() if t[0] != "http"]
    refused = [n for n, t in targets.items() if t[0] == "http"]
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "hostile", "namespace": namespace},
        "spec": {
            "tasks": [
                {
                    "id": task_id,
                    "dataset": {"rows": rows(names)},
                    "prompt": "{{ item.target_name }}",
                    "target": "{{ item.target_name }}",
                    "outputs": {"column": "out"},
                    "grader": {"type": "python", "source": hostile, "metricId": "escaped"},
                }
                for task_id, names in (
                    ("network", network),
                    ("refused", refused),
                    ("pod", list(paths)),
                )
            ]
            + [
                {
                    "id": "honest",
                    "dataset": {"rows": [{"q": "alpha", "out": "a"}, {"q": "beta", "out": "b"}]},
                    "prompt": "{{ item.q }}",
                    "target": "{{ item.q }}",
                    "outputs": {"column": "out"},
                    "grader": {
                        "type": "python",
                        "contract": "model_backed",
                        "source": HONEST,
                        "metricId": "judged",
                        "maxModelCalls": 2,
                    },
                }
            ]
        },
    }


def test_a_hostile_grader_is_contained_while_its_honest_neighbour_calls_models(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    node = evalkube_on_node
    other = f"other-{uuid.uuid4().hex[:6]}"
    node.kubectl("create", "namespace", other)
    script = str(Path(__file__).with_name("fake_provider.py"))
    operator_svc = cluster_ip(node, OPERATOR_NS, RELEASE)
    gateway_svc = cluster_ip(node, OPERATOR_NS, f"{RELEASE}-egress")
    api_port, ingest_port, gateway_port = 8081, 8080, 3128
    ingest_path = f"/api/v1/namespaces/{node_namespace}/evalruns/hostile/samples"
    forged = '{"samples": [{"sample_id": "forged", "status": "valid", "scores": {"x": 1}}]}'
    try:
        with (
            outside_host(node, [script, OUTSIDE_IP, str(PROVIDER_PORT)]) as outside_ns,
            node_listener(node),
        ):
            web_ip = web_pod(node, other)
            reachable = {
                "node": ("tcp", NODE_IP, NODE_PORT),
                "outside": ("tcp", OUTSIDE_IP, PROVIDER_PORT),
                "other_namespace": ("tcp", web_ip, 8080),
                "node_port": ("tcp", NODE_IP, node_port(node, other)),
                "apiserver": ("tcp", cluster_ip(node, "default", "kubernetes"), 443),
                "samples_api_pod": ("tcp", operator_pod_ip(node), api_port),
                "samples_api_service": ("tcp", operator_svc, api_port),
            }
            targets: dict[str, Any] = {
                    **reachable,
                    "dns_udp": ("dns", DNS_IP),
                    "dns_tcp": ("dns_tcp", DNS_IP),
                    "resolver": ("resolver", "kubernetes.default.svc.cluster.local"),
                    "gateway_connect": (
                        "http", gateway_svc, gateway_port,
                        f"CONNECT {OUTSIDE_IP}:{PROVIDER_PORT} HTTP/1.1\r\n"
                        f"Host: {OUTSIDE_IP}:{PROVIDER_PORT}\r\n\r\n",
                    ),
                    "gateway_absolute": (
                        "http", gateway_svc, gateway_port,
                        f"GET http://{OUTSIDE_IP}:{PROVIDER_PORT}/_calls HTTP/1.1\r\n"
                        f"Host: {OUTSIDE_IP}:{PROVIDER_PORT}\r\nConnection: close\r\n\r\n",
                    ),
                    "ingest_forged": (
                        "http", operator_svc, ingest_port,
                        f"POST {ingest_path} HTTP/1.1\r\nHost: x\r\n"
                        "Content-Type: application/json\r\nConnection: close\r\n"
                        f"Content-Length: {len(forged)}\r\n\r\n{forged}",
                    ),
                }  # fmt: skip
            paths = {
                "processes": ("processes",),
                "control_socket": ("unix", manifests.CONTROL_SOCKET),
                "bridge_socket": ("unix", manifests.BRIDGE_SOCKET),
                "egress_grant": ("files", manifests.EGRESS_GRANT_DIR),
                "provider_key": ("files", manifests.PROVIDER_KEYS_DIR),
                "service_account": ("files", "/var/run/secrets/kubernetes.io"),
            }
            probe = " ".join(f"{t[1]}:{t[2]}" for t in reachable.values())
            node.apply(control_pod(node_namespace, PROBE.format(targets=probe, dns=DNS_IP)))
            node.kubectl(
                    "create", "secret", "generic", "provider", "-n", node_namespace,
                    f"--from-literal=api-key={KEY}",
                )  # fmt: skip
            node.apply(suite(node_namespace, targets, paths))
            providers = {
                "fake": {
                    "baseURL": f"http://{OUTSIDE_IP}:{PROVIDER_PORT}/v1",
                    "credentialsSecretRef": {"name": "provider", "key": "api-key"},
                }
            }
            node.apply(
                    eval_run(
                        node_namespace, "hostile", "hostile",
                        judgeModel="fake:judge", providers=providers,
                    )
                )  # fmt: skip
            run = wait_finished(node, node_namespace, "hostile")
            node.kubectl(
                    "wait", "-n", node_namespace, "--for=jsonpath={.status.phase}=Succeeded",
                    "pod/control", "--timeout=120s",
                )  # fmt: skip
            control = node.pod_log(node_namespace, "control", "probe")
            calls = provider_calls(outside_ns, PROVIDER_PORT)
    finally:
        node.kubectl("delete", "namespace", other, "--wait=false", check=False)
    status = run["status"]
    runner_logs = [
        node.pod_log(node_namespace, pod["metadata"]["name"], "runner")
        for pod in node.kubectl_json("get", "pods", "-n", node_namespace)["items"]
        if pod["metadata"]["name"] != "control"
    ]
    samples = {
        s.sample_id: {"task": s.task_id, "scores": s.scores, "judge": s.judge, "error": s.error}
        for s in stored_samples(node, run)
    }
    evidence = json.dumps({"status": status, "samples": samples, "runners": runner_logs}, indent=1)
    # every unit waited for its policy before the grader ran (the wait is in its log)
    assert runner_logs, evidence
    assert all("NetworkPolicy enforced" in log for log in runner_logs), evidence
    for _kind, host, port in reachable.values():
        assert f"{host}:{port} reachable" in control, control
    assert "dns reachable" in control, control
    assert status["phase"] == "Succeeded", evidence
    results = {r["task"]: r for r in status["results"]}
    escaped = sorted(
        f"{s['task']}/{judge.get('target')}: {judge.get('got') or judge.get('answer')!r}"
        for s in samples.values()
        if (s["scores"] or {}).get("escaped") and isinstance(judge := s["judge"], dict)
    )
    if escaped:
        evidence += "\n" + network_state(node, reachable["apiserver"][1])
    assert not escaped, f"got through: {escaped}\n{evidence}"
    for task_id, rows in (("network", 10), ("refused", 3), ("pod", 6)):
        assert results[task_id]["counts"] == {
            "samples": rows, "valid": rows, "invalid": 0, "errored": 0
        }, evidence  # fmt: skip
        assert results[task_id]["metrics"]["escaped"] == 0.0, evidence
    # the gateway and ingest were reached (their policy allows the pod) and refused
    assert results["refused"]["metrics"]["answered"] == 1.0, evidence
    honest = results["honest"]
    assert honest["counts"]["valid"] == 2, evidence
    assert honest["metrics"]["judged"] == 1.0, evidence
    assert honest["metrics"]["third_call_refused"] == 1.0, evidence
    assert honest["modelCalls"].get("judge") == 4, evidence
    assert not honest["modelCalls"].get("candidate"), evidence
    assert sorted(c["model"] for c in calls) == ["judge"] * 4, calls
    assert {c["authorization"] for c in calls} == {f"Bearer {KEY}"}
