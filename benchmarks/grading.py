"""Grading throughput and memory: the engine end to end next to the limits of its sandbox.

Not a test: prints figures and ratios. For each grader (exact match, token F1) it grades N
precomputed samples (a) in a bare loop calling ``grade()`` in this process and (b) through
the engine end to end (dataset -> render -> extraction -> sandboxed worker -> validation ->
SQLite store -> aggregates), each engine pass in a fresh process so peak RSS is its own.

In the same run, under the same sandbox (the same runsc and platform for ``gvisor``), it
measures what the sandbox itself allows, and prints the engine's ratio to each:

- **raw pipe**: the same dataset file read and its (output, target) pairs sent as JSON lines,
  1,000 a batch, to a bare Python worker that compares them and answers each batch; the
  sandbox's start is included. The ceiling of ``isolation: unit``.
- **fork per sample**: inside the same sandbox, a worker that forks a child per sample, which
  answers on a pipe and is reaped. The ceiling of ``isolation: sample``.

    python benchmarks/grading.py                 # 100k samples, sandbox=process
    python benchmarks/grading.py --sizes 10000 100000 1000000 --sandbox auto
    python benchmarks/grading.py --sizes 10000 --sandbox auto --isolation unit sample
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

EXACT = textwrap.dedent(
    """
    def grade(sample, item):
        return 1.0 if sample["extracted_output"] == item["target"] else 0.0
    """
)
TOKEN_F1 = textwrap.dedent(
    """
    import re
    from collections import Counter

    def tokens(text):
        return re.findall(r"\\w+", (text or "").lower())

    def grade(sample, item):
        pred, gold = tokens(sample.get("output_text", "")), tokens(item.get("target", ""))
        if not pred and not gold:
            return 1.0
        if not pred or not gold:
            return 0.0
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            return 0.0
        p, r = common / len(pred), common / len(gold)
        return {"scores": {"token_f1": 2 * p * r / (p + r)}}
    """
)
GRADERS = {"exact_match": EXACT, "token_f1": TOKEN_F1}


def write_suite(folder: Path, grader: str, size: int, isolation: str = "unit") -> Path:
    with (folder / "rows.jsonl").open("w") as handle:
        for i in range(size):
            answer = str(i % 97)
            output = answer if i % 4 else str(i % 89)
            handle.write(
                json.dumps(
                    {"q": f"What is {i} mod 97?", "a": answer, "out": f"the answer {output}"}
                )
                + "\n"
            )
    suite = {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": f"bench-{grader}"},
        "spec": {
            "tasks": [
                {
                    "id": grader,
                    "dataset": {"path": "rows.jsonl"},
                    "prompt": "Q: {{ item.q }}",
                    "target": "{{ item.a }}",
                    "extraction": {"type": "regex", "pattern": r"(\d+)"},
                    "outputs": {"column": "out"},
                    "grader": {
                        "type": "python",
                        "source": GRADERS[grader],
                        "metricId": grader,
                        "isolation": isolation,
                    },
                }
            ]
        },
    }
    path = folder / "suite.json"
    path.write_text(json.dumps(suite))
    (folder / "run.json").write_text(
        json.dumps(
            {
                "kind": "EvalRun",
                "metadata": {"name": "bench"},
                "spec": {"models": ["precomputed"], "shardSize": 10000},
            }
        )
    )
    return path


#: The raw-pipe worker: JSON-line batches of ``[output, target]`` in, a line of scores out.
RAW_PIPE_WORKER = """
import json, sys
read, write = sys.stdin.buffer.readline, sys.stdout.buffer
while line := read():
    write.write(json.dumps([1.0 if o == t else 0.0 for o, t in json.loads(line)]).encode() + b"\\n")
    write.flush()
"""
#: The fork-per-sample worker: for each line, a child compares the pair and answers on a pipe
#: (as ``isolation: sample`` forks a clean child per execution), the parent reaps it.
FORK_WORKER = """
import json, os, sys
read, write = sys.stdin.buffer.readline, sys.stdout.buffer
while line := read():
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        o, t = json.loads(line)
        os.write(wfd, json.dumps(1.0 if o == t else 0.0).encode())
        os._exit(0)
    os.close(wfd)
    answer = os.read(rfd, 64)
    os.close(rfd)
    os.waitpid(pid, 0)
    write.write(answer + b"\\n")
    write.flush()
"""
RAW_BATCH = 1_000


@contextlib.contextmanager
def _worker_program(program: str):  # type: ignore[no-untyped-def]
    """The sandbox backends start ``program`` instead of the grader worker (same command
    line, container, limits and platform)."""
    from evalkube.sandbox import backends

    modules = (backends,)  # every backend's command line comes from backends.worker_argv
    saved = [getattr(m, "WORKER_BOOTSTRAP") for m in modules]  # noqa: B009
    for module in modules:
        setattr(module, "WORKER_BOOTSTRAP", program)  # noqa: B010
    try:
        yield
    finally:
        for module, value in zip(modules, saved, strict=True):
            setattr(module, "WORKER_BOOTSTRAP", value)  # noqa: B010


def _pairs(rows: Path, limit: int | None = None) -> list[list[str]]:
    pairs = []
    with rows.open("rb") as handle:
        for line in handle:
            row = json.loads(line)
            pairs.append([row["out"], row["a"]])
            if limit is not None and len(pairs) == limit:
                break
    return pairs


def raw_pipe(sandbox: str, rows: Path) -> float:
    """Samples/s of the raw pipe (see the module docstring), the sandbox's start included."""
    from evalkube.sandbox import SpawnRequest, resolve_backend

    backend = resolve_backend(sandbox)
    started = time.perf_counter()
    with _worker_program(RAW_PIPE_WORKER):
        worker = backend.spawn(SpawnRequest(environment=None))
    try:
        total = 0.0
        count = 0
        batch: list[list[str]] = []
        with rows.open("rb") as handle:
            for line in handle:
                row = json.loads(line)
                batch.append([row["out"], row["a"]])
                if len(batch) == RAW_BATCH:
                    total += _round_trip(worker, batch)
                    count += len(batch)
                    batch = []
        if batch:
            total += _round_trip(worker, batch)
            count += len(batch)
        return count / (time.perf_counter() - started)
    finally:
        worker.close()


def _round_trip(worker, batch: list[list[str]]) -> float:  # type: ignore[no-untyped-def]
    worker.stdin.write(json.dumps(batch).encode() + b"\n")
    worker.stdin.flush()
    return float(sum(json.loads(worker.stdout.readline())))


def fork_per_sample(sandbox: str, rows: Path, size: int) -> float:
    """Samples/s of a fork per sample inside the sandbox (its start included)."""
    from evalkube.sandbox import SpawnRequest, resolve_backend

    pairs = _pairs(rows, size)
    backend = resolve_backend(sandbox)
    started = time.perf_counter()
    with _worker_program(FORK_WORKER):
        worker = backend.spawn(SpawnRequest(environment=None))
    try:
        for pair in pairs:
            worker.stdin.write(json.dumps(pair).encode() + b"\n")
            worker.stdin.flush()
            worker.stdout.readline()
        return len(pairs) / (time.perf_counter() - started)
    finally:
        worker.close()


def host_floor(rows: Path) -> float:
    """Samples per CPU second of the least a CPython host must do per sample in the default
    mode, in one thread, with no sandbox at all: parse the row, render prompt and target,
    extract, encode the worker's batch, decode its answers (scored here by a comparison),
    check each score, encode the stored row and upsert it into SQLite (a ``json_each`` chunk,
    as the store does), and sum the metric. A bound on the engine's host side: what no
    object, validation detail or bookkeeping of the engine adds."""
    import orjson

    lines = rows.read_bytes().splitlines()
    extract = re.compile(r"(\d+)").search
    with tempfile.TemporaryDirectory(prefix="evalkube-floor-") as tmp:
        db = sqlite3.connect(Path(tmp) / "floor.db")
        db.execute("CREATE TABLE s (id TEXT PRIMARY KEY, status TEXT, scores TEXT, detail TEXT)")
        upsert = (
            "INSERT INTO s SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 "
            "FROM json_each(?) WHERE true ON CONFLICT (id) DO UPDATE SET status = excluded.status"
        )
        started = time.process_time()
        total = 0.0
        for start in range(0, len(lines), RAW_BATCH):
            kept, requests = [], []
            for seq, line in enumerate(lines[start : start + RAW_BATCH], start):
                row = orjson.loads(line)
                prompt, target, output = f"Q: {row['q']}", str(row["a"]), row["out"]
                found = extract(output)
                extracted = found.group(1).strip() if found else None
                sample_id = f"s_0123456789_{seq:013x}"
                requests.append(
                    [{"output_text": output, "extracted_output": extracted, "sample_id": sample_id},
                     {"prompt": prompt, "target": target, **row}]
                )  # fmt: skip
                kept.append((sample_id, prompt, target, output, extracted, row))
            batch = orjson.loads(orjson.dumps(requests))
            answers = orjson.loads(
                orjson.dumps([{"ok": True, "value": float(s["extracted_output"] == i["target"]),
                               "ms": 0.01} for s, i in batch])
            )  # fmt: skip
            stored = []
            for (sample_id, prompt, target, output, extracted, row), answer in zip(
                kept, answers, strict=True
            ):
                value = answer["value"]
                if type(value) is not float or value != value:
                    raise AssertionError(value)
                total += value
                detail = {"prompt": prompt, "target": target, "output_text": output,
                          "extracted_output": extracted, "dataset_row": row}  # fmt: skip
                stored.append(
                    (sample_id, "valid", orjson.dumps({"m": value}).decode(),
                     orjson.dumps(detail).decode())
                )  # fmt: skip
            with db:
                db.execute(upsert, (orjson.dumps(stored).decode(),))
        seconds = time.process_time() - started
        db.close()
    return len(lines) / seconds


def bare_loop(grader: str, size: int) -> float:
    """Samples/s of a bare loop calling grade() on prebuilt dicts (the ceiling)."""
    namespace: dict[str, object] = {}
    exec(compile(GRADERS[grader], "grader.py", "exec"), namespace)
    grade = namespace["grade"]
    samples = []
    for i in range(size):
        answer = str(i % 97)
        output = answer if i % 4 else str(i % 89)
        samples.append(
            (
                {"extracted_output": output, "output_text": f"the answer {output}"},
                {"target": answer},
            )
        )
    started = time.perf_counter()
    for sample, item in samples:
        grade(sample, item)  # type: ignore[operator]
    return size / (time.perf_counter() - started)


def engine_pass(suite: Path, sandbox: str, db: Path, workers: int | None) -> dict[str, float]:
    """Run the engine in this process; report samples/s and this process's peak RSS."""
    from evalkube.engine import load_files, resolve_run_spec
    from evalkube.local import LocalEngine
    from evalkube.sandbox import resolve_backend
    from evalkube.store import ResultStore

    loaded, run = load_files(suite, suite.parent / "run.json")
    spec = resolve_run_spec(loaded, run, None)
    store = ResultStore.open(f"sqlite:///{db}")
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    engine = LocalEngine(store, resolve_backend(sandbox), workers=workers)
    summary = engine.start(loaded, spec)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    samples = sum(r.counts.samples for r in summary.results)
    own_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "samples": samples,
        "seconds": seconds,
        "per_second": samples / seconds,
        "workers": engine.last_workers,
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent. Unit
        # processes are forks (no exec): their ru_maxrss is their own peak.
        "peak_rss_mb": max(
            _vm_hwm_mb(), children.ru_maxrss / 1024 if engine.last_workers > 1 else 0
        ),
        # CPU µs per sample of every process (engine, unit processes, sandboxes): robust
        # to other load on the machine
        "cpu_us": (own_cpu + children.ru_utime + children.ru_stime) / samples * 1e6,
        "sandbox": summary.sandbox,
        "metric": next(iter(summary.results[0].metrics.values())),
    }


def _vm_hwm_mb() -> float:
    """This process's own peak resident memory (MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--sandbox", default="process")
    parser.add_argument("--graders", nargs="+", default=list(GRADERS))
    parser.add_argument(
        "--isolation",
        nargs="+",
        default=["unit"],
        choices=["unit", "sample"],
        help="grader isolation modes to compare (`sample`: a fork per execution)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="unit processes (default: what `evalkube run` picks on this machine)",
    )
    parser.add_argument(
        "--inner", nargs=3, metavar=("SUITE", "SANDBOX", "DB"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.inner:
        suite, sandbox, db = args.inner
        print(json.dumps(engine_pass(Path(suite), sandbox, Path(db), args.workers)))
        return
    print(
        f"{'grader':<12} {'samples':>9} {'bare loop/s':>12} {'workers':>7} {'engine/s':>10} "
        f"{'limit/s':>10} {'of limit':>8} {'peak RSS MB':>12} {'CPU µs/sample':>14}  "
        f"{'isolation':<9} sandbox"
    )
    per_second: dict[tuple[str, int, str], float] = {}
    ratios: list[str] = []
    floors: list[tuple[str, int, float, float]] = []
    for grader, size, isolation in (
        (g, n, i) for g in args.graders for n in args.sizes for i in args.isolation
    ):
        bare = bare_loop(grader, min(size, 1_000_000))
        with tempfile.TemporaryDirectory(prefix="evalkube-bench-") as tmp:
            folder = Path(tmp)
            suite = write_suite(folder, grader, size, isolation)
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--inner",
                    str(suite),
                    args.sandbox,
                    str(folder / "r.db"),
                    *([f"--workers={args.workers}"] if args.workers else []),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            # the sandbox's own limit, measured now, on the same rows, beside the engine
            if isolation == "unit":
                limit, what = raw_pipe(args.sandbox, folder / "rows.jsonl"), "raw pipe"
                floors.append((grader, size, host_floor(folder / "rows.jsonl"), limit))
            else:
                limit = fork_per_sample(args.sandbox, folder / "rows.jsonl", size)
                what = "fork per sample"
        ratio = result["per_second"] / limit
        print(
            f"{grader:<12} {size:>9,} {bare:>12,.0f} {result['workers']:>7} "
            f"{result['per_second']:>10,.0f} {limit:>10,.0f} {ratio:>8.2f} "
            f"{result['peak_rss_mb']:>12.0f} {result['cpu_us']:>14.1f}  {isolation:<9} "
            f"{result['sandbox']}"
        )
        ratios.append(f"{grader} at {size:,}, isolation {isolation}: engine / {what} = {ratio:.2f}")
        per_second[grader, size, isolation] = result["per_second"]
    for line in ratios:
        print(line)
    cores = os.cpu_count() or 1
    for grader, size, floor, limit in floors:
        # at 0.5 of the raw pipe the run has 2 * size / limit seconds on `cores` cores
        share = (size / floor) / (2 * size / limit * cores)
        print(
            f"host floor at {size:,} ({grader}, one thread, no sandbox): {floor:,.0f} samples "
            f"per CPU second; it alone takes {share:.0%} of the CPU time that 0.5 of the raw "
            f"pipe leaves on {cores} cores (the sandbox and the engine's own work share the rest)"
        )
    for (grader, size, isolation), rate in per_second.items():
        unit = per_second.get((grader, size, "unit"))
        if isolation == "sample" and unit:
            print(f"isolation: sample costs {unit / rate:.1f}x unit for {grader} at {size:,}")
    print(
        "targets: isolation unit >= 0.5 of the raw pipe; isolation sample >= 0.7 of "
        "a fork per sample; peak RSS flat from 10k to 1M"
    )


if __name__ == "__main__":
    main()
