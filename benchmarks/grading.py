"""Grading throughput and memory: a bare in-process loop vs the engine end to end.

Not a test: prints figures and ratios. For each grader (exact match, token F1) it grades N
precomputed samples (a) in a bare loop calling ``grade()`` in this process and (b) through
the engine end to end (dataset -> render -> extraction -> sandboxed worker -> validation ->
SQLite store -> aggregates), each engine pass in a fresh process so peak RSS is its own.

    python benchmarks/grading.py                 # 100k samples, sandbox=process
    python benchmarks/grading.py --sizes 10000 100000 1000000 --sandbox auto
    python benchmarks/grading.py --sizes 10000 --sandbox auto --isolation unit sample
"""

from __future__ import annotations

import argparse
import json
import resource
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
    from evalkube.engine import LocalEngine, load_files, resolve_run_spec
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
        f"{'ratio':>7} {'peak RSS MB':>12} {'CPU µs/sample':>14}  {'isolation':<9} sandbox"
    )
    per_second: dict[tuple[str, int, str], float] = {}
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
        print(
            f"{grader:<12} {size:>9,} {bare:>12,.0f} {result['workers']:>7} "
            f"{result['per_second']:>10,.0f} {bare / result['per_second']:>6.0f}x "
            f"{result['peak_rss_mb']:>12.0f} {result['cpu_us']:>14.1f}  {isolation:<9} "
            f"{result['sandbox']}"
        )
        per_second[grader, size, isolation] = result["per_second"]
    for (grader, size, isolation), rate in per_second.items():
        unit = per_second.get((grader, size, "unit"))
        if isolation == "sample" and unit:
            print(f"isolation: sample costs {unit / rate:.1f}x unit for {grader} at {size:,}")
    print(
        "target: engine >= 40,000 samples/s for exact_match at 100k; peak RSS flat from 10k to 1M"
    )


if __name__ == "__main__":
    main()
