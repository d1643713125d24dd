"""The run's NetworkPolicy, enforced by a real implementation (kube-router), against a hostile
grader in a real gVisor pod.

The grader tries three TCP targets: a listener on the node itself, a listener on an address
outside the cluster (a host in a network namespace of this test, reached through the node), and
a web server pod in another namespace. Each must be unreachable from the work-unit pod, while
a pod in the same namespace without the run's labels reaches all three (so the targets are
real and the blocking comes from the policy, not from a broken network).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.ctrlplane import wait_for
from tests.cluster.realnode import NODE_IP, RealNode
from tests.realnode.support import (
    OUTSIDE_IP,
    SERVE,
    eval_run,
    listening,
    outside_host,
    wait_finished,
)

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

NODE_PORT = 18080
OUTSIDE_PORT = 80

# Waits until kube-router has the pod in its ipsets (it applies policies a few seconds after a
# pod starts), then tries each target; a score of 1 means the grader got through.
HOSTILE = """
import socket, time
TARGETS = {targets!r}
time.sleep(20)

def reach(host, port):
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
            return 1.0 if s.recv(200) else 0.0
    except OSError:
        return 0.0

def grade(sample, item):
    name = item["target_name"]
    host, port = TARGETS[name]
    return {{"scores": {{"escaped": reach(host, port)}}}}
"""

PROBE = (
    "for t in {targets}; do "
    "if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${{t%:*}} ${{t#*:}} | grep -q ok; "
    'then echo "$t reachable"; else echo "$t BLOCKED"; fi; done'
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


def test_a_hostile_grader_reaches_neither_node_nor_outside_nor_other_namespaces(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    node = evalkube_on_node
    other = f"other-{uuid.uuid4().hex[:6]}"
    node.kubectl("create", "namespace", other)
    try:
        with outside_host(node, ["-c", SERVE, OUTSIDE_IP, str(OUTSIDE_PORT)]), node_listener(node):
            web_ip = web_pod(node, other)
            targets = {
                "node": (NODE_IP, NODE_PORT),
                "outside": (OUTSIDE_IP, OUTSIDE_PORT),
                "other_namespace": (web_ip, 8080),
            }
            # the control: a pod without the run's labels reaches every target
            probe = " ".join(f"{h}:{p}" for h, p in targets.values())
            node.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "control", "namespace": node_namespace},
                    "spec": {
                        "restartPolicy": "Never",
                        "runtimeClassName": "gvisor",
                        "containers": [
                            {
                                "name": "probe",
                                "image": "localhost/busybox:1.35",
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c", PROBE.format(targets=probe)],
                            }
                        ],
                    },
                }
            )
            suite = {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalSuite",
                "metadata": {"name": "hostile", "namespace": node_namespace},
                "spec": {
                    "tasks": [
                        {
                            "id": "escape",
                            "dataset": {"rows": [{"target_name": n, "out": n} for n in targets]},
                            "prompt": "{{ item.target_name }}",
                            "target": "{{ item.target_name }}",
                            "outputs": {"column": "out"},
                            "grader": {
                                "type": "python",
                                "source": HOSTILE.format(targets=targets),
                                "metricId": "escaped",
                            },
                        }
                    ]
                },
            }
            node.apply(suite)
            node.apply(eval_run(node_namespace, "hostile", "hostile"))
            status = wait_finished(node, node_namespace, "hostile")["status"]
            node.kubectl(
                "wait", "-n", node_namespace, "--for=jsonpath={.status.phase}=Succeeded",
                "pod/control", "--timeout=120s",
            )  # fmt: skip
            control = node.pod_log(node_namespace, "control", "probe")
    finally:
        node.kubectl("delete", "namespace", other, "--wait=false", check=False)
    for host, port in targets.values():
        assert f"{host}:{port} reachable" in control, control
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    (result,) = status["results"]
    assert result["counts"] == {"samples": 3, "valid": 3, "invalid": 0, "errored": 0}
    assert result["metrics"]["escaped"] == 0.0, json.dumps(status, indent=1)
