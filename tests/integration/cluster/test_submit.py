"""``evalkube submit`` against the real loopback control plane and a running operator.

The command runs as a user runs it (its own process, the admin kubeconfig); kwok holds each
work-unit Pod at Running and the test plays it as its Pod would (:func:`play`: the runner's own
command from the Job, with the Pod's snapshot, dataset ConfigMaps, token and store
credentials), then lets it complete. The scores ``submit`` prints must be those ``evalkube
run`` prints for the same files.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.filesize import decimal
from tests.cluster.plugin import COMPLETE_ANNOTATION, ControlPlane
from tests.integration.cluster.operator_support import (
    EVALKUBE,
    ROOT,
    OperatorUrl,
    module_operator,
)
from tests.support.s3_server import S3Server

from evalkube.controller import names

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

operator = module_operator()
RECIPES = ROOT / "examples" / "recipes"


def evalkube(
    cp: ControlPlane, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [EVALKUBE, *args],
        cwd=cwd,
        env={**os.environ, "KUBECONFIG": str(cp.kubeconfig), "COLUMNS": "160", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def local_run(suite: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EVALKUBE, "run", str(suite), *extra, "--db", str(cwd / "local.db")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def report(line: str) -> None:
    """A figure on the terminal (the operator's KopfRunner holds sys.stdout and sys.stderr)."""
    print(f"[submit] {line}", file=sys.__stderr__)


def table(stdout: str) -> list[str]:
    """The scores table's lines, from its top border to its bottom one (its title left
    out: a local run id there, the EvalRun's name here)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[start : end + 1]


def _secret_value(cp: ControlPlane, ns: str, ref: dict[str, str]) -> str:
    secret = cp.kubectl_json("get", "secret", ref["name"], "-n", ns)
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def play(cp: ControlPlane, ns: str, job: dict[str, Any], work: Path) -> None:
    """Run the Job's runner command as its Pod would, then let the Pod complete: the snapshot
    and the dataset ConfigMaps written where the command reads them, the token and store
    credentials of its Secrets in its environment, no grader container (the runner's local
    sandbox instead) and no proxy sidecar (precomputed outputs call no model)."""
    work.mkdir(parents=True)
    pod = job["spec"]["template"]["spec"]
    runner = next(c for c in pod["containers"] if c["name"] == "runner")
    command, args = runner["command"][1], runner["command"][2:]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    for volume in pod["volumes"]:
        name = (volume.get("configMap") or {}).get("name")
        if name is None:
            continue
        data = cp.kubectl_json("get", "configmap", name, "-n", ns)["data"]
        if volume["name"] == "snapshot":
            (work / "snapshot.json").write_text(data["snapshot.json"])
        else:  # a dataset ConfigMap, mounted at DATASETS_DIR/<name>
            (work / "datasets" / name).mkdir(parents=True)
            for key, value in data.items():
                (work / "datasets" / name / key).write_text(value)
    flags["--snapshot"] = str(work / "snapshot.json")
    if "--datasets" in flags:
        flags["--datasets"] = str(work / "datasets")
    for pod_only in ("--worker", "--bridge", "--bridge-control", "--ipv6"):
        flags.pop(pod_only, None)
    if command == "unit":  # the runner's local sandbox stands in for the grader container
        flags["--sandbox"] = "process"
    env = {**os.environ}
    for variable in runner.get("env") or []:
        ref = (variable.get("valueFrom") or {}).get("secretKeyRef")
        env[variable["name"]] = _secret_value(cp, ns, ref) if ref else variable["value"]
    done = subprocess.run(
        [EVALKUBE, command, *(part for pair in flags.items() for part in pair)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    pods = cp.wait_for(
        lambda: cp.kubectl_json(
            "get", "pods", "-n", ns, "-l", f"job-name={job['metadata']['name']}"
        )["items"],
        timeout=30,
        what=f"a pod of {job['metadata']['name']}",
    )
    for p in pods:
        cp.kubectl(
            "annotate",
            "pod",
            p["metadata"]["name"],
            "-n",
            ns,
            f"{COMPLETE_ANNOTATION}=true",
            "--overwrite",
        )


def play_until_exit(
    cp: ControlPlane, ns: str, process: subprocess.Popen[str], work: Path, timeout: float = 200
) -> tuple[int, str, str]:
    """Play every Job of the namespace as it appears until ``process`` (the submit) exits."""
    played: set[str] = set()
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        assert time.monotonic() < deadline, "evalkube submit did not finish"
        for job in cp.kubectl_json("get", "jobs", "-n", ns)["items"]:
            name = job["metadata"]["name"]
            if name not in played:
                played.add(name)
                play(cp, ns, job, work / name)
        time.sleep(0.3)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    """examples/recipes without its ``outputs.path`` task (outputs need an object store):
    JSONL datasets by ``path``, grader and preprocessor files, a grade_batch task."""
    folder = tmp_path / "recipes"
    shutil.copytree(RECIPES, folder)
    docs = list(yaml.safe_load_all((folder / "suite.yaml").read_text()))
    docs[0]["spec"]["tasks"] = [t for t in docs[0]["spec"]["tasks"] if t["id"] != "token_f1"]
    (folder / "suite.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return folder / "suite.yaml"


def test_submit_runs_a_local_suite_in_the_cluster_with_the_scores_of_evalkube_run(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    recipes: Path,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, cluster_namespace
    local = local_run(recipes, tmp_path)
    assert local.returncode == 0, local.stderr
    started = time.monotonic()
    process = evalkube(cp, "submit", str(recipes), "-n", ns, "--name", "recipes-1", cwd=tmp_path)
    code, out, err = play_until_exit(cp, ns, process, tmp_path / "pods")
    seconds = time.monotonic() - started
    assert code == 0, err + out
    assert table(out) == table(local.stdout), out + local.stdout
    assert f"recipes · EvalRun {ns}/recipes-1" in out
    assert "Succeeded" in out
    # without a terminal, a line per change of the run's state
    assert "EvalRun recipes-1: Running · " in err
    assert "EvalRun recipes-1: Succeeded" in err
    report(f"recipes (7 tasks, 9 units) submitted, played and reported in {seconds:.1f} s")

    # what was applied: ConfigMaps of no owner, labelled; the suite reads them; server-side apply
    configmaps = cp.kubectl_json(
        "get", "configmaps", "-n", ns, "-l", "app.kubernetes.io/managed-by=evalkube-submit"
    )["items"]
    by_name = {c["metadata"]["name"]: c for c in configmaps}
    used = sorted(p.name for p in (RECIPES / "graders").glob("*.py") if p.name != "token_f1.py")
    assert sorted(by_name["recipes-code"]["data"]) == used
    data = sorted(n for n in by_name if n.startswith("recipes-data-"))
    assert len(data) == 2
    assert all("ownerReferences" not in c["metadata"] for c in configmaps)
    suite = cp.kubectl_json("get", "evalsuite", "recipes", "-n", ns, "--show-managed-fields")
    assert suite["status"]["phase"] == "Ready"
    tasks = {t["id"]: t for t in suite["spec"]["tasks"]}
    assert tasks["exact_match"]["grader"]["file"] == "recipes-code/exact_match.py"
    assert tasks["exact_match"]["dataset"]["configMapRef"]["name"] in data
    managers = {(m["manager"], m["operation"]) for m in suite["metadata"]["managedFields"]}
    assert ("evalkube-submit", "Apply") in managers
    run = cp.kubectl_json("get", "evalrun", "recipes-1", "-n", ns)
    assert run["spec"]["suiteRef"] == {"name": "recipes"}
    assert run["status"]["phase"] == "Succeeded"


def test_a_failed_gate_exits_1_with_the_gate_table(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    recipes: Path,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, cluster_namespace
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalRun",
                "metadata": {"name": "gated"},
                "spec": {
                    "models": ["precomputed"],
                    "gate": {
                        "thresholds": [
                            {"task": "exact_match", "metric": "exact_match", "min": 0.99}
                        ]
                    },
                },
            }
        )
    )
    docs = list(yaml.safe_load_all(recipes.read_text()))  # one task is enough for a gate
    docs[0]["spec"]["tasks"] = docs[0]["spec"]["tasks"][:1]
    recipes.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    local = local_run(recipes, tmp_path, str(run_file))
    assert local.returncode == 1, local.stderr
    process = evalkube(cp, "submit", str(recipes), str(run_file), "-n", ns, cwd=tmp_path)
    code, out, err = play_until_exit(cp, ns, process, tmp_path / "pods")
    assert code == 1, err + out
    assert table(out) == table(local.stdout)
    assert "gate FAILED" in out
    assert "gate failed:" in err
    assert "exact_match" in err
    status = cp.kubectl_json("get", "evalrun", "gated", "-n", ns)["status"]
    assert status["phase"] == "Succeeded"
    assert status["gate"]["passed"] is False


def test_no_wait_applies_and_a_second_submit_of_the_name_is_refused(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    recipes: Path,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, cluster_namespace
    args = ("submit", str(recipes), "-n", ns, "--name", "once", "--no-wait")
    first = evalkube(cp, *args, cwd=tmp_path)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "applied ConfigMap recipes-code" in out, err
    assert "EvalRun once" in out
    assert f"kubectl get evr once -n {ns} -w" in out
    assert (
        cp.kubectl_json("get", "evalrun", "once", "-n", ns)["spec"]["suiteRef"]["name"] == "recipes"
    )
    again = evalkube(cp, *args, cwd=tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 2, err
    assert f"EvalRun {ns}/once exists already" in err
    assert "nothing was applied" in err


class Terminal:
    """A pseudo-terminal for a process's stderr (160 columns), read in the background."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        self.chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the process and this end's slave are closed
                return
            if not data:
                return
            self.chunks.append(data)

    def started(self) -> None:
        os.close(self.slave)  # the process holds its own copy
        self._reader.start()

    def text(self) -> str:
        """What was written, without the escape sequences (colours, cursor moves)."""
        self._reader.join(timeout=30)
        os.close(self.master)
        written = b"".join(self.chunks).decode(errors="replace")
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written)


def test_on_a_terminal_the_bars_draw_and_ctrl_c_leaves_the_run(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    """On a terminal: a bar of the upload's bytes, then one of the run's units; Ctrl-C stops
    watching (exit 130), says how to keep watching, and the run goes on."""
    cp, ns = control_plane, cluster_namespace
    bucket = f"submit-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(bucket)
    rows = "".join(json.dumps({"q": str(i), "out": str(i)}) + "\n" for i in range(20_000))
    (tmp_path / "qa.jsonl").write_text(rows)
    suite = _suite_with(tmp_path, {"path": "qa.jsonl"}, _storage(s3_server, cp, ns))
    keys = {k: v for k, v in s3_server.env.items() if k != "AWS_ENDPOINT_URL"}
    terminal = Terminal()
    process = subprocess.Popen(
        [EVALKUBE, "submit", str(suite), "-n", ns, "--store", f"s3://{bucket}"],
        cwd=tmp_path,
        env={**os.environ, **keys, "KUBECONFIG": str(cp.kubeconfig), "TERM": "xterm-256color"},
        stdout=subprocess.PIPE,
        stderr=terminal.slave,
        text=True,
    )
    terminal.started()
    assert process.stdout is not None
    line = process.stdout.readline()  # "applied ..." once everything is in the cluster
    assert "applied" in line, line

    def preparing() -> bool:
        status = cp.kubectl_json("get", "evalrun", "qa-run", "-n", ns).get("status") or {}
        return any(c.get("reason") == "Preparing" for c in status.get("conditions") or [])

    cp.wait_for(preparing, timeout=60, what="the run waiting for its prepare Job")
    time.sleep(2)  # the watch's event, and a redraw of the bar
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    shown = terminal.text()
    assert process.returncode == 130, shown
    assert "upload qa.jsonl" in shown
    size = decimal(len(rows))  # "597.8 kB"
    assert "upload qa.jsonl ━━━━" in shown
    assert f" {size.split()[0]}/{size} " in shown  # the bytes' bar, full
    assert "uploaded qa.jsonl to s3://" in shown
    assert "EvalRun qa-run · Pending · Preparing ━━━━" in shown  # the run's bar, and why it waits
    assert " 0/? units " in shown
    assert "stopped watching" in shown
    assert f"kubectl get evr qa-run -n {ns} -w" in shown
    run = cp.kubectl_json("get", "evalrun", "qa-run", "-n", ns)
    assert run["status"]["phase"] in ("Pending", "Running")
    assert cp.kubectl_json("get", "jobs", "-n", ns)["items"]


def test_a_manifest_the_api_server_refuses_leaves_nothing_applied(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    """Bounds only a cluster has (here: at most 10,000 inline rows per task, which `evalkube
    run` takes) are checked by the API server in a dry run of every manifest, before
    anything is stored."""
    cp, ns = control_plane, cluster_namespace
    suite = tmp_path / "suite.yaml"
    rows = [{"q": str(i), "a": str(i), "out": str(i)} for i in range(10_001)]
    grader = {"type": "python", "source": "def grade(sample, item):\n    return 1.0\n"}
    spec = {
        "tasks": [
            {
                "id": "many",
                "dataset": {"rows": rows},
                "prompt": "{{ item.q }}",
                "outputs": {"column": "out"},
                "grader": grader,
            }
        ]
    }
    doc = {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite", "metadata": {"name": "many"}}
    suite.write_text(yaml.safe_dump({**doc, "spec": spec}))
    process = evalkube(cp, "submit", str(suite), "-n", ns, "--name", "refused", cwd=tmp_path)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, err + out
    assert "EvalSuite many: the API server refused it (422)" in err
    assert "10000" in err
    assert "nothing was applied" in err
    for kind in ("configmaps", "evalsuites", "evalruns"):
        selector = "app.kubernetes.io/managed-by=evalkube-submit"
        assert cp.kubectl_json("get", kind, "-n", ns, "-l", selector)["items"] == [], kind


def test_submit_uploads_the_recipes_to_an_object_store_the_run_reads(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    """examples/recipes as they are (JSONL datasets by ``path``, an ``outputs.path`` file) with
    ``--store``: uploaded to SeaweedFS under content-addressed keys with this machine's AWS
    credentials, pinned by the prepare Job and read by the units with the run's Secret; the
    scores are those of ``evalkube run`` on the local files. A second submit uploads nothing."""
    cp, ns = control_plane, cluster_namespace
    bucket = f"submit-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(bucket)
    storage = _storage(s3_server, cp, ns)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "evalkube.io/v1alpha1",
                "kind": "EvalRun",
                "metadata": {"name": "stored"},
                "spec": {"models": ["precomputed"], "storage": storage},
            }
        )
    )
    local = local_run(RECIPES / "suite.yaml", tmp_path)
    assert local.returncode == 0, local.stderr
    # the store's keys as a user has them (the endpoint comes from the run file)
    keys = {k: v for k, v in s3_server.env.items() if k != "AWS_ENDPOINT_URL"}
    args = (str(RECIPES / "suite.yaml"), str(run_file), "-n", ns, "--store", f"s3://{bucket}/team")
    started = time.monotonic()
    process = evalkube(cp, "submit", *args, cwd=tmp_path, env=keys)
    code, out, err = play_until_exit(cp, ns, process, tmp_path / "pods")
    seconds = time.monotonic() - started
    assert code == 0, err + out
    assert table(out) == table(local.stdout), out + local.stdout
    report(f"recipes (8 tasks) via SeaweedFS submitted, played, reported in {seconds:.1f} s")

    data = RECIPES / "data"
    uploaded = {}
    for name in ("arithmetic.jsonl", "measurements.jsonl", "outputs-f1.jsonl"):
        digest = hashlib.sha256((data / name).read_bytes()).hexdigest()
        key = f"team/recipes/{digest}/{name}"
        assert s3_server.get(bucket, key) == (data / name).read_bytes()
        assert f"uploaded {data / name} to s3://{bucket}/{key} (" in err
        uploaded[name] = key
    assert err.count("uploaded ") == 3, err
    suite = cp.kubectl_json("get", "evalsuite", "recipes", "-n", ns)
    tasks = {t["id"]: t for t in suite["spec"]["tasks"]}
    assert tasks["exact_match"]["dataset"]["uri"] == f"s3://{bucket}/{uploaded['arithmetic.jsonl']}"
    assert tasks["token_f1"]["outputs"]["uri"] == f"s3://{bucket}/{uploaded['outputs-f1.jsonl']}"
    jobs = cp.kubectl_json("get", "jobs", "-n", ns)["items"]
    assert any(j["metadata"]["name"] == names.prepare_job_name("stored") for j in jobs)

    again = evalkube(
        cp, "submit", *args, "--name", "stored-again", "--no-wait", cwd=tmp_path, env=keys
    )
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert err.count("already in the store") == 3, err
    assert "uploaded " not in err


def _storage(s3: S3Server, cp: ControlPlane, ns: str) -> dict[str, Any]:
    """The run's spec.storage for ``s3``, its keys in the Secret ``eval-data`` of ``ns``."""
    cp.kubectl(
        "create", "secret", "generic", "eval-data", "-n", ns,
        f"--from-literal=id={s3.access_key}", f"--from-literal=secret={s3.secret_key}",
    )  # fmt: skip
    return {
        "s3": {
            "endpointURL": s3.endpoint_url,
            "region": s3.region,
            "accessKeyIDSecretRef": {"name": "eval-data", "key": "id"},
            "secretAccessKeySecretRef": {"name": "eval-data", "key": "secret"},
        }
    }


def _suite_with(tmp: Path, dataset: dict[str, Any], storage: dict[str, Any]) -> Path:
    grader = {"type": "python", "source": "def grade(sample, item):\n    return 1.0\n"}
    task = {"id": "qa", "dataset": dataset, "prompt": "{{ item.q }}",
            "outputs": {"column": "out"}, "grader": grader}  # fmt: skip
    docs = [
        {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalSuite",
         "metadata": {"name": "qa"}, "spec": {"tasks": [task]}},
        {"apiVersion": "evalkube.io/v1alpha1", "kind": "EvalRun",
         "metadata": {"name": "qa-run"}, "spec": {"models": ["precomputed"], "storage": storage}},
    ]  # fmt: skip
    path = tmp / "suite.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def test_a_run_that_fails_exits_3_with_its_reason(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    """A dataset object that is not there: the prepare Job cannot pin it, the run ends Failed
    (SourceUnavailable) before any unit, and submit exits 3 naming the reason."""
    cp, ns = control_plane, cluster_namespace
    bucket = f"submit-{uuid.uuid4().hex[:10]}"
    s3_server.create_bucket(bucket)
    dataset = {"uri": f"s3://{bucket}/absent.jsonl"}
    suite = _suite_with(tmp_path, dataset, _storage(s3_server, cp, ns))
    process = evalkube(cp, "submit", str(suite), "-n", ns, cwd=tmp_path)
    code, out, err = play_until_exit(cp, ns, process, tmp_path / "pods")
    assert code == 3, err + out
    assert f"EvalRun {ns}/qa-run failed: SourceUnavailable" in err
    assert "absent.jsonl" in err
    assert "Failed · " in out


def test_a_missing_bucket_exits_2_with_nothing_applied(
    control_plane: ControlPlane,
    cluster_namespace: str,
    operator: OperatorUrl,
    s3_server: S3Server,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, cluster_namespace
    (tmp_path / "qa.jsonl").write_text('{"q": "1", "out": "1"}\n')
    suite = _suite_with(tmp_path, {"path": "qa.jsonl"}, _storage(s3_server, cp, ns))
    keys = {k: v for k, v in s3_server.env.items() if k != "AWS_ENDPOINT_URL"}
    store = "s3://no-such-bucket-at-all/x"
    process = evalkube(cp, "submit", str(suite), "-n", ns, "--store", store, cwd=tmp_path, env=keys)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, err + out
    assert "bucket 'no-such-bucket-at-all' does not exist" in err
    assert "nothing was applied" in err
    for kind in ("configmaps", "evalsuites", "evalruns"):
        selector = "app.kubernetes.io/managed-by=evalkube-submit"
        assert cp.kubectl_json("get", kind, "-n", ns, "-l", selector)["items"] == [], kind


def _keyed_suite(folder: Path) -> tuple[Path, Path]:
    """A one-task suite with precomputed outputs, and a run file whose provider key is named
    by environment variable (as a local run names it)."""
    folder.mkdir(parents=True, exist_ok=True)
    grader = {"type": "python", "source": "def grade(sample, item):\n    return 1.0\n"}
    task = {
        "id": "t",
        "dataset": {"rows": [{"q": "1", "out": "1"}]},
        "prompt": "{{ item.q }}",
        "outputs": {"column": "out"},
        "grader": grader,
    }
    api = "evalkube.io/v1alpha1"
    suite = folder / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "apiVersion": api,
                "kind": "EvalSuite",
                "metadata": {"name": "keyed"},
                "spec": {"tasks": [task]},
            }
        )
    )
    provider = {"baseURL": "https://models.example/v1", "apiKeyEnv": "OPENAI_API_KEY"}
    spec = {
        "models": ["precomputed"],
        "judgeModel": "openai:judge",
        "providers": {"openai": provider},
    }
    run = folder / "run.yaml"
    run.write_text(
        yaml.safe_dump(
            {"apiVersion": api, "kind": "EvalRun", "metadata": {"name": "keyed"}, "spec": spec}
        )
    )
    return suite, run


def _secret_data(cp: ControlPlane, ns: str, name: str) -> dict[str, str]:
    secret = cp.kubectl_json("get", "secret", name, "-n", ns)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_provider_keys_never_replace_a_secret_submit_did_not_make(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    """The keys' Secret is named after the run: a Secret of that name someone else keeps is
    neither overwritten nor handed to the run's garbage collection."""
    cp, ns = control_plane, cluster_namespace
    suite, run = _keyed_suite(tmp_path / "keyed")
    team = "--from-literal=openai=sk-team"
    cp.kubectl("create", "secret", "generic", "keyed-provider-keys", "-n", ns, team)
    env = {"OPENAI_API_KEY": "sk-mine-0123456789"}
    args = ("submit", str(suite), str(run), "-n", ns, "--no-wait")
    refused = evalkube(cp, *args, cwd=tmp_path, env=env)
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 2, err + out
    assert f"Secret {ns}/keyed-provider-keys exists already and evalkube submit did not make" in err
    assert "nothing was applied" in err
    assert "sk-mine" not in out + err
    assert _secret_data(cp, ns, "keyed-provider-keys") == {"openai": "sk-team"}
    assert cp.kubectl_json("get", "evalruns", "-n", ns)["items"] == []

    cp.kubectl("delete", "secret", "keyed-provider-keys", "-n", ns)
    done = evalkube(cp, *args, cwd=tmp_path, env=env)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err + out
    assert "sk-mine" not in out + err
    assert (
        f"the API key of provider openai is read from $OPENAI_API_KEY into Secret "
        f"{ns}/keyed-provider-keys, for calls to https://models.example/v1 only"
    ) in " ".join(err.split())
    assert _secret_data(cp, ns, "keyed-provider-keys") == {"openai": "sk-mine-0123456789"}
    secret = cp.kubectl_json("get", "secret", "keyed-provider-keys", "-n", ns)
    evalrun = cp.kubectl_json("get", "evalrun", "keyed", "-n", ns)
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [evalrun["metadata"]["uid"]]


def test_a_failed_apply_deletes_the_provider_keys_it_stored(
    control_plane: ControlPlane, cluster_namespace: str, tmp_path: Path
) -> None:
    """What ``submit`` does when an apply after the keys' Secret fails (or is interrupted):
    no key stays in the cluster without a run to own it."""
    from datetime import UTC, datetime

    from evalkube.engine.loading import load_files
    from evalkube.submit.cluster import Cluster, kubeconfig
    from evalkube.submit.command import _drop_keys_secret
    from evalkube.submit.plan import build_plan

    cp, ns = control_plane, cluster_namespace
    suite, run = _keyed_suite(tmp_path / "keyed")
    loaded, spec = load_files(suite, run, versioned=False)
    plan = build_plan(
        loaded, spec, namespace=ns, now=datetime.now(UTC), environ={"OPENAI_API_KEY": "sk-x"}
    )
    assert plan.secret is not None
    cluster = Cluster(kubeconfig(str(cp.kubeconfig), None))
    try:
        cluster.apply([plan.secret])
        assert _secret_data(cp, ns, "keyed-provider-keys") == {"openai": "sk-x"}
        dropped = _drop_keys_secret(plan, cluster)
        assert dropped == f"; the provider keys' Secret {ns}/keyed-provider-keys was deleted again"
        gone = cp.kubectl("get", "secret", "keyed-provider-keys", "-n", ns, check=False)
        assert gone.returncode != 0
        assert _drop_keys_secret(plan, cluster) == ""  # nothing left: nothing to say
    finally:
        cluster.close()
