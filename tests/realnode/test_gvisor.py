"""Evidence that graders run under gVisor on the real node: the kernel a grader sees.

gVisor's Sentry answers ``uname`` with its own release (``4.19.0-gvisor`` for the pinned
version) and ``/proc/version`` with its own text; a grader sharing the node's kernel would see
the host's release.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.cluster.realnode import RealNode
from tests.realnode.support import eval_run, wait_finished

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(900)]

GRADER = """
import os
HOST_RELEASE = {host!r}

def grade(sample, item):
    release = os.uname().release
    try:
        with open("/proc/version") as f:
            version = f.read()
    except OSError:
        version = ""
    gvisor = release.endswith("-gvisor") and HOST_RELEASE not in version
    return {{"scores": {{
        "host_kernel": 1.0 if release == HOST_RELEASE else 0.0,
        "gvisor_kernel": 1.0 if gvisor else 0.0,
    }}}}
"""


def test_the_grader_sees_gvisors_kernel_not_the_nodes(
    evalkube_on_node: RealNode, node_namespace: str
) -> None:
    node = evalkube_on_node
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "kernel", "namespace": node_namespace},
        "spec": {"tasks": [{
            "id": "kernel",
            "dataset": {"rows": [{"q": "a", "out": "a"}, {"q": "b", "out": "b"}]},
            "prompt": "{{ item.q }}",
            "target": "{{ item.q }}",
            "outputs": {"column": "out"},
            "grader": {"type": "python", "source": GRADER.format(host=os.uname().release),
                       "metricId": "gvisor_kernel"},
        }]},
    }  # fmt: skip
    node.apply(suite)
    node.apply(eval_run(node_namespace, "kernel", "kernel"))
    status = wait_finished(node, node_namespace, "kernel")["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    (result,) = status["results"]
    assert result["counts"]["valid"] == 2
    assert result["metrics"]["gvisor_kernel"] == 1.0
    assert result["metrics"]["host_kernel"] == 0.0
    pods = node.kubectl_json("get", "pods", "-n", node_namespace)["items"]
    for pod in pods:
        assert pod["spec"]["runtimeClassName"] == "gvisor"
        annotations = pod["metadata"].get("annotations", {})
        assert annotations.get("dev.gvisor.spec.mount.worker.share") == "pod"
