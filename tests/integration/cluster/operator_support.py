"""What the operator's cluster tests share: suites, the operator runner, playing a unit.

kwok holds each work-unit Pod at Running; :func:`_play_unit` does what the Pod would (runs
the unit's runner command with the Pod's snapshot and token), then lets the Pod complete.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.cluster.plugin import COMPLETE_ANNOTATION, HOLD_ANNOTATION, ControlPlane
from tests.support.ports import accepts, free_port

from evalkube.controller import names
from evalkube.models import EvalRunStatus

ROOT = Path(__file__).resolve().parents[3]
EVALKUBE = str(Path(sys.executable).parent / "evalkube")

EXACT = (ROOT / "examples/recipes/graders/exact_match.py").read_text()
MACRO_F1 = (ROOT / "examples/recipes/graders/macro_f1.py").read_text()
SENTIMENT = [
    {"text": "Great support experience.", "label": "positive", "output": "positive"},
    {"text": "Terrible wait times.", "label": "negative", "output": "negative"},
    {"text": "It was fine.", "label": "neutral", "output": "positive"},
    {"text": "Loved it!", "label": "positive", "output": "positive"},
    {"text": "Never again.", "label": "negative", "output": "neutral"},
    {"text": "Okay I guess.", "label": "neutral", "output": "neutral"},
]


def _free_port() -> int:
    return free_port()


def suite(namespace: str) -> dict[str, Any]:
    qa_rows = [{"q": f"{i}?", "a": str(i), "out": str(i) if i % 5 else "wrong"} for i in range(25)]
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "qa", "namespace": namespace},
        "spec": {
            "tasks": [
                {
                    "id": "qa",
                    "dataset": {"rows": qa_rows},
                    "prompt": "{{ item.q }}",
                    "target": "{{ item.a }}",
                    "outputs": {"column": "out"},
                    "grader": {"type": "python", "source": EXACT, "metricId": "exact_match"},
                },
                {
                    "id": "sentiment",
                    "dataset": {"rows": SENTIMENT},
                    "prompt": "{{ item.text }}",
                    "target": "{{ item.label }}",
                    "outputs": {"column": "output"},
                    "grader": {"type": "python", "contract": "batch", "source": MACRO_F1},
                    "metrics": ["macro_f1"],
                },
            ]
        },
    }


def run(namespace: str, name: str = "nightly") -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 10},
    }


def _crds() -> list[dict[str, Any]]:
    import yaml

    return [
        yaml.safe_load((ROOT / "crds" / f).read_text())
        for f in (
            "evalsuites.evalkube.io.yaml",
            "evalruns.evalkube.io.yaml",
            "evalschedules.evalkube.io.yaml",
        )
    ]


def _wait_http(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if accepts(port):
            return
        time.sleep(0.1)
    raise AssertionError("operator HTTP server did not start")


def _jobs(cp: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    items = cp.kubectl_json("get", "jobs", "-n", namespace)["items"]
    return {j["metadata"]["annotations"]["evalkube.io/unit-id"]: j for j in items}


def run_unit_command(
    snapshot: Path, unit: str, ingest: str, token: str, sandbox: str, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """What a work-unit pod's runner container runs, with the Pod's token."""
    return subprocess.run(
        [
            EVALKUBE,
            "unit",
            "--snapshot",
            str(snapshot),
            "--unit",
            unit,
            "--ingest-url",
            ingest,
            "--sandbox",
            sandbox,
        ],
        env={**os.environ, "EVALKUBE_INGEST_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _play_unit(
    cp: ControlPlane, namespace: str, job: dict[str, Any], ingest: str, tmp: Path
) -> None:
    """Do what the Pod would: run the runner command with the Pod's inputs, then complete."""
    runner = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "runner")
    args = runner["command"]
    unit = args[args.index("--unit") + 1]
    secret_ref = runner["env"][0]["valueFrom"]["secretKeyRef"]
    secret = cp.kubectl_json("get", "secret", secret_ref["name"], "-n", namespace)

    token = base64.b64decode(secret["data"][secret_ref["key"]]).decode()
    snapshot_cm = next(
        v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "snapshot"
    )
    data = cp.kubectl_json("get", "configmap", snapshot_cm["configMap"]["name"], "-n", namespace)[
        "data"
    ]
    snapshot = tmp / "snapshot.json"
    snapshot.write_text(data["snapshot.json"])
    done = run_unit_command(snapshot, unit, ingest, token, "auto", timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    pods = cp.kubectl_json(
        "get", "pods", "-n", namespace, "-l", f"job-name={job['metadata']['name']}"
    )["items"]
    assert pods, f"no pod for {job['metadata']['name']}"
    for pod in pods:
        cp.kubectl(
            "annotate",
            "pod",
            pod["metadata"]["name"],
            "-n",
            namespace,
            f"{COMPLETE_ANNOTATION}=true",
            "--overwrite",
        )


def install_crds(cp: ControlPlane) -> None:
    cp.apply(
        [json.loads(json.dumps(doc)) for doc in _crds()]
        + [
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "gvisor"},
                "handler": "runsc",
            }
        ]
    )
    cp.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/evalruns.evalkube.io",
        "crd/evalsuites.evalkube.io",
        "crd/evalschedules.evalkube.io",
    )


class OperatorUrl(str):
    """The operator's ingest URL (what work pods call); ``api`` is the URL of its samples API,
    /metrics and /healthz (another port)."""

    api: str


#: The samples API's read token of the operators these tests run.
READ_TOKEN = "cluster-test-read-token"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}


CHART = ROOT / "charts" / "evalkube"
_RBAC_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def chart_identity(
    cp: ControlPlane, system: str, watch: list[str], workdir: Path, values: Sequence[str] = ()
) -> Path:
    """A kubeconfig of the chart's operator ServiceAccount (release ``evalkube`` in
    ``system``) with exactly the chart's RBAC: every namespace, or a Role in each of ``watch``
    (and the chart ``values`` given as ``--set`` arguments). The operator tests run as this
    account, so they fail if the chart grants too little."""
    import yaml

    cp.kubectl("create", "namespace", system, check=False)
    args = ["template", "evalkube", str(CHART), "--namespace", system]
    for value in values:
        args += ["--set", value]
    for i, ns in enumerate(watch):
        args += ["--set", f"watchNamespaces[{i}]={ns}"]
    done = cp.run("helm", *args, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] in _RBAC_KINDS]
    cp.apply(docs)
    token = cp.kubectl("create", "token", "evalkube", "-n", system, "--duration=2h").stdout
    config = yaml.safe_load(cp.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token.strip()}
    path = workdir / f"operator-{system}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@contextmanager
def running_operator(
    cp: ControlPlane,
    store: Path,
    port: int,
    *,
    watch: list[str] | None = None,
    chart_values: Sequence[str] = (),
    **settings: str,
) -> Iterator[OperatorUrl]:
    """Run the operator (KopfRunner) until the block ends; yields its ingest URL (with the API
    URL as ``.api``).

    It runs as the chart's ServiceAccount with the chart's RBAC (:func:`chart_identity`):
    cluster-wide, or with ``watch`` namespace-scoped (the chart's ``watchNamespaces``).
    ``settings`` become ``EVALKUBE_<NAME>`` variables, read at the operator's startup.
    """
    from kopf.testing import KopfRunner

    api_port = _free_port()
    system = settings.get("operator_namespace") or f"evk-sys-{uuid.uuid4().hex[:8]}"
    kubeconfig = chart_identity(cp, system, watch or [], store.parent, chart_values)
    scope = [a for ns in watch for a in ("--namespace", ns)] if watch else ["-A"]
    env = {
        "KUBECONFIG": str(kubeconfig),
        "EVALKUBE_NAMESPACES": json.dumps(watch or []),
        "EVALKUBE_STORE_URL": f"sqlite:///{store}",
        "EVALKUBE_LISTEN": f"127.0.0.1:{port}",
        "EVALKUBE_API_LISTEN": f"127.0.0.1:{api_port}",
        "EVALKUBE_API_TOKEN": READ_TOKEN,
        "EVALKUBE_INGEST_URL": f"http://127.0.0.1:{port}",
        "EVALKUBE_POD_ANNOTATIONS": json.dumps({HOLD_ANNOTATION: "true"}),
        # runs advance on events: the periodic pass keeps its default (60 s), so a test that
        # waited for it would time out; a blocked run is looked at again quickly
        "EVALKUBE_RETRY_INTERVAL": "0.5",
        **{f"EVALKUBE_{key.upper()}": value for key, value in settings.items()},
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with KopfRunner(
            ["run", "--standalone", *scope, "-m", "evalkube.controller.handlers"]
        ) as runner:
            _wait_http(port)
            _wait_http(api_port)
            url = OperatorUrl(f"http://127.0.0.1:{port}")
            url.api = f"http://127.0.0.1:{api_port}"
            yield url
        assert runner.exit_code == 0, runner.output
        assert runner.exception is None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def module_operator(**settings: str) -> Any:
    """A module-scoped ``operator`` fixture: CRDs installed, the operator running (with
    ``settings``, see :func:`running_operator`) on a store of its own for the module's tests."""

    @pytest.fixture(scope="module")
    def operator(
        control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[OperatorUrl]:
        install_crds(control_plane)
        store = tmp_path_factory.mktemp("operator") / "results.db"
        with running_operator(control_plane, store, _free_port(), **settings) as url:
            yield url

    return operator


def run_manifest(namespace: str, name: str = "nightly", shard_size: int = 5) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": shard_size},
    }


def metric(url: OperatorUrl, name: str) -> float:
    text = httpx.get(f"{url.api}/metrics").text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def run_status(cp: ControlPlane, namespace: str, name: str = "nightly") -> dict[str, Any]:
    """The run's status as the operator wrote it, checked against ``EvalRunStatus``: every
    field the operator writes is one the model (and so the CRD) declares, in its type."""
    status: dict[str, Any] = (
        cp.kubectl_json("get", "evalrun", name, "-n", namespace).get("status") or {}
    )
    EvalRunStatus.model_validate({k: v for k, v in status.items() if k != "kopf"})
    return status


def finished(cp: ControlPlane, namespace: str, name: str = "nightly") -> dict[str, Any] | None:
    status = run_status(cp, namespace, name)
    return status if status.get("phase") in ("Succeeded", "Failed") else None


def run_unit(ingest: str, snapshot: Path, unit: str, token: str) -> str:
    """Run the unit's runner command (what the Pod's runner container does); its output."""
    done = subprocess.run(
        [EVALKUBE, "unit", "--snapshot", str(snapshot), "--unit", unit, "--ingest-url", ingest],
        env={**os.environ, "EVALKUBE_INGEST_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def annotate_pods(cp: ControlPlane, namespace: str, job: str, value: str) -> None:
    pods = cp.wait_for(
        lambda: cp.kubectl_json("get", "pods", "-n", namespace, "-l", f"job-name={job}")["items"],
        timeout=30,
        what=f"a pod of {job}",
    )
    for pod in pods:
        cp.kubectl(
            "annotate",
            "pod",
            pod["metadata"]["name"],
            "-n",
            namespace,
            f"evalkube.io/kwok-complete={value}",
            "--overwrite",
        )


def play_jobs(
    cp: ControlPlane, ns: str, name: str, url: OperatorUrl, tmp: Path, played: set[str]
) -> None:
    """Play the unit Jobs of run ``name`` not in ``played`` (Job names, added). Selected by
    the run's label: runs of one suite have the same unit ids."""
    selector = f"{names.LABEL_RUN}={names.run_label(name)}"
    jobs = cp.kubectl_json("get", "jobs", "-n", ns, "-l", selector)["items"]
    for job in jobs:
        if job["metadata"]["name"] not in played:
            played.add(job["metadata"]["name"])
            _play_unit(cp, ns, job, url, tmp)


def play_to_the_end(
    cp: ControlPlane, ns: str, name: str, url: OperatorUrl, tmp: Path
) -> dict[str, Any]:
    """Play every unit Job of run ``name`` as it appears; the finished status."""
    played: set[str] = set()

    def step() -> dict[str, Any] | None:
        play_jobs(cp, ns, name, url, tmp, played)
        return finished(cp, ns, name)

    status: dict[str, Any] = cp.wait_for(step, timeout=180, what=f"{name} finished")
    return status
