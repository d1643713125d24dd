"""What the real-node tests share: installing the chart, turning local suites into cluster
objects, waiting for an EvalRun, and saying why when it fails.

The chart is installed as a user would (``helm install``), with the images of .ci/images.sh
(imported into the node's containerd, ``pullPolicy: Never``), the results store on a
hostPath PersistentVolume of a ``no-provisioner`` StorageClass, and the node's ``gvisor``
RuntimeClass (handler ``runsc``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from evalkube.controller import names
from evalkube.store import ResultStore, SampleRecord, default_url
from tests.cluster.ctrlplane import wait_for
from tests.cluster.realnode import POD_CIDR, RealNode
from tests.support.s3_server import S3Server

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "evalkube"
OPERATOR_NS = "evalkube-system"
RELEASE = "evalkube"
STORAGE_CLASS = "realnode-local"
OUTSIDE_IP = "198.51.100.2"  # TEST-NET-2, inside this test's own namespace: routes nowhere else
OUTSIDE_GW = "198.51.100.1"
#: ``python -c SERVE HOST PORT``: answers every connection with an HTTP ``ok`` (a plain
#: socket: http.server's bind looks its address up in DNS, which hangs where none answers)
SERVE = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "s.listen(64)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    c.settimeout(3)\n"
    "    try:\n"
    "        c.recv(4096)\n"
    "        c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok')\n"
    "    except OSError:\n"
    "        pass\n"
    "    c.close()\n"
)


def install_chart(node: RealNode, *extra: str) -> None:
    """``helm install`` the chart into evalkube-system and wait for the operator to be Ready."""
    store = node.workdir / "pv" / "store"
    store.mkdir(parents=True, exist_ok=True)
    store.chmod(0o777)  # hostPath ignores fsGroup: the operator (UID 65532) writes here
    node.apply(
        [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "Immediate",
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "evalkube-store"},
                "spec": {
                    "storageClassName": STORAGE_CLASS,
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(store), "type": "Directory"},
                },
            },
        ]
    )
    out = node.helm(
        "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS, "--create-namespace",
        "--set", "image.repository=localhost/evalkube",
        "--set", f"image.tag={node.version}",
        "--set", "image.pullPolicy=Never",
        "--set", "sandboxImage.repository=localhost/evalkube-sandbox",
        "--set", f"sandboxImage.tag={node.version}",
        "--set", f"store.sqlite.storageClass={STORAGE_CLASS}",
        "--set", "store.sqlite.size=1Gi",
        "--set", "work.parallelism=3",
        *extra,
    )  # fmt: skip
    assert out.returncode == 0, f"helm install failed:\n{out.stdout}\n{out.stderr}"
    rollout = node.kubectl(
        "-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}", "--timeout=180s",
        check=False, timeout=200,
    )  # fmt: skip
    assert rollout.returncode == 0, f"operator not ready: {rollout.stderr}\n{diagnose(node)}"


def local_suite_to_cluster(suite_file: Path, namespace: str, name: str) -> list[dict[str, Any]]:
    """The EvalSuite and ConfigMaps a user writes for a local suite (docs/install.md §7):
    ``file`` references become ``configmap/key``, ``dataset.path`` a ``configMapRef``, and
    ``outputs.path`` a dataset column (a cluster cannot read local files)."""
    doc = yaml.safe_load(suite_file.read_text())
    base = suite_file.parent
    graders: dict[str, str] = {}
    data: dict[str, str] = {}
    for task in doc["spec"]["tasks"]:
        for kind in ("grader", "preprocess"):
            code = task.get(kind)
            if code and "file" in code:
                key = Path(code["file"]).name
                graders[key] = (base / code["file"]).read_text()
                code["file"] = f"{name}-graders/{key}"
        dataset = task["dataset"]
        if "path" in dataset:
            key = Path(dataset.pop("path")).name
            data[key] = (base / "data" / key).read_text()
            dataset["configMapRef"] = {"name": f"{name}-data", "key": key}
        outputs = task.get("outputs", {})
        if "path" in outputs:
            by_id = {
                row["id"]: row["output_text"]
                for row in map(json.loads, (base / outputs["path"]).read_text().splitlines())
            }
            for row in dataset["rows"]:
                row["output"] = by_id[row[dataset.get("idField", "id")]]
            task["outputs"] = {"column": "output"}
    meta = {"namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": f"{name}-graders", **meta}, "data": graders},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": f"{name}-data", **meta}, "data": data},
        {**doc, "metadata": {"name": name, **meta}},
    ]  # fmt: skip


def eval_run(namespace: str, name: str, suite: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suiteRef": {"name": suite}, "models": ["precomputed"], **spec},
    }


def wait_finished(node: RealNode, namespace: str, run: str, timeout: float = 600) -> Any:
    """The EvalRun once its phase is Succeeded or Failed (with diagnostics on a timeout)."""
    deadline = time.monotonic() + timeout
    obj: Any = {}
    while time.monotonic() < deadline:
        obj = node.kubectl_json("get", "evalrun", run, "-n", namespace)
        if obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return obj
        time.sleep(3)
    raise AssertionError(
        f"EvalRun {namespace}/{run} not finished after {timeout:.0f}s: "
        f"{json.dumps(obj.get('status'), indent=1)}\n{diagnose(node, namespace)}"
    )


def diagnose(node: RealNode, namespace: str | None = None) -> str:
    """Pods, events and the last operator log lines: what a person would look at first."""
    parts = []
    for args in (
        ("get", "pods", "-A", "-o", "wide"),
        ("get", "jobs", "-A"),
        ("get", "events", "-A", "--sort-by=.lastTimestamp"),
        ("-n", OPERATOR_NS, "logs", f"deploy/{RELEASE}", "--tail=60"),
        ("-n", OPERATOR_NS, "logs", f"deploy/{RELEASE}", "--tail=60", "--previous"),
    ):
        out = node.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{out.stdout[-6000:]}{out.stderr[-1000:]}")
    if namespace:
        pods = node.kubectl_json("get", "pods", "-n", namespace).get("items", [])
        for pod in pods[:3]:
            pname = pod["metadata"]["name"]
            for c in ("runner", "grader", "proxy"):
                log = node.pod_log(namespace, pname, c)
                parts.append(f"--- {pname}/{c}:\n{log[-2500:]}")
    return "\n".join(parts)


@contextlib.contextmanager
def outside_netns(node: RealNode) -> Iterator[str]:
    """A host outside the cluster: its own netns, linked to the node's by a veth pair, at
    OUTSIDE_IP (a documentation range no other network routes), every process in it killed at
    the end. Yields the netns name."""
    ns = f"{node.netns}-out"
    cmds = [
        ["ip", "netns", "add", ns],
        ["ip", "-n", node.netns, "link", "add", "out0", "type", "veth", "peer", "name", "out1"],
        ["ip", "-n", node.netns, "link", "set", "out1", "netns", ns],
        ["ip", "-n", node.netns, "addr", "add", f"{OUTSIDE_GW}/24", "dev", "out0"],
        ["ip", "-n", node.netns, "link", "set", "out0", "up"],
        ["ip", "-n", ns, "addr", "add", f"{OUTSIDE_IP}/24", "dev", "out1"],
        ["ip", "-n", ns, "link", "set", "out1", "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "route", "add", POD_CIDR, "via", OUTSIDE_GW],
    ]
    _remove_outside_host(node, ns)  # what an earlier test's host may have left behind
    try:
        for cmd in cmds:
            subprocess.run(cmd, check=True, capture_output=True)
        yield ns
    finally:
        _remove_outside_host(node, ns)


@contextlib.contextmanager
def outside_host(node: RealNode, python_args: list[str], wait: float = 30) -> Iterator[str]:
    """:func:`outside_netns` running ``python -c``/a script with ``python_args`` (the last
    one its port, listened on within ``wait`` seconds). Yields the netns name."""
    with outside_netns(node) as ns, served_in(ns, python_args, wait):
        yield ns


@contextlib.contextmanager
def served_in(ns: str, python_args: list[str], wait: float = 30) -> Iterator[None]:
    """A Python server (``python_args``, the last one its port) in the netns ``ns`` (an
    outside host another fixture made), listening within ``wait`` seconds, killed at the end."""
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{ns}", sys.executable, *python_args],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(
            lambda: listening(ns, f"{OUTSIDE_IP}:{python_args[-1]}"),
            timeout=wait,
            what=f"a server in {ns}",
        )
        yield
    finally:
        server.kill()
        server.wait(timeout=10)


def _remove_outside_host(node: RealNode, ns: str) -> None:
    """Kill every process in the outside netns (a server's children too: they keep the netns,
    and so the node's end of the veth pair, alive), delete it, and wait until ``out0`` is gone
    from the node's netns: the kernel frees a deleted netns asynchronously."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in pids.split():
        subprocess.run(["kill", "-KILL", pid], capture_output=True)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "-n", node.netns, "link", "del", "out0"], capture_output=True)
    wait_for(
        lambda: subprocess.run(
            ["ip", "-n", node.netns, "link", "show", "out0"], capture_output=True
        ).returncode != 0,
        timeout=30,
        what=f"out0 gone from {node.netns}",
    )  # fmt: skip


def listening(netns: str, address: str) -> bool:
    """Whether something listens on TCP ``address`` (``ip:port``) in ``netns``."""
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Htln"], capture_output=True, text=True
    ).stdout
    return any(line.split()[3] == address for line in out.splitlines() if len(line.split()) > 3)


def provider_calls(netns: str, port: int) -> list[dict[str, str]]:
    """What the fake provider (tests/realnode/fake_provider.py) in ``netns`` received."""
    out = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-c",
         "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen("
         f"'http://{OUTSIDE_IP}:{port}/_calls').read().decode())"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    calls: list[dict[str, str]] = json.loads(out.stdout)
    return calls


def stored_samples(node: RealNode, run: dict[str, Any]) -> list[SampleRecord]:
    """Every sample of an EvalRun, read from the operator's SQLite store on its hostPath volume."""
    meta = run["metadata"]
    store = ResultStore.open(default_url(str(node.workdir / "pv" / "store" / "results.db")))
    try:
        return list(store.iter_samples(names.run_id(meta["namespace"], meta["name"], meta["uid"])))
    finally:
        store.close()


def s3_secret_and_storage(node: RealNode, namespace: str, s3: S3Server) -> dict[str, Any]:
    node.kubectl(
        "create", "secret", "generic", "eval-data", "-n", namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
    )  # fmt: skip
    return {
        "s3": {
            "endpointURL": s3.endpoint_url,
            "accessKeyIDSecretRef": {"name": "eval-data", "key": "AWS_ACCESS_KEY_ID"},
            "secretAccessKeySecretRef": {"name": "eval-data", "key": "AWS_SECRET_ACCESS_KEY"},
        }
    }
