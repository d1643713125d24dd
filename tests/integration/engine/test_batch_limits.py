"""A ``grade_batch`` unit is bounded: past :data:`limits.BATCH_SAMPLES_MAX`
samples or :data:`limits.BATCH_SAMPLES_BYTES` its runner fails the unit with a reason naming
the task and what to do, reported to the operator as the unit's failure reason, instead of
being killed for memory; up to the limit it runs within the runner's 512 Mi.

``evalkube unit`` as its pod runs it (in a wrapper that prints the process's peak RSS when it
exits), against the operator's real ingest server on loopback and a real SQLite store that
holds the task's samples as its shard pods left them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evalkube import limits
from evalkube.controller.snapshot import build_snapshot, check_suite
from evalkube.engine.plan import sample_id
from evalkube.reporting.console import EXIT_CONFIG
from evalkube.store import ResultStore, RunRecord, SampleRecord

from .test_pod_start_downloads import NAME, NS, RUN_ID, TOKEN, UID, counting_ingest

pytestmark = pytest.mark.timeout(600)

BATCH = """
def grade_batch(samples):
    return {"metrics": {"n": float(len(samples))}}
"""
#: A pod's runner container memory limit (OperatorSettings.runner_memory).
RUNNER_MEMORY = 512 * 2**20
#: Runs ``evalkube unit`` in this process and prints its peak RSS (bytes) at exit: the
#: kernel's VmHWM of this process's memory (``ru_maxrss`` would include the RSS of the parent
#: it was spawned from).
WRAPPER = (
    "import atexit, re, sys\n"
    "def peak():\n"
    "    status = open('/proc/self/status').read()\n"
    "    kib = re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)\n"
    "    print('PEAK_RSS', int(kib) * 1024, file=sys.stderr)\n"
    "atexit.register(peak)\n"
    "from evalkube.cli import main\n"
    "sys.argv = ['evalkube', *sys.argv[1:]]\n"
    "main()\n"
)


def snapshot_file(tmp_path: Path) -> Path:
    spec = {
        "tasks": [
            {
                "id": "batchy",
                "dataset": {"rows": [{"q": "q0", "out": "a"}]},
                "prompt": "{{ item.q }}",
                "outputs": {"column": "out"},
                "grader": {"type": "python", "contract": "batch", "source": BATCH},
            }
        ]
    }
    check = check_suite(NS, spec, lambda ns, cm, key: None)
    assert check.ok, check.problems
    run = {
        "metadata": {"namespace": NS, "name": NAME, "uid": UID},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"]},
    }
    snapshot = build_snapshot(run, RUN_ID, "qa", check)
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snapshot.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def pending(count: int, text_bytes: int) -> list[SampleRecord]:
    out = []
    for seq in range(count):
        sid = sample_id(RUN_ID, "batchy", "precomputed", seq)
        record = SampleRecord(RUN_ID, sid, "batchy", "precomputed", seq, "pending")
        record.output_text = f"{seq} " + "o" * text_bytes
        record.dataset_row = {"q": f"q{seq}", "out": "a"}
        out.append(record)
    return out


def run_batch_unit(
    tmp_path: Path, samples: list[SampleRecord]
) -> tuple[int, str, int, ResultStore]:
    """The task's aggregate unit over ``samples``: exit code, output, peak RSS, the store."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    snapshot = snapshot_file(tmp_path)
    store = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    store.create_run(RunRecord(RUN_ID, "qa", "sha256:x", {}, "pod"))
    store.record_samples(samples)
    del samples[:]
    with counting_ingest(store) as (ingest, _):
        done = subprocess.run(
            [
                sys.executable, "-c", WRAPPER, "unit", "--snapshot", str(snapshot),
                "--unit", "batchy.precomputed.batch", "--ingest-url", ingest,
                "--sandbox", "process",
            ],
            env={**os.environ, "EVALKUBE_INGEST_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=500,
        )  # fmt: skip
    peak = re.search(r"PEAK_RSS (\d+)", done.stderr)
    assert peak is not None, done.stderr
    return done.returncode, done.stdout + done.stderr, int(peak.group(1)), store


def test_too_many_samples_fail_the_batch_unit_with_the_reason_reported(tmp_path: Path) -> None:
    code, out, peak, store = run_batch_unit(tmp_path, pending(limits.BATCH_SAMPLES_MAX + 1, 10))
    try:
        assert code == EXIT_CONFIG, out
        [(unit, reason)] = store.failed_units(RUN_ID).items()
        assert unit == "batchy.precomputed.batch"
        assert "task 'batchy', model 'precomputed': grade_batch gets every sample" in reason
        assert f"limit of {limits.BATCH_SAMPLES_MAX:,} samples" in reason
        assert "split the task's dataset into several tasks" in reason
        assert store.done_units(RUN_ID) == set()
        assert {s.status for s in store.iter_samples(RUN_ID)} == {"pending"}  # nothing half-set
    finally:
        store.close()
    print(f"count limit: runner peak RSS {peak / 2**20:.0f} MiB")
    assert peak < RUNNER_MEMORY, f"peak RSS {peak / 2**20:.0f} MiB"


def test_too_many_bytes_fail_the_batch_unit_and_just_under_the_limit_it_runs(
    tmp_path: Path,
) -> None:
    text = 100_000
    over = limits.BATCH_SAMPLES_BYTES // text + 10
    code, out, peak, store = run_batch_unit(tmp_path / "over", pending(over, text))
    try:
        assert code == EXIT_CONFIG, out
        [reason] = store.failed_units(RUN_ID).values()
        assert f"or {limits.BATCH_SAMPLES_BYTES // 2**20} MiB" in reason
    finally:
        store.close()
    assert peak < RUNNER_MEMORY, f"peak RSS {peak / 2**20:.0f} MiB"

    under = int(limits.BATCH_SAMPLES_BYTES * 0.95) // (text + 600)
    code, out, peak, store = run_batch_unit(tmp_path / "under", pending(under, text))
    try:
        assert code == 0, out
        assert store.done_units(RUN_ID) == {"batchy.precomputed.batch"}
        [result] = store.task_results(RUN_ID)
        assert result.metrics == {"n": float(under)}
    finally:
        store.close()
    print(f"grade_batch of {under} samples ({under * text / 2**20:.0f} MiB): runner peak RSS "
          f"{peak / 2**20:.0f} MiB")  # fmt: skip
    assert peak < RUNNER_MEMORY, f"peak RSS {peak / 2**20:.0f} MiB"
