"""Run an ``evalkube`` command as an attacker's input would: in a child process with a
memory ceiling, and report the child's peak RSS so a test can assert the host stayed small.

The ceiling (``RLIMIT_AS`` of 3 GiB) only keeps a regression from taking the machine down;
the assertion is on the measured peak (``wait4`` rusage, taken by ``peak_launcher.py`` so
that pytest's own size is not counted), which must stay under :data:`PEAK_RSS_MB`. Wall
time is measured by ``benchmarks/attacks.py``, not asserted: with ``EVALKUBE_ATTACK_LOG``
set, every run appends its figures to that JSONL file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

EVALKUBE = Path(sys.executable).parent / "evalkube"
LAUNCHER = Path(__file__).resolve().with_name("peak_launcher.py")
PEAK_RSS_MB = 500
SAFETY_AS_BYTES = 3 * 1024**3


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    peak_rss_mb: float
    seconds: float


def run_bounded(
    *args: str | Path,
    cwd: Path | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    address_space: bool = True,
) -> Outcome:
    """``evalkube ARGS`` in a child; its exit code, output, peak RSS (MB) and wall time.

    ``address_space=False`` drops the ``RLIMIT_AS`` ceiling (gVisor reserves far more
    address space than it uses).
    """
    started = time.monotonic()
    figures_file = Path(tempfile.mkstemp(prefix="evalkube-peak-", suffix=".json")[1])
    limit = SAFETY_AS_BYTES if address_space else 0
    child = subprocess.Popen(
        [sys.executable, str(LAUNCHER), str(figures_file), str(limit), str(EVALKUBE)]
        + [str(a) for a in args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        start_new_session=True,
    )
    try:
        stdout, stderr_bytes = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        _, stderr_bytes = child.communicate()
        figures_file.unlink(missing_ok=True)
        raise AssertionError(
            f"evalkube {' '.join(map(str, args))} was killed after {timeout} s: "
            f"{stderr_bytes.decode('utf-8', 'replace')[-2000:]}"
        ) from None
    seconds = time.monotonic() - started
    stderr = stderr_bytes.decode("utf-8", "replace")
    try:
        measured = json.loads(figures_file.read_text(encoding="utf-8"))
    finally:
        figures_file.unlink(missing_ok=True)
    outcome = Outcome(
        measured["code"],
        stdout.decode("utf-8", "replace"),
        stderr,
        measured["peak_rss_kb"] / 1024,
        seconds,
    )
    log = os.environ.get("EVALKUBE_ATTACK_LOG")
    if log:
        figures = {
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
            "command": " ".join(Path(str(a)).name if "/" in str(a) else str(a) for a in args),
            "code": outcome.code,
            "seconds": round(seconds, 2),
            "peak_rss_mb": round(outcome.peak_rss_mb, 1),
        }
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(figures) + "\n")
    return outcome
