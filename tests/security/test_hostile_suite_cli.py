"""The hostile suite end to end: every attack as a task of one suite run by ``evalkube run``.

Per backend, one suite holds a control task and one task per attack the backend claims to
block, each over three rows (good, attack, good) with precomputed outputs. The engine runs
with a secret in its environment, a loopback listener up, and its results database and a
credentials file readable on the host. The test asserts the run completes (exit 0, every
task counted), the control task and the good rows are graded correctly, each attacked
sample is invalid or unaffected without anything stolen (``evalkube samples --json``), and
nothing of the sandboxes is left behind. A Ctrl-C of ``evalkube run`` leaves nothing either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.sandbox.support import (
    BACKENDS,
    alive,
    backend,
    cgroups_missing,
    descendants,
    leftovers,
)
from tests.security.attacks import ATTACKS, Attack, grader_source
from tests.security.conftest import Listener

EVALKUBE = Path(sys.executable).parent / "evalkube"
ROWS = [
    {"id": "r0", "output": "good"},
    {"id": "r1", "output": "attack"},
    {"id": "r2", "output": "good"},
]
CONTROL = {
    "id": "control",
    "dataset": {
        "idField": "id",
        "rows": [
            {"id": "c0", "answer": "4", "output": "4"},
            {"id": "c1", "answer": "5", "output": "6"},
            {"id": "c2", "answer": "7", "output": "7"},
        ],
    },
    "target": "{{ item.answer }}",
    "outputs": {"column": "output"},
    "grader": {
        "type": "python",
        "source": (
            "def grade(sample, item):\n"
            "    return 1.0 if sample['output_text'] == item['target'] else 0.0\n"
        ),
        "timeoutSeconds": 5,
    },
}


def _suite(attacks: list[Attack], params: dict[str, str]) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = [CONTROL]
    for attack in attacks:
        tasks.append(
            {
                "id": attack.name,
                "dataset": {"idField": "id", "rows": ROWS},
                "outputs": {"column": "output"},
                "grader": {
                    "type": "python",
                    "source": grader_source(attack, params, case='sample["output_text"]'),
                    "timeoutSeconds": max(1, round(attack.timeout)),
                },
            }
        )
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "hostile"},
        "spec": {"tasks": tasks},
    }


def _evalkube(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str, int]:
    """``(exit code, stdout, stderr, pid)`` of one ``evalkube`` command."""
    with subprocess.Popen(
        [str(EVALKUBE), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as command:
        out, err = command.communicate(timeout=240)
    return command.returncode, out, err, command.pid


def _env(secret: str) -> dict[str, str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb"}
    env.pop("EVALKUBE_DB", None)
    env["EVALKUBE_TEST_SECRET"] = secret
    env["OPENAI_API_KEY"] = secret
    return env


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", BACKENDS)
def test_hostile_suite_through_evalkube_run(
    name: str, listener: Listener, host_secrets: dict[str, str]
) -> None:
    backend(name)
    with_cgroups = cgroups_missing(name) is None
    workdir = Path(host_secrets["database"]).parent
    database = workdir / "evalkube.db"  # the run's own results DB: an attack target too
    params = {**host_secrets, "port": str(listener.port), "database": str(database)}
    attacks = [a for a in ATTACKS if name in a.blocked_by and (with_cgroups or not a.needs_cgroups)]
    suite = _suite(attacks, params)
    (workdir / "suite.yaml").write_text(json.dumps(suite, indent=1))
    env = _env(host_secrets["secret"])
    db_url = f"sqlite:///{database}"
    code, _, err, pid = _evalkube(
        "run", "suite.yaml", "--sandbox", name, "--output", "out.json", "--db", db_url, "-q",
        cwd=workdir,
        env=env,
    )  # fmt: skip

    assert code == 0, err
    output = json.loads((workdir / "out.json").read_text())
    assert output["phase"] == "Succeeded"
    assert output["sandbox"].startswith(name)
    results = {r["task"]: r for r in output["results"]}
    assert set(results) == {t["id"] for t in suite["spec"]["tasks"]}
    assert results["control"]["metrics"]["score"] == pytest.approx(2 / 3, abs=1e-4)
    assert results["control"]["counts"]["valid"] == 3

    code, shown, err, _ = _evalkube(
        "samples", output["run_id"], "--db", db_url, "--json", "--limit", "1000",
        cwd=workdir,
        env=env,
    )  # fmt: skip
    assert code == 0, err
    views: dict[tuple[str, str], dict[str, Any]] = {
        (v["task_id"], v["row_id"]): v for v in json.loads(shown)
    }
    for attack in attacks:
        assert results[attack.name]["counts"]["samples"] == 3, attack.name
        for row in ("r0", "r2"):
            good = views[(attack.name, row)]
            assert (good["status"], good["scores"]) == ("valid", {"score": 1.0}), good
        attacked = views[(attack.name, "r1")]
        attack.expect.check_view(attacked, host_secrets["secret"], "score")

    assert listener.accepted == 0
    assert not Path(host_secrets["host_file"]).exists()
    assert leftovers(pid).empty, leftovers(pid)


CTRL_C_SUITE = {
    "apiVersion": "evalkube.io/v1alpha1",
    "kind": "EvalSuite",
    "metadata": {"name": "interrupted"},
    "spec": {
        "tasks": [
            {
                "id": "slow",
                "dataset": {"rows": [{"output": "x"}] * 3},
                "outputs": {"column": "output"},
                "grader": {
                    "type": "python",
                    "source": "import time\ndef grade(sample, item):\n    time.sleep(300)\n",
                    "timeoutSeconds": 600,
                },
            }
        ]
    },
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", BACKENDS)
def test_ctrl_c_of_evalkube_run_leaves_nothing(name: str, workers: int, tmp_path: Path) -> None:
    backend(name)
    (tmp_path / "suite.yaml").write_text(json.dumps(CTRL_C_SUITE))
    # one row per unit: with two unit processes, two sandboxes are up when Ctrl-C comes
    (tmp_path / "run.yaml").write_text(
        json.dumps(
            {
                "kind": "EvalRun",
                "metadata": {"name": "r"},
                "spec": {"models": ["precomputed"], "shardSize": 1},
            }
        )
    )
    env = _env("unused")
    command = [str(EVALKUBE), "run", "suite.yaml", "run.yaml", "--sandbox", name, "-q"]
    command += ["--db", f"sqlite:///{tmp_path / 'r.db'}", f"--workers={workers}"]
    with subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as run:
        processes: set[tuple[int, str]] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not processes:
            time.sleep(0.2)
            processes = descendants(run.pid)
        assert processes, "the sandbox never started"
        time.sleep(1.5)  # sandbox up, programs loaded, the grader sleeping
        processes |= descendants(run.pid)

        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)

    assert run.returncode == 130, err
    assert "--resume" in err
    deadline = time.monotonic() + 15
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(processes) == set()
    for pid in {run.pid} | {pid for pid, _ in processes}:  # unit processes own sandboxes too
        assert leftovers(pid).empty, leftovers(pid)
