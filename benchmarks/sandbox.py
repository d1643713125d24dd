"""Sandbox figures: cold start per backend, per-sample overhead, 100k exact-match samples.

Not a test: run it and read the figures (``.venv/bin/python -P benchmarks/sandbox.py``;
``-P`` keeps the ``benchmarks/`` folder off ``sys.path``, where a module may shadow the stdlib).

- cold start: ``GraderSandbox.start()`` (spawn, worker hello, program load) and ``close()``,
  median of ``--starts`` runs;
- per-sample overhead: µs per sample of a persistent worker above calling ``grade``
  in-process, over ``--samples`` executions of a trivial grader;
- throughput: ``--samples`` exact-match samples end to end through the session, cold start
  and close included, against the same grader called in-process.

``--environment both`` measures each backend with the grader environment mounted (``default``)
and without it (``stdlib``), one after the other, plus the cold start of a grader that imports
rapidfuzz at load (OpenAI's docs example): what a grader that imports nothing pays for the
environment, and what one that imports pays.

The engine adds validation and storage on top; this measures the sandbox session alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from evalkube.sandbox import AUTO_ORDER, GraderSandbox, Program, SandboxBackend, availability
from evalkube.sandbox.environment import LocalEnvironment

EXACT_MATCH = """
def grade(sample, item):
    return 1.0 if sample["output_text"].strip() == item["target"] else 0.0
"""


def _items(count: int) -> Iterator[tuple[list[Any], str | None]]:
    for i in range(count):
        target = str(i % 97)
        output = target if i % 4 else "wrong"
        sample = {"output_text": output, "sample_id": f"s{i}", "model": "m", "task_id": "t"}
        item = {"target": target, "prompt": f"What is {i}?", "task_id": "t"}
        yield [sample, item], None


def in_process(count: int) -> tuple[float, float]:
    """Seconds and score sum of calling ``grade`` directly."""
    namespace: dict[str, Any] = {}
    exec(compile(EXACT_MATCH, "grader.py", "exec"), namespace)
    grade = namespace["grade"]
    started = time.perf_counter()
    total = sum(grade(*args) for args, _ in _items(count))
    return time.perf_counter() - started, total


RAPIDFUZZ = """
from rapidfuzz import fuzz, utils

def grade(sample, item):
    return fuzz.WRatio(sample["output_text"], item["target"], processor=utils.default_process)
"""
#: ``--environment`` names -> what GraderSandbox gets (``None``: the managed environment).
ENVIRONMENTS: dict[str, LocalEnvironment | None] = {
    "default": None,
    "stdlib": LocalEnvironment(None),
}


def cold_start(
    backend: SandboxBackend,
    runs: int,
    environment: LocalEnvironment | None = None,
    source: str = EXACT_MATCH,
) -> tuple[float, float]:
    """Median seconds of ``start()`` and of ``close()``."""
    starts: list[float] = []
    closes: list[float] = []
    for _ in range(runs):
        sandbox = GraderSandbox(
            backend,
            [Program("grader", source, "grader.py", "grade")],
            task_id="t",
            environment=environment,
        )
        began = time.perf_counter()
        sandbox.start()
        started = time.perf_counter()
        sandbox.close()
        starts.append(started - began)
        closes.append(time.perf_counter() - started)
    return statistics.median(starts), statistics.median(closes)


def through(
    backend: SandboxBackend, count: int, environment: LocalEnvironment | None = None
) -> tuple[float, float, float]:
    """Seconds end to end (start + grade + close), seconds grading only, score sum."""
    began = time.perf_counter()
    sandbox = GraderSandbox(
        backend,
        [Program("grader", EXACT_MATCH, "grader.py", "grade")],
        task_id="t",
        environment=environment,
    )
    sandbox.start()
    grading = time.perf_counter()
    total = 0.0
    for execution in sandbox.execute("grader", _items(count), timeout=10):
        if execution.status != "returned":
            raise SystemExit(
                f"{backend.name}: sample {execution.index} {execution.status}: {execution.error}"
            )
        total += execution.value
    graded = time.perf_counter()
    sandbox.close()
    return time.perf_counter() - began, graded - grading, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--backends", default=",".join(AUTO_ORDER))
    parser.add_argument("--environment", choices=["default", "stdlib", "both"], default="default")
    args = parser.parse_args(argv)
    environments = ["default", "stdlib"] if args.environment == "both" else [args.environment]

    reasons = availability()
    base_seconds, base_total = in_process(args.samples)
    base_rate = args.samples / base_seconds
    print(
        f"in-process: {args.samples} samples in {base_seconds * 1000:.0f} ms = {base_rate:,.0f}/s"
    )
    print()
    header = (
        f"{'backend':16} {'start ms':>9} {'close ms':>9} {'µs/sample':>10} {'overhead µs':>12} "
        f"{'samples/s':>10} {'incl. start':>12} {'vs in-process':>14}"
    )
    print(header)
    print("-" * len(header))
    for name in args.backends.split(","):
        reason = reasons.get(name, "unknown backend")
        if reason is not None:
            print(f"{name:16} unavailable: {reason}")
            continue
        backend = SandboxBackend.registry[name]()
        for env_name in environments:
            environment = ENVIRONMENTS[env_name]
            label = f"{name}/{env_name}"
            start, close = cold_start(backend, args.starts, environment)
            end_to_end, grading, total = through(backend, args.samples, environment)
            if total != base_total:
                print(
                    f"{label}: scores differ from in-process ({total} != {base_total})",
                    file=sys.stderr,
                )
                return 1
            per_sample = grading / args.samples * 1e6
            overhead = per_sample - base_seconds / args.samples * 1e6
            rate = args.samples / grading
            rate_all = args.samples / end_to_end
            print(
                f"{label:16} {start * 1000:9.0f} {close * 1000:9.0f} {per_sample:10.1f} "
                f"{overhead:12.1f} {rate:10,.0f} {rate_all:12,.0f} {base_rate / rate_all:13.1f}x"
            )
        if "default" in environments:
            start, _ = cold_start(backend, args.starts, None, RAPIDFUZZ)
            print(f"{name + '/rapidfuzz':16} {start * 1000:9.0f}  (cold start, imports at load)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
