"""Benchmark: a million samples through a cluster run's result path, and the operator's memory.

Not a test. Starts its own loopback control plane (``tests.cluster.ctrlplane.ControlPlane``:
etcd, kube-apiserver, controller-manager, scheduler, kwok) and, per scenario, a fresh operator
as its own process (``evalkube operator`` with a fresh store, default settings otherwise, and
a kwok hold annotation on work-unit pods). Each scenario is one EvalRun of N samples: a task
whose dataset is a ConfigMap of up to 500,000 rows (``1`` lines: the operator counts them, the
played runners never read them) run with as many precomputed models as make N, in shards of
10,000 rows (100k samples: 1 model, 10 shards; 1M: 2 models of 50 shards, 100 units).

Its runners are played as processes (``--play-unit``, this file). Each does at start what a
work-unit pod's runner does (the resume look-ups of
:func:`evalkube.engine.runner.run_shard`: its shard's recorded and generation-errored ids,
its kept answers), then posts its shard's samples through the runner's own store client
(:class:`~evalkube.store.remote.RemoteStore` behind a :class:`~evalkube.store.SampleWriter`,
chunks of ``limits.STORE_CHUNK_SIZE``) and reports the unit done; the benchmark then lets kwok
complete the unit's Pod. The last unit's first Pod dies half way (its Job's retry is played
too), so one start is a retried Pod's.

Printed per scenario:

- **samples/s through the result path** (runner -> ingest API -> store): samples / seconds
  from the first runner's start to the last unit's done report; and the run's wall time to
  ``Succeeded``, and from the last done report to ``Succeeded`` (the finish: aggregation
  over the units' kept aggregates);
- **operator memory**: its RSS before the run, its peak (the kernel's VmHWM), and after;
  its CPU seconds per 100k samples;
- **bytes each Pod downloads at start** (answers of its start-up look-ups): the largest of a
  first attempt, the retried Pod's (its shard's ids), and what that retried Pod would have
  downloaded asking for its task x model's ids, as it did before (the same route without
  ``seq_from``/``seq_to``, asked once more by the benchmark);
- the run's results: sample counts equal to N (nothing lost, nothing counted twice).

Then ratios between the scenarios: peak RSS (must be flat), start downloads (must not grow
with shards), samples/s.

    EVALKUBE_CTRLPLANE_BIN=$(bash .ci/cluster.sh | tail -1) \\
        .venv/bin/python benchmarks/cluster_scale.py                 # 100k and 1M samples
    .venv/bin/python benchmarks/cluster_scale.py --samples 100000,300000 --runners 3
    .venv/bin/python benchmarks/cluster_scale.py --store postgresql  # a local PostgreSQL
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import httpx  # noqa: E402

from evalkube import limits  # noqa: E402
from evalkube.engine.answers import AnswerLog  # noqa: E402
from evalkube.engine.plan import SEQ_STRIDE, Unit, sample_id, seq_range  # noqa: E402
from evalkube.engine.snapshot import parse_snapshot  # noqa: E402
from evalkube.models.snapshot import RunSnapshot  # noqa: E402
from evalkube.store import SampleRecord, SampleWriter  # noqa: E402
from evalkube.store.remote import RemoteStore  # noqa: E402
from evalkube.util import jsonfast  # noqa: E402

ROOT = _ROOT
EVALKUBE = str(Path(sys.executable).parent / "evalkube")
EXACT = (ROOT / "examples/recipes/graders/exact_match.py").read_text()
#: Rows of the task's dataset at most (a ConfigMap of ``1`` lines holds ~500k in its 1 MiB;
#: the operator counts them, the played runners never read them); past it, more models.
MAX_ROWS = 500_000
SHARD_SIZE = 10_000


# -- a played runner (a subprocess of the benchmark) ------------------------------------------
class CountingTransport(httpx.HTTPTransport):
    """Counts the bytes of every answer's body, by route."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, int] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = response.read()
        route = request.url.path.rsplit("/", 1)[-1]
        self.bytes[route] = self.bytes.get(route, 0) + len(body)
        return httpx.Response(
            response.status_code, headers=response.headers, content=body, request=request
        )


def sample(run_id: str, unit: Unit, position: int) -> SampleRecord:
    """A sample as a graded exact-match shard stores it (texts of a short QA task)."""
    seq = unit.shard * SEQ_STRIDE + position
    row = unit.start + position
    kind = position % 20
    record = SampleRecord(
        run_id,
        sample_id(run_id, unit.task_id, unit.model, seq),
        unit.task_id,
        unit.model,
        seq,
        "valid",
        str(row),
        prompt=f"Answer with the number only. What is {row} + 0? Think, then answer briefly.",
        target=str(row),
        output_text=f"The answer is {row}." if kind else "I do not know.",
        extracted_output=str(row) if kind else None,
        scores={"exact_match": 1.0 if kind else 0.0},
        dataset_row={"q": f"What is {row} + 0?", "a": str(row)},
        timings={"grade_ms": 0.05},
    )
    if kind == 0:
        record.status = "invalid"
    elif kind == 1:
        record.status, record.scores = "errored", {}
        record.error = {"stage": "extraction", "type": "ExtractionMiss", "message": "no number"}
    return record


def play_unit(args: argparse.Namespace) -> None:
    """Be one work-unit Pod's runner: start-up look-ups, then the shard's samples, then done."""
    snapshot = parse_snapshot(RunSnapshot.model_validate_json(Path(args.snapshot).read_text()))
    unit = snapshot.unit(args.play_unit)
    transport = CountingTransport()
    store = RemoteStore(
        args.ingest, snapshot.namespace, snapshot.name, args.token, transport=transport
    )
    started = time.perf_counter()
    try:
        seqs = seq_range(unit)
        # what run_shard asks when a pod resumes (every pod does: a retried Job may be one)
        done = store.recorded_sample_ids(snapshot.run_id, unit.task_id, unit.model, seqs)
        done -= store.generation_errored_ids(snapshot.run_id, unit.task_id, unit.model, seqs)
        ids = [
            sample_id(snapshot.run_id, unit.task_id, unit.model, unit.shard * SEQ_STRIDE + p)
            for p in range(unit.stop - unit.start)
        ]
        answers = AnswerLog(store, snapshot.run_id, grader_calls=False)
        answers.kept([i for i in ids if i not in done])
        answers.close()
        start_bytes = sum(transport.bytes.values())
        whole = 0
        if args.compare_whole:
            # What this pod downloaded before it asked for its shard's ids only: the answers
            # of the same routes for its whole task x model, rebuilt here from one bounded
            # look-up per shard (asking the operator for all of them at once would make the
            # operator's own peak memory that of the old path, which is what is measured).
            recorded: set[str] = set()
            errored: set[str] = set()
            for other in snapshot.units():
                if (other.task_id, other.model, other.kind) == (unit.task_id, unit.model, "shard"):
                    key = (snapshot.run_id, unit.task_id, unit.model, seq_range(other))
                    recorded |= store.recorded_sample_ids(*key)
                    errored |= store.generation_errored_ids(*key)
            whole = len(jsonfast.dumps({"sample_ids": sorted(recorded)})) + len(
                jsonfast.dumps({"sample_ids": sorted(errored)})
            )
        rows = unit.stop - unit.start
        stop_at = rows // 2 if args.die_half_way else rows
        writer = SampleWriter(store)
        chunk: list[SampleRecord] = []
        posted = 0
        for position in range(stop_at):
            record = sample(snapshot.run_id, unit, position)
            if record.sample_id in done:
                continue
            chunk.append(record)
            if len(chunk) >= limits.STORE_CHUNK_SIZE:
                writer.submit(chunk)
                posted += len(chunk)
                chunk = []
        if chunk:
            writer.submit(chunk)
            posted += len(chunk)
        writer.close()
        if args.die_half_way:
            print(json.dumps({"unit": unit.unit_id, "died": True, "start_bytes": start_bytes}))
            sys.exit(1)
        store.mark_unit_done(
            unit.unit_id,
            {"kind": unit.kind, "samples": posted, "skipped": len(done), "seconds": 0},
        )
        reported = time.time()
    finally:
        store.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "unit": unit.unit_id,
                "samples": posted,
                "skipped": len(done),
                "start_bytes": start_bytes,
                "whole_bytes": whole,
                "retried": args.compare_whole,
                "seconds": time.perf_counter() - started,
                "reported": reported,
                "cpu": usage.ru_utime + usage.ru_stime,
            }
        )
    )


# -- the operator -----------------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (bytes) of a process."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Operator:
    """``evalkube operator`` in its own process, on loopback ports and a fresh store."""

    def __init__(self, cp: Any, workdir: Path, store_url: str, env: dict[str, str]) -> None:
        from tests.cluster.ctrlplane import HOLD_ANNOTATION, free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = f"http://127.0.0.1:{free_port()}"
        self.log = workdir / "operator.log"
        settings = {
            **cp.env,
            "EVALKUBE_STORE_URL": store_url,
            "EVALKUBE_LISTEN": f"127.0.0.1:{self.port}",
            "EVALKUBE_API_LISTEN": self.api.removeprefix("http://"),
            "EVALKUBE_INGEST_URL": self.url,
            "EVALKUBE_POD_ANNOTATIONS": json.dumps({HOLD_ANNOTATION: "true"}),
            **env,
        }
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [EVALKUBE, "operator"], env=settings, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 90
        while not self._healthy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator did not start; see {self.log}")
            time.sleep(0.2)
        self.rss_samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._sample_rss, daemon=True).start()

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited; see {self.log}")
        try:
            with urllib.request.urlopen(f"{self.api}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _sample_rss(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.rss_samples.append((time.monotonic(), proc_status(self.proc.pid)["VmRSS"]))
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- one scenario -----------------------------------------------------------------------------
def objects(namespace: str, rows_per_model: int, models: int) -> list[dict[str, Any]]:
    rows = "1\n" * rows_per_model
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "rows", "namespace": namespace},
            "data": {"rows.jsonl": rows},
        },
        {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalSuite",
            "metadata": {"name": "scale", "namespace": namespace},
            "spec": {
                "tasks": [
                    {
                        "id": "qa",
                        "dataset": {"configMapRef": {"name": "rows", "key": "rows.jsonl"}},
                        "prompt": "{{ item.q }}",
                        "target": "{{ item.a }}",
                        "outputs": {"column": "out"},
                        "grader": {"type": "python", "source": EXACT, "metricId": "exact_match"},
                    }
                ]
            },
        },
        {
            "apiVersion": "evalkube.io/v1alpha1",
            "kind": "EvalRun",
            "metadata": {"name": "million", "namespace": namespace},
            "spec": {
                "suiteRef": {"name": "scale"},
                "models": [f"precomputed:m{i}" for i in range(models)],
                "shardSize": SHARD_SIZE,
            },
        },
    ]


@contextmanager
def store_url(kind: str, workdir: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'results.db'}"
        return
    from tests.support.postgres import postgres_server

    with postgres_server() as url:
        yield url


def scenario(
    cp: Any, samples: int, runners: int, store: str, env: dict[str, str]
) -> dict[str, Any]:
    from lightkube import Client, KubeConfig
    from lightkube.codecs import from_dict
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Pod, Secret
    from tests.cluster.ctrlplane import COMPLETE_ANNOTATION

    rows_per_model = min(samples, MAX_ROWS)
    models = max(1, samples // rows_per_model)
    EvalRun = create_namespaced_resource("evalkube.io", "v1alpha1", "EvalRun", "evalruns")
    create_namespaced_resource("evalkube.io", "v1alpha1", "EvalSuite", "evalsuites")
    namespace = f"scale-{samples}"
    load_before = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix=f"evalkube-scale-{samples}-"))
    client = Client(KubeConfig.from_file(cp.kubeconfig), field_manager="benchmark")
    cp.kubectl("create", "namespace", namespace)
    with ExitStack() as stack:
        url = stack.enter_context(store_url(store, workdir))
        operator = Operator(cp, workdir, url, env)
        stack.callback(operator.stop)
        time.sleep(2.0)  # let it settle before the baseline
        idle_rss = proc_status(operator.proc.pid)["VmRSS"]
        cpu_before = cpu_seconds(operator.proc.pid)
        created = time.monotonic()
        for manifest in objects(namespace, rows_per_model, models):  # no apply annotation
            client.create(from_dict(manifest))

        def token() -> str | None:
            try:
                secret = client.get(Secret, "million-ingest", namespace=namespace)
            except Exception:
                return None
            return base64.b64decode((secret.data or {})["token"]).decode()

        ingest_token = wait_for(token, 120, "the run's ingest token")
        snapshot_data = wait_for(
            lambda: (cp.kubectl_json("get", "configmap", "million-snapshot", "-n", namespace)
                     ["data"]["snapshot.json"]),
            120,
            "the run's snapshot",
        )  # fmt: skip
        snapshot_file = workdir / "snapshot.json"
        snapshot_file.write_text(snapshot_data)
        units = parse_snapshot(RunSnapshot.model_validate_json(snapshot_data)).units()
        last = units[-1].unit_id
        print(
            f"  {len(units)} units of {SHARD_SIZE:,} rows: {rows_per_model:,} rows x {models} "
            f"models ({rows_per_model // SHARD_SIZE} shards per task x model)",
            flush=True,
        )

        lock = threading.Lock()
        reports: list[dict[str, Any]] = []
        running: dict[str, subprocess.Popen[str]] = {}
        played: set[str] = set()
        first_start: list[float] = []
        last_done: list[float] = []
        died = False

        def start(unit: str, job: str, *, die: bool = False, compare: bool = False) -> None:
            command = [
                sys.executable, __file__, "--play-unit", unit, "--snapshot", str(snapshot_file),
                "--ingest", operator.url, f"--token={ingest_token}",  # it may start with -
            ]  # fmt: skip
            if die:
                command.append("--die-half-way")
            if compare:
                command.append("--compare-whole")
            first_start or first_start.append(time.monotonic())
            running[job] = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )

        def complete(job: str) -> None:
            for pod in client.list(Pod, namespace=namespace, labels={"job-name": job}):
                assert pod.metadata is not None
                assert pod.metadata.name is not None
                client.patch(
                    Pod,
                    pod.metadata.name,
                    {"metadata": {"annotations": {COMPLETE_ANNOTATION: "true"}}},
                    namespace=namespace,
                )

        phase = ""
        while phase not in ("Succeeded", "Failed"):
            jobs = {
                (j.metadata.annotations or {})["evalkube.io/unit-id"]: j.metadata.name
                for j in client.list(Job, namespace=namespace)
                if j.metadata is not None and j.metadata.name
            }
            for unit, job in sorted(jobs.items()):
                if unit not in played and len(running) < runners:
                    played.add(unit)
                    start(unit, job, die=unit == last)  # the last unit's first Pod dies
            for job, proc in list(running.items()):
                if proc.poll() is None:
                    continue
                out, err = proc.communicate()
                del running[job]
                report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
                if report.get("died"):
                    died = True
                    with lock:
                        reports.append(report)
                    start(report["unit"], job, compare=True)  # the Job's retried Pod
                    continue
                if proc.returncode != 0:
                    raise RuntimeError(f"played runner of {job} failed: {err[-3000:]}")
                with lock:
                    reports.append(report)
                complete(job)
            run = client.get(EvalRun, "million", namespace=namespace).to_dict()
            phase = (run.get("status") or {}).get("phase") or ""
            time.sleep(0.1)
        finished, finished_at = time.monotonic(), time.time()
        for proc in list(running.values()):  # done reported, their output not read yet
            out, _ = proc.communicate(timeout=60)
            reports.append(json.loads(out.strip().splitlines()[-1]))
        assert died, "the retried Pod was played"
        last_report = max(r.get("reported", 0.0) for r in reports)
        last_done[:] = [finished - (finished_at - last_report)]
        time.sleep(1.0)
        status = run["status"]
        peak = proc_status(operator.proc.pid)["VmHWM"]
        after_rss = proc_status(operator.proc.pid)["VmRSS"]
        cpu = cpu_seconds(operator.proc.pid) - cpu_before
        rss_series = list(operator.rss_samples)
    store_bytes = sum(p.stat().st_size for p in workdir.glob("results.db*"))
    load = f"{load_before:.1f} / {os.getloadavg()[0]:.1f}"
    cp.kubectl("delete", "namespace", namespace, "--wait=false")
    counted = sum(r["counts"]["samples"] for r in status.get("results") or [])
    firsts = [r["start_bytes"] for r in reports if not r.get("retried") and not r.get("died")]
    retried = [r for r in reports if r.get("retried")]
    if not retried:
        raise RuntimeError(f"no retried pod among {reports}; status {json.dumps(status)[:3000]}")
    path_seconds = last_done[0] - first_start[0]
    return {
        "samples": samples,
        "units": len(units),
        "shards": rows_per_model // SHARD_SIZE,
        "phase": status["phase"],
        "counted": counted,
        "wall": finished - created,
        "path_seconds": path_seconds,
        "rate": samples / path_seconds,
        "finish": finished - last_done[0],
        "idle_rss": idle_rss,
        "peak_rss": peak,
        "after_rss": after_rss,
        "median_rss": statistics.median(r for _, r in rss_series) if rss_series else 0,
        "peak_at": max(rss_series, key=lambda s: s[1])[0] - last_done[0] if rss_series else 0,
        "cpu": cpu,
        "runner_cpu": sum(r.get("cpu", 0.0) for r in reports),
        "first_start_bytes": max(firsts),
        "retried_start_bytes": retried[0]["start_bytes"],
        "retried_skipped": retried[0]["skipped"],
        "whole_bytes": retried[0]["whole_bytes"],
        "store_bytes": store_bytes,
        "load": load,
    }


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def mib(value: float) -> str:
    return f"{value / 2**20:.0f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", default="100000,1000000", help="comma-separated sizes")
    parser.add_argument("--runners", type=int, default=4, help="played runners at once")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument(
        "--operator-env", action="append", default=[], metavar="NAME=VALUE",
        help="extra environment of the operator (EVALKUBE_* settings)",
    )  # fmt: skip
    # a played runner (the benchmark's own subprocesses)
    parser.add_argument("--play-unit", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    parser.add_argument("--ingest", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--die-half-way", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compare-whole", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.play_unit:
        play_unit(args)
        return 0

    import yaml
    from tests.cluster.ctrlplane import ControlPlane, find_bin_dir

    env = dict(item.split("=", 1) for item in args.operator_env)
    env.setdefault("EVALKUBE_PARALLELISM", str(args.runners))
    sizes = [int(s) for s in args.samples.split(",")]
    cp = ControlPlane(find_bin_dir())
    cp.start()
    print(f"control plane up in {cp.startup_seconds:.1f} s ({cp.server})", flush=True)
    results = []
    try:
        crds = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
        runtime = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "gvisor"},
            "handler": "runsc",
        }
        cp.apply([*crds, runtime])
        cp.kubectl("wait", "--for=condition=Established", "crd", "--all")
        for samples in sizes:
            print(f"{samples:,} samples ({args.store}, {args.runners} runners at once)", flush=True)
            started = time.monotonic()
            result = scenario(cp, samples, args.runners, args.store, env)
            results.append(result)
            print(
                f"  {result['phase']} after {time.monotonic() - started:.0f} s: "
                f"{result['rate']:,.0f} samples/s, operator peak {mib(result['peak_rss'])}",
                flush=True,
            )
    finally:
        cp.stop()

    print()
    header = f"{'':<44}" + "".join(f"{r['samples']:>14,}" for r in results)
    print(header)
    print("-" * len(header))

    def row(label: str, values: list[str]) -> None:
        print(f"{label:<44}" + "".join(f"{v:>14}" for v in values))

    row("units (shards of 10,000 rows)", [str(r["units"]) for r in results])
    row("shards per task x model", [str(r["shards"]) for r in results])
    row("run phase", [r["phase"] for r in results])
    row("samples in the status results", [f"{r['counted']:,}" for r in results])
    row("result path: samples/s", [f"{r['rate']:,.0f}" for r in results])
    row("result path: seconds", [f"{r['path_seconds']:.1f}" for r in results])
    row("create -> Succeeded: seconds", [f"{r['wall']:.1f}" for r in results])
    row("last done report -> Succeeded: seconds", [f"{r['finish']:.2f}" for r in results])
    row("operator RSS before the run", [mib(r["idle_rss"]) for r in results])
    row("operator RSS median during the run", [mib(r["median_rss"]) for r in results])
    row("operator peak RSS (VmHWM)", [mib(r["peak_rss"]) for r in results])
    row("  highest RSS seen, s after the last report", [f"{r['peak_at']:+.1f}" for r in results])
    row("operator RSS after the run", [mib(r["after_rss"]) for r in results])
    row("operator CPU seconds per 100k samples", [f"{r['cpu'] / r['samples'] * 1e5:.1f}" for r in results])  # noqa: E501  # fmt: skip
    row("played runners' CPU seconds per 100k", [f"{r['runner_cpu'] / r['samples'] * 1e5:.1f}" for r in results])  # noqa: E501  # fmt: skip
    row("pod start download, first attempt (max)", [f"{r['first_start_bytes']:,} B" for r in results])  # noqa: E501  # fmt: skip
    row("pod start download, retried pod", [f"{r['retried_start_bytes']:,} B" for r in results])
    row("  its shard's recorded ids", [f"{r['retried_skipped']:,}" for r in results])
    row("  asking for its task x model (before)", [f"{r['whole_bytes']:,} B" for r in results])
    if args.store == "sqlite":
        row("store on disk", [mib(r["store_bytes"]) for r in results])
    row("load average (1 min) before / after", [r["load"] for r in results])
    if len(results) > 1:
        small, big = results[0], results[-1]
        print()
        print(f"ratios {big['samples']:,} / {small['samples']:,} samples:")
        print(f"  samples                               {big['samples'] / small['samples']:.1f}x")
        print(f"  units                                 {big['units'] / small['units']:.1f}x")
        print(f"  operator peak RSS                     {big['peak_rss'] / small['peak_rss']:.2f}x")
        growth = big["peak_rss"] - small["peak_rss"]
        print(f"  operator peak RSS growth              {mib(growth)}")
        whole = big["whole_bytes"] / max(1, small["whole_bytes"])
        print(
            f"  retried pod's start download          "
            f"{big['retried_start_bytes'] / small['retried_start_bytes']:.2f}x "
            f"(asking for its task x model: {whole:.2f}x)"
        )
        print(f"  samples/s                             {big['rate'] / small['rate']:.2f}x")
    ok = all(r["phase"] == "Succeeded" and r["counted"] == r["samples"] for r in results)
    print()
    print("every sample counted once" if ok else "SAMPLES LOST OR COUNTED TWICE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
