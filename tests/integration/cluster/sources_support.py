"""Playing the pods of a run with ``uri`` sources on the control plane (kwok runs none): the
prepare Job's runner and each unit's runner run as processes with the Pod's own flags, token
and store credentials; the paths a Pod mounts are moved under a temporary folder."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.cluster.plugin import COMPLETE_ANNOTATION, ControlPlane
from tests.integration.cluster.operator_support import EVALKUBE

from evalkube.controller import manifests

#: Flags of a Pod's runner that name what only a Pod has (sockets of sidecars, the gateway).
_POD_ONLY = ("--worker", "--bridge", "--bridge-control", "--datasets", "--policy-canary",
             "--ipv6", "--egress-proxy", "--egress-grant-file")  # fmt: skip


def _secret_value(cp: ControlPlane, namespace: str, ref: dict[str, str]) -> str:
    secret = cp.kubectl_json("get", "secret", ref["name"], "-n", namespace)
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def play_runner(
    cp: ControlPlane, namespace: str, job: dict[str, Any], tmp: Path, claims: Path
) -> subprocess.CompletedProcess[str]:
    """Run the Job's runner container as a process (its command, its Secrets' values), then
    complete its pod; the finished process."""
    pod = job["spec"]["template"]["spec"]
    runner = next(c for c in pod["containers"] if c["name"] == "runner")
    snapshot_cm = next(v for v in pod["volumes"] if v["name"] == "snapshot")["configMap"]["name"]
    data = cp.kubectl_json("get", "configmap", snapshot_cm, "-n", namespace)["data"]
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "snapshot.json").write_text(data["snapshot.json"])
    args, command = [], runner["command"][1:]
    skip = False
    for arg in command:
        if skip:
            skip = False
        elif arg in _POD_ONLY:
            skip = True
        elif arg == f"{manifests.SNAPSHOT_DIR}/snapshot.json":
            args.append(str(tmp / "snapshot.json"))
        else:
            args.append(arg)
    if args[0] == "unit":
        args += ["--sandbox", "process"]
    env = {**os.environ}
    for var in runner["env"]:
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        env[var["name"]] = _secret_value(cp, namespace, ref) if ref else var["value"]
    done = subprocess.run(
        [EVALKUBE, *args, "--pvc-root", str(claims)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    for item in cp.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"job-name={job['metadata']['name']}"
    )["items"]:
        cp.kubectl(
            "annotate", "pod", item["metadata"]["name"], "-n", namespace,
            f"{COMPLETE_ANNOTATION}={'true' if done.returncode == 0 else 'fail'}", "--overwrite",
        )  # fmt: skip
    return done
