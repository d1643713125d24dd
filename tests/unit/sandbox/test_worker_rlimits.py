"""The worker's own rlimits (``evalkube_sandbox.rlimits``), checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import evalkube_sandbox

WORKER_ROOT = str(Path(evalkube_sandbox.__file__).resolve().parent.parent)


def _run(code: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {WORKER_ROOT!r})\n{code}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_fixed_limits_are_set_soft_and_hard() -> None:
    out = _run(
        "import json, resource\n"
        "from evalkube_sandbox.rlimits import apply_fixed\n"
        "failed = apply_fixed({'memory_bytes': 512 << 20, 'file_bytes': 1 << 20, 'open_files': 64,"
        " 'bogus': 1, 'processes': True})\n"
        "print(json.dumps({'failed': failed, 'as': resource.getrlimit(resource.RLIMIT_AS),"
        " 'fsize': resource.getrlimit(resource.RLIMIT_FSIZE),"
        " 'nofile': resource.getrlimit(resource.RLIMIT_NOFILE),"
        " 'core': resource.getrlimit(resource.RLIMIT_CORE)}))\n"
    )
    assert out == {
        "failed": {},
        "as": [512 << 20, 512 << 20],
        "fsize": [1 << 20, 1 << 20],
        "nofile": [64, 64],
        "core": [0, 0],
    }


def test_cpu_budget_raises_in_user_code_only() -> None:
    out = _run(
        "import json, time\n"
        "from evalkube_sandbox.rlimits import CpuBudget, CpuTimeLimitExceeded\n"
        "inside = [False]\n"
        "budget = CpuBudget(lambda: inside[0])\n"
        "budget.install()\n"
        "budget.set(1)\n"
        "result = 'no limit'\n"
        "try:\n"
        "    inside[0] = True\n"
        "    while True:\n"
        "        pass\n"
        "except CpuTimeLimitExceeded as exc:\n"
        "    result = str(exc)\n"
        "finally:\n"
        "    inside[0] = False\n"
        "print(json.dumps({'result': result, 'cpu': time.process_time()}))\n"
    )
    assert out["result"] == "the grader used more than 1 CPU seconds in one execution"
    assert out["cpu"] < 5
