"""`evalkube run` with a gate in the run file exits 1 when the gate fails (CI gates on it), and
`evalkube compare` reports the paired change between two runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import EXAMPLES

EVALKUBE = Path(sys.executable).parent / "evalkube"
SUITE = EXAMPLES / "recipes" / "suite.yaml"


def run(args: list[str], db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVALKUBE), *args, "--db", str(db)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def run_file(tmp_path: Path, name: str, gate: dict[str, object]) -> Path:
    path = tmp_path / f"{name}.yaml"
    spec = {"models": ["precomputed"], "gate": gate}
    path.write_text(yaml.safe_dump({"kind": "EvalRun", "metadata": {"name": name}, "spec": spec}))
    return path


def test_a_failed_gate_exits_1_and_compare_shows_no_change(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    loose = run_file(tmp_path, "loose", {"thresholds": [{"metric": "exact_match", "min": 0.1}]})
    out = tmp_path / "loose.json"
    first = run(["run", str(SUITE), str(loose), "--sandbox", "process", "-o", str(out)], db)
    assert first.returncode == 0, first.stderr
    assert "gate passed" in first.stdout
    assert json.loads(out.read_text())["gate"]["passed"] is True

    strict = run_file(
        tmp_path,
        "strict",
        {
            "thresholds": [{"metric": "exact_match", "min": 0.99}],
            "baseline": {"lastSucceeded": True},
        },
    )
    out2 = tmp_path / "strict.json"
    second = run(["run", str(SUITE), str(strict), "--sandbox", "process", "-o", str(out2)], db)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "gate failed" in second.stderr
    assert "< 0.99" in second.stderr
    gate = json.loads(out2.read_text())["gate"]
    first_id = json.loads(out.read_text())["run_id"]
    assert gate["baseline"] == first_id  # lastSucceeded: the loose run

    second_id = json.loads(out2.read_text())["run_id"]
    compared = run(["compare", first_id, second_id, "--json"], db)
    assert compared.returncode == 0, compared.stderr
    metrics = json.loads(compared.stdout)["metrics"]
    assert metrics
    assert all(m["delta"] == 0 and m["regressed"] == 0 for m in metrics)
