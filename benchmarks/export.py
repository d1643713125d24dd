"""Sample export speed and memory: ``evalkube samples --format jsonl|csv --out FILE``.

Not a test: prints figures. Seeds a SQLite store with N samples (a few hundred bytes of text
each), then exports all of them in a fresh ``evalkube`` process per size and format, so the
peak RSS printed is that process's own. Flat RSS across sizes is the streaming claim.

    python benchmarks/export.py                      # 10k and 100k samples
    python benchmarks/export.py --sizes 10000 1000000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evalkube.store import ResultStore, RunRecord, SampleRecord

EVALKUBE = Path(sys.executable).parent / "evalkube"


def seed(url: str, n: int) -> None:
    store = ResultStore.open(url)
    try:
        store.create_run(RunRecord("bench", "bench", "sha256:0", {}, "process"))
        chunk: list[SampleRecord] = []
        for i in range(n):
            chunk.append(
                SampleRecord(
                    "bench",
                    f"s{i:08d}",
                    f"t{i % 4}",
                    "m",
                    i,
                    "valid",
                    prompt=f"Question {i}: " + "lorem ipsum " * 10,
                    target=str(i),
                    output_text=f"The answer is {i}. " + "dolor sit amet " * 10,
                    scores={"exact": float(i % 2), "f1": (i % 100) / 100},
                )
            )
            if len(chunk) == 5000:
                store.record_samples(chunk)
                chunk = []
        store.record_samples(chunk)
    finally:
        store.close()


def export(url: str, fmt: str, out: Path) -> tuple[float, float]:
    """Seconds and the peak RSS (MiB) of that one export process (``wait4``'s rusage)."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [str(EVALKUBE), "samples", "bench", "--format", fmt, "--out", str(out), "--db", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"export failed with exit {child.returncode}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    print(f"{'samples':>10} {'format':>6} {'seconds':>8} {'samples/s':>10} {'peak RSS MiB':>13}")
    for n in sorted(args.sizes):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'r.db'}"
            seed(url, n)
            for fmt in ("jsonl", "csv"):
                out = Path(tmp) / f"out.{fmt}"
                seconds, rss = export(url, fmt, out)
                print(f"{n:>10} {fmt:>6} {seconds:>8.2f} {n / seconds:>10.0f} {rss:>13.1f}")


if __name__ == "__main__":
    main()
