"""Benchmark: how fast the operator turns EvalRuns into Jobs, and what its status writes cost.

Not a test. Starts its own loopback control plane (``tests.cluster.ctrlplane.ControlPlane``:
etcd, kube-apiserver, controller-manager, scheduler, kwok) and the operator as its own process
(``evalkube operator``, default settings but the store, the listen address and a kwok hold
annotation on work-unit pods), then measures:

1. **latency**: time from creating a 10-unit EvalRun to all 10 unit Jobs existing (Job ADDED
   events on a watch opened beforehand), median of several runs. Target: 2 s.
2. **burst**: 1,000 EvalRuns created at once (16 concurrent creates) until every one has all
   its Jobs; then, in the same run, the **raw** rate: the same number of Jobs (copies of one
   the operator made) created straight through the API server with the same concurrency.
   Targets: every run's Jobs within 3x the raw create time; 60 s per 200 runs.
3. **status writes**: runs played to the end (the benchmark runs each unit's runner command,
   ``evalkube unit``, as the test suite does, then lets kwok complete the Pod), counting the
   operator's ``evalkube_status_patches_total`` and every write to the EvalRun object
   (MODIFIED events: status patches plus kopf's own annotation patches), for 10 units x 10
   rows, 10 units x 100 rows (10x the samples) and 20 units x 10 rows (2x the units).
   Target: writes grow with units, not with samples.
4. **done -> status**: a 3-unit EvalRun, each unit played in turn (run it with
   ``--operator-env EVALKUBE_PARALLELISM=1``): seconds from the runner command's exit (about
   0.6 s after its done report) to the next Job existing, and from the last exit to the
   EvalRun's ``Succeeded`` status on a watch; also from the last Job's ``Complete`` condition
   to that status (negative when the status came first: the report, not the Job, finishes a
   unit). Median over the repeats.

``--only latency,done`` runs just those parts (``latency``, ``play``, ``burst``, ``done``).

Binaries come from ``$EVALKUBE_CTRLPLANE_BIN`` or tests/cluster/build-tools.sh's cache::

    EVALKUBE_CTRLPLANE_BIN=$(ls -d ~/.cache/evalkube-ctrlplane/*/bin | head -1) \\
        .venv/bin/python benchmarks/operator_bench.py
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's ``operator``, which the imports below need:
# drop benchmarks/ from the import path before anything imports it.
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, _ROOT)

import argparse  # noqa: E402
import base64  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402
from lightkube import Client, KubeConfig  # noqa: E402
from lightkube.codecs import from_dict  # noqa: E402
from lightkube.generic_resource import create_namespaced_resource  # noqa: E402
from lightkube.resources.batch_v1 import Job  # noqa: E402
from tests.cluster.ctrlplane import (  # noqa: E402
    COMPLETE_ANNOTATION,
    HOLD_ANNOTATION,
    ControlPlane,
    find_bin_dir,
    free_port,
)
from tests.integration.cluster.operator_support import run_unit_command  # noqa: E402

ROOT = Path(_ROOT)
EVALKUBE = str(Path(sys.executable).parent / "evalkube")
EXACT = (ROOT / "examples/recipes/graders/exact_match.py").read_text()
EvalRun = create_namespaced_resource("evalkube.io", "v1alpha1", "EvalRun", "evalruns")
LATENCY_TARGET, BURST_TARGET = 2.0, 60.0
#: The burst's Jobs, all of them, within this many times the raw create of as many Jobs.
BURST_RAW_RATIO_TARGET = 3.0
CREATE_CONCURRENCY = 16


# -- objects ----------------------------------------------------------------------------------
def suite(namespace: str, rows: int, name: str = "bench") -> dict[str, Any]:
    data = [{"q": f"{i}?", "a": str(i), "out": str(i) if i % 4 else "no"} for i in range(rows)]
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tasks": [
                {
                    "id": "qa",
                    "dataset": {"rows": data},
                    "prompt": "{{ item.q }}",
                    "target": "{{ item.a }}",
                    "outputs": {"column": "out"},
                    "grader": {"type": "python", "source": EXACT, "metricId": "exact_match"},
                }
            ]
        },
    }


def run(namespace: str, name: str, shard_size: int, suite_name: str = "bench") -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "suiteRef": {"name": suite_name},
            "models": ["precomputed"],
            "shardSize": shard_size,
        },
    }


# -- watching ---------------------------------------------------------------------------------
class Watcher:
    """Records when each Job first appeared and how often each EvalRun was written."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.jobs: dict[str, dict[str, float]] = defaultdict(dict)  # ns -> job name -> time
        self.job_run: dict[tuple[str, str], str] = {}  # (ns, job) -> run name
        self.run_writes: dict[tuple[str, str], int] = defaultdict(int)
        self.run_added: dict[tuple[str, str], float] = {}
        self.job_complete: dict[tuple[str, str], float] = {}  # (ns, job) -> Complete seen
        self.run_phase: dict[tuple[str, str, str], float] = {}  # (ns, run, phase) -> first seen
        for target in (self._watch_jobs, self._watch_runs):
            threading.Thread(target=target, daemon=True).start()

    def _watch_jobs(self) -> None:
        try:
            self._jobs_loop()
        except Exception:  # the control plane went away at the end
            return

    def _watch_runs(self) -> None:
        try:
            self._runs_loop()
        except Exception:
            return

    def _jobs_loop(self) -> None:
        for kind, job in self.client.watch(Job, namespace="*"):
            if job.metadata is None:
                continue
            now = time.monotonic()
            ns, name = job.metadata.namespace or "", job.metadata.name or ""
            conditions = (job.status.conditions if job.status else None) or []
            if any(c.type == "Complete" and c.status == "True" for c in conditions):
                with self.lock:
                    self.job_complete.setdefault((ns, name), now)
            if kind != "ADDED":
                continue
            with self.lock:
                self.jobs[ns].setdefault(name, now)
                self.job_run[(ns, name)] = (job.metadata.labels or {}).get("evalkube.io/run", "")

    def _runs_loop(self) -> None:
        for kind, obj in self.client.watch(EvalRun, namespace="*"):
            if obj.metadata is None:
                continue
            key = (obj.metadata.namespace or "", obj.metadata.name or "")
            phase = str((getattr(obj, "status", None) or {}).get("phase") or "")
            with self.lock:
                self.run_phase.setdefault((*key, phase), time.monotonic())
                if kind == "MODIFIED":
                    self.run_writes[key] += 1
                elif kind == "ADDED":
                    self.run_added.setdefault(key, time.monotonic())

    def job_times(self, namespace: str) -> dict[str, float]:
        with self.lock:
            return dict(self.jobs.get(namespace, {}))

    def run_done_times(self, namespace: str, expected: int) -> dict[str, float]:
        """Per run: when its last Job appeared (runs with all ``expected`` Jobs only)."""
        with self.lock:
            by_run: dict[str, list[float]] = defaultdict(list)
            for name, at in self.jobs.get(namespace, {}).items():
                by_run[self.job_run[(namespace, name)]].append(at)
        return {r: max(ts) for r, ts in by_run.items() if len(ts) >= expected}

    def added(self, namespace: str) -> dict[str, float]:
        """When each EvalRun of ``namespace`` appeared on the watch."""
        with self.lock:
            return {n: t for (ns, n), t in self.run_added.items() if ns == namespace}

    def phase_time(self, namespace: str, name: str, phase: str) -> float | None:
        with self.lock:
            return self.run_phase.get((namespace, name, phase))

    def complete_time(self, namespace: str, job: str) -> float | None:
        with self.lock:
            return self.job_complete.get((namespace, job))

    def writes(self, namespace: str, name: str) -> int:
        with self.lock:
            return self.run_writes.get((namespace, name), 0)


def wait(check: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# -- the operator -----------------------------------------------------------------------------
class Operator:
    """``evalkube operator`` in its own process, on a loopback port and a fresh SQLite store."""

    def __init__(self, cp: ControlPlane, workdir: Path, extra_env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = f"http://127.0.0.1:{free_port()}"  # /healthz and /metrics
        self.log = workdir / "operator.log"
        env = {
            **cp.env,
            "EVALKUBE_STORE_URL": f"sqlite:///{workdir / 'results.db'}",
            "EVALKUBE_LISTEN": f"127.0.0.1:{self.port}",
            "EVALKUBE_API_LISTEN": self.api.removeprefix("http://"),
            "EVALKUBE_INGEST_URL": self.url,
            "EVALKUBE_POD_ANNOTATIONS": json.dumps({HOLD_ANNOTATION: "true"}),
            **extra_env,
        }
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [EVALKUBE, "operator"], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        wait(self._healthy, 60, "the operator's /healthz", interval=0.1)

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited; see {self.log}")
        try:
            with urllib.request.urlopen(f"{self.api}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.api}/metrics", timeout=10) as response:
            text = response.read().decode()
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- scenarios --------------------------------------------------------------------------------
def get_json(cp: ControlPlane, *args: str) -> Any:
    """``kubectl get ... -o json``, or None when it fails (not found yet)."""
    proc = cp.kubectl(*args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def drop_namespace(cp: ControlPlane, name: str) -> None:
    """Delete a scenario's namespace (its held Pods would fill the kwok node's 110 slots)."""
    cp.kubectl("delete", "namespace", name, "--wait=false")


def new_namespace(cp: ControlPlane, name: str) -> str:
    cp.kubectl("create", "namespace", name)
    return name


def latency(cp: ControlPlane, client: Client, watcher: Watcher, repeats: int) -> list[float]:
    """Seconds from creating a 10-unit EvalRun to its 10th Job, ``repeats`` times."""
    seconds = []
    for i in range(repeats):
        ns = new_namespace(cp, f"latency-{i}")
        cp.apply(suite(ns, rows=100))
        time.sleep(0.5)  # let the suite's own reconcile pass
        started = time.monotonic()
        client.create(from_dict(run(ns, "ten", shard_size=10)))
        times = wait(lambda ns=ns: len(t := watcher.job_times(ns)) >= 10 and t, 60, "10 Jobs")
        seconds.append(max(times.values()) - started)
        print(f"  10-unit run #{i + 1}: all Jobs after {seconds[-1]:.3f} s", flush=True)
        drop_namespace(cp, ns)
    return seconds


def cpu_seconds(cp: ControlPlane, operator: Operator) -> dict[str, float]:
    """CPU seconds (user + system) so far of each control plane process, the operator and
    this benchmark (its creating threads and watches): which of them the two cores went to."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {p.name: p.popen.pid for p in cp._procs}
    pids["evalkube operator"] = operator.proc.pid
    pids["this benchmark"] = os.getpid()
    used: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return used


def burst(
    cp: ControlPlane,
    client: Client,
    watcher: Watcher,
    operator: Operator,
    runs: int,
    units: int,
    timeout: float,
) -> dict[str, Any]:
    """``runs`` EvalRuns of ``units`` units each, created at once (16 concurrent creates)."""
    ns = new_namespace(cp, "burst")
    cp.apply(suite(ns, rows=units * 5))
    time.sleep(0.5)
    objects = [from_dict(run(ns, f"r{i:04d}", shard_size=5)) for i in range(runs)]
    before = api_requests(cp)
    cpu_before = cpu_seconds(cp, operator)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=CREATE_CONCURRENCY) as pool:
        list(pool.map(client.create, objects))
    applied = time.monotonic() - started
    print(f"  {runs} EvalRuns created in {applied:.2f} s", flush=True)
    done = wait(
        lambda: len(d := watcher.run_done_times(ns, units)) >= runs and d,
        timeout,
        f"Jobs of {runs} runs",
        interval=0.2,
    )
    requests = api_requests(cp) - before
    cpu_burst = cpu_seconds(cp, operator)
    listed = get_json(cp, "get", "events", "-n", ns) or {"items": []}
    events: Counter[str] = Counter()
    for event in listed["items"]:
        events[str(event.get("reason", ""))] += int(event.get("count") or 1)
    added = watcher.added(ns)
    per_run = sorted(t - added[r] for r, t in done.items())
    jobs = runs * units
    raw = raw_creates(cp, client, watcher, ns, jobs)
    cpu_raw = cpu_seconds(cp, operator)
    print(f"  raw: {jobs} Jobs created straight through the API server in {raw:.2f} s", flush=True)
    return {
        "raw": raw,
        "jobs": jobs,
        "applied": applied,
        "p50": statistics.median(per_run),
        "p90": per_run[int(len(per_run) * 0.9) - 1],
        "max": per_run[-1],
        "all": max(done.values()) - started,
        "requests": requests,
        "events": events,
        "cpu_burst": {k: v - cpu_before.get(k, 0.0) for k, v in cpu_burst.items()},
        "cpu_raw": {k: v - cpu_burst.get(k, 0.0) for k, v in cpu_raw.items()},
    }


def api_requests(cp: ControlPlane) -> Counter[str]:
    """The API server's requests so far that change something or read one object, by verb
    and resource (``apiserver_request_total``; lists and watches left out): what the burst
    costs it, the operator's and the Job controller's requests together."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    counts: Counter[str] = Counter()
    for found in re.finditer(r"^apiserver_request_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        if labels.get("verb") in ("LIST", "WATCH"):
            continue
        resource = "/".join(filter(None, (labels.get("resource"), labels.get("subresource"))))
        counts[f"{labels.get('verb')} {resource}"] += int(float(found.group(2)))
    return counts


def _plain_labels(labels: dict[str, str] | None) -> dict[str, str]:
    """Labels without the Job controller's and evalkube's own (the operator must not take
    the raw Jobs for units, and the Job controller sets its own selector)."""
    return {
        k: v
        for k, v in (labels or {}).items()
        if "controller-uid" not in k
        and k not in ("batch.kubernetes.io/job-name", "job-name")
        and "evalkube.io" not in k
        and "app.kubernetes.io" not in k
    }


def raw_creates(
    cp: ControlPlane, client: Client, watcher: Watcher, source_ns: str, count: int
) -> float:
    """Seconds to create ``count`` Jobs like one the operator made in ``source_ns``, straight
    through the API server with the burst's concurrency, until the watch has seen every one:
    the limit the operator's burst is compared with."""
    template = get_json(cp, "get", "jobs", "-n", source_ns, "-o", "json")["items"][0]
    ns = new_namespace(cp, "raw")
    meta = template["metadata"]
    spec = dict(template["spec"])
    spec.pop("selector", None)
    pod_meta = dict(spec["template"]["metadata"])
    pod_meta["labels"] = _plain_labels(pod_meta.get("labels"))
    spec["template"] = {**spec["template"], "metadata": pod_meta}
    labels = _plain_labels(meta.get("labels"))
    objects = [
        Job.from_dict(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": f"raw-{i:05d}",
                    "namespace": ns,
                    "labels": labels,
                },
                "spec": spec,
            }
        )
        for i in range(count)
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=CREATE_CONCURRENCY) as pool:
        list(pool.map(client.create, objects))
    wait(lambda: len(watcher.job_times(ns)) >= count, 600, f"{count} raw Jobs", interval=0.05)
    seconds = max(watcher.job_times(ns).values()) - started
    drop_namespace(cp, ns)
    return seconds


def play(
    cp: ControlPlane,
    client: Client,
    watcher: Watcher,
    operator: Operator,
    name: str,
    units: int,
    rows_per_unit: int,
    sandbox: str,
) -> dict[str, float]:
    """Run one EvalRun to the end, playing each Pod; its status writes."""
    ns = new_namespace(cp, f"play-{name}")
    cp.apply(suite(ns, rows=units * rows_per_unit))
    time.sleep(0.5)
    patches_before = operator.metric("evalkube_status_patches_total")
    started = time.monotonic()
    client.create(from_dict(run(ns, name, shard_size=rows_per_unit)))
    secret = wait(
        lambda: get_json(cp, "get", "secret", f"{name}-ingest", "-n", ns),
        30,
        "the ingest token",
        interval=0.2,
    )
    token = base64.b64decode(secret["data"]["token"]).decode()
    workdir = Path(tempfile.mkdtemp(prefix=f"evalkube-bench-{name}-"))
    snapshot = workdir / "snapshot.json"
    snapshot.write_text(
        cp.kubectl_json("get", "configmap", f"{name}-snapshot", "-n", ns)["data"]["snapshot.json"]
    )

    def play_one(job: str) -> None:
        unit = client.get(Job, job, namespace=ns).metadata.annotations["evalkube.io/unit-id"]  # type: ignore[union-attr,index]
        done = run_unit_command(snapshot, unit, operator.url, token, sandbox, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"unit {unit} failed: {done.stderr[-2000:]}")
        pods = cp.kubectl_json("get", "pods", "-n", ns, "-l", f"job-name={job}")["items"]
        for pod in pods:
            cp.kubectl(
                "annotate",
                "pod",
                pod["metadata"]["name"],
                "-n",
                ns,
                f"{COMPLETE_ANNOTATION}=true",
                "--overwrite",
            )

    played: set[str] = set()
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = []
        while True:
            phase = (cp.kubectl_json("get", "evalrun", name, "-n", ns).get("status") or {}).get(
                "phase"
            )
            if phase in ("Succeeded", "Failed"):
                break
            for job in watcher.job_times(ns):
                if job not in played:
                    played.add(job)
                    futures.append(pool.submit(play_one, job))
            for future in futures:
                if future.done():
                    future.result()
            time.sleep(0.3)
    if phase != "Succeeded":
        raise RuntimeError(f"run {ns}/{name} ended {phase}")
    elapsed = time.monotonic() - started
    time.sleep(1.0)  # the last writes reach the watch
    drop_namespace(cp, ns)
    return {
        "units": units,
        "samples": units * rows_per_unit,
        "patches": operator.metric("evalkube_status_patches_total") - patches_before,
        "writes": watcher.writes(ns, name),
        "seconds": elapsed,
    }


def complete_pods(cp: ControlPlane, ns: str, job: str) -> None:
    for pod in cp.kubectl_json("get", "pods", "-n", ns, "-l", f"job-name={job}")["items"]:
        cp.kubectl(
            "annotate",
            "pod",
            pod["metadata"]["name"],
            "-n",
            ns,
            f"{COMPLETE_ANNOTATION}=true",
            "--overwrite",
        )


def done_latency(
    cp: ControlPlane, client: Client, watcher: Watcher, operator: Operator, index: int
) -> dict[str, float]:
    """One 3-unit run, parallelism 1 (``EVALKUBE_PARALLELISM=1``), its units played in turn."""
    ns = new_namespace(cp, f"done-{index}")
    name = "three"
    cp.apply(suite(ns, rows=6))
    time.sleep(0.5)
    client.create(from_dict(run(ns, name, shard_size=2)))
    secret = wait(
        lambda: get_json(cp, "get", "secret", f"{name}-ingest", "-n", ns), 30, "the token", 0.1
    )
    token = base64.b64decode(secret["data"]["token"]).decode()
    snapshot = Path(tempfile.mkdtemp(prefix="evalkube-bench-done-")) / "snapshot.json"
    snapshot.write_text(
        cp.kubectl_json("get", "configmap", f"{name}-snapshot", "-n", ns)["data"]["snapshot.json"]
    )
    next_job: list[float] = []
    for step in range(3):
        jobs = wait(lambda n=step: len(j := watcher.job_times(ns)) > n and j, 60, f"Job {step + 1}")
        job = max(jobs, key=jobs.__getitem__)
        unit = client.get(Job, job, namespace=ns).metadata.annotations["evalkube.io/unit-id"]  # type: ignore[union-attr,index]
        done = run_unit_command(snapshot, unit, operator.url, token, "auto", timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"unit {unit} failed: {done.stderr[-2000:]}")
        reported = time.monotonic()
        complete_pods(cp, ns, job)
        if step < 2:
            more = wait(lambda n=step + 2: len(j := watcher.job_times(ns)) >= n and j, 60, "Job")
            next_job.append(max(more.values()) - reported)
    succeeded = wait(lambda: watcher.phase_time(ns, name, "Succeeded"), 60, "Succeeded")
    completed = wait(lambda: watcher.complete_time(ns, job), 60, "the last Job Complete")
    drop_namespace(cp, ns)
    return {
        "exit_to_next_job": statistics.median(next_job),
        "exit_to_status": succeeded - reported,
        "job_complete_to_status": succeeded - completed,
    }


# -- main -------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7, help="10-unit runs for the median")
    parser.add_argument("--runs", type=int, default=1000, help="EvalRuns in the burst")
    parser.add_argument("--burst-units", type=int, default=2, help="units per burst EvalRun")
    parser.add_argument("--burst-timeout", type=float, default=300.0)
    parser.add_argument("--sandbox", default="auto", help="sandbox of the played runners")
    parser.add_argument("--skip-play", action="store_true", help="skip the status-writes part")
    parser.add_argument(
        "--only",
        default="latency,play,burst,done",
        help="comma-separated parts to run: latency, play, burst, done",
    )
    parser.add_argument("--done-repeats", type=int, default=5, help="3-unit runs for part 4")
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of the operator (EVALKUBE_* settings)",
    )
    options = parser.parse_args()
    parts = set(options.only.split(","))
    if options.skip_play:
        parts.discard("play")
    extra_env = dict(item.split("=", 1) for item in options.operator_env)
    dones: list[dict[str, float]] = []
    seconds: list[float] = []
    many: dict[str, Any] = {}

    cp = ControlPlane(find_bin_dir())
    cp.start()
    print(f"control plane up in {cp.startup_seconds:.1f} s ({cp.server})", flush=True)
    operator: Operator | None = None
    try:
        crds = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
        cp.apply(
            [
                *crds,
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "gvisor"},
                    "handler": "runsc",
                },
            ]
        )
        cp.kubectl("wait", "--for=condition=Established", "crd", "--all")
        workdir = Path(tempfile.mkdtemp(prefix="evalkube-bench-operator-"))
        operator = Operator(cp, workdir, extra_env)
        print(f"operator up ({operator.url}); log {operator.log}", flush=True)
        client = Client(KubeConfig.from_file(cp.kubeconfig), field_manager="benchmark")
        watcher = Watcher(client)
        time.sleep(1.0)

        if "latency" in parts:
            print("1. latency: 10-unit EvalRun -> 10 Jobs", flush=True)
            seconds = latency(cp, client, watcher, options.repeats)

        plays: list[dict[str, float]] = []
        if "play" in parts:
            print("2. status writes per run (units played to the end)", flush=True)
            for name, units, rows in (("u10r10", 10, 10), ("u10r100", 10, 100), ("u20r10", 20, 10)):
                result = play(cp, client, watcher, operator, name, units, rows, options.sandbox)
                plays.append(result)
                print(
                    f"  {name}: {result['patches']:.0f} status patches, "
                    f"{result['writes']} writes in {result['seconds']:.1f} s",
                    flush=True,
                )

        if "burst" in parts:
            print(f"3. burst: {options.runs} EvalRuns x {options.burst_units} units", flush=True)
            many = burst(
                cp,
                client,
                watcher,
                operator,
                options.runs,
                options.burst_units,
                options.burst_timeout,
            )
        if "done" in parts:
            print("4. done -> status: 3-unit runs, parallelism 1", flush=True)
            for i in range(options.done_repeats):
                dones.append(done_latency(cp, client, watcher, operator, i))
                print("  " + ", ".join(f"{k} {v:.3f} s" for k, v in dones[-1].items()), flush=True)
        created = operator.metric("evalkube_jobs_created_total")
    finally:
        if operator is not None:
            operator.stop()
        cp.stop()

    print()
    print(f"{'measure':<52} {'value':>12} {'target':>10}  met")
    print("-" * 84)
    lat_ok = burst_ok = True
    if seconds:
        median = statistics.median(seconds)
        lat_ok = median <= LATENCY_TARGET
        print(
            f"{'10-unit run: apply -> all Jobs, median of ' + str(len(seconds)):<52} "
            f"{median:>10.3f} s {LATENCY_TARGET:>8.1f} s  {'yes' if lat_ok else 'NO'}"
        )
        print(f"{'  min / max':<52} {min(seconds):>5.3f}/{max(seconds):.3f}")
    if many:
        ratio = many["all"] / many["raw"]
        burst_ok = (
            many["all"] <= BURST_TARGET * options.runs / 200 and ratio <= BURST_RAW_RATIO_TARGET
        )
        label = f"{options.runs} runs at once: apply -> every run's Jobs"
        print(f"{label:<52} {many['all']:>10.2f} s {BURST_TARGET * options.runs / 200:>8.1f} s")
        print(
            f"{'  raw: as many Jobs created straight (16 concurrent)':<52} {many['raw']:>10.2f} s"
        )
        print(
            f"{'  operator / raw':<52} {ratio:>10.2f} x {BURST_RAW_RATIO_TARGET:>8.1f} x  "
            f"{'yes' if burst_ok else 'NO'}"
        )
        print(f"{'  creating the EvalRuns (16 concurrent creates)':<52} {many['applied']:>10.2f} s")
        print(
            f"{'  per run, its ADDED event -> its Jobs p50/p90/max':<52} "
            f"{many['p50']:>5.2f}/{many['p90']:.2f}/{many['max']:.2f} s"
        )
        requests = many["requests"]
        print(
            f"{'  API requests per run (no lists or watches)':<52} "
            f"{sum(requests.values()) / options.runs:>10.2f}"
        )
        for what, count in requests.most_common():
            if count >= options.runs / 10:
                print(f"{'    ' + what:<52} {count / options.runs:>10.2f}")
        print(f"{'  Events per run, by reason':<52}")
        for reason, count in many["events"].most_common():
            print(f"{'    ' + reason:<52} {count / options.runs:>10.2f}")
        print(f"{'  CPU seconds, burst / raw create':<52} {'burst':>10} {'raw':>10}")
        for what, used in sorted(many["cpu_burst"].items(), key=lambda kv: -kv[1]):
            print(f"{'    ' + what:<52} {used:>10.1f} {many['cpu_raw'].get(what, 0.0):>10.1f}")
        print(
            f"{'    all of them':<52} {sum(many['cpu_burst'].values()):>10.1f} "
            f"{sum(many['cpu_raw'].values()):>10.1f}"
        )
    for key in ("exit_to_next_job", "exit_to_status", "job_complete_to_status"):
        if dones:
            values = [d[key] for d in dones]
            label = f"done: {key.replace('_', ' ')}, median of {len(values)}"
            print(
                f"{label:<52} {statistics.median(values):>10.3f} s   "
                f"(min {min(values):.3f}, max {max(values):.3f})"
            )
    print(f"{'  Jobs created by the operator (all scenarios)':<52} {created:>12.0f}")
    growth_ok = True
    if plays:
        print()
        print(
            f"{'run':<10} {'units':>6} {'samples':>8} {'status patches':>15} {'EvalRun writes':>15}"
        )
        for p, name in zip(plays, ("u10r10", "u10r100", "u20r10"), strict=True):
            print(
                f"{name:<10} {p['units']:>6.0f} {p['samples']:>8.0f} {p['patches']:>15.0f} "
                f"{p['writes']:>15.0f}"
            )
        base, more_rows, more_units = plays
        growth_ok = more_rows["patches"] <= base["patches"] * 1.2 + 1
        print(
            "status patches with 10x samples: "
            f"{more_rows['patches']:.0f} vs {base['patches']:.0f} "
            f"({'no growth' if growth_ok else 'GROWS'}); with 2x units: "
            f"{more_units['patches']:.0f}"
        )
    print()
    ok = lat_ok and burst_ok and growth_ok
    print("all targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
