"""A run whose dataset and outputs are ``uri`` sources, on the real control plane: the operator
creates the prepare Job and no unit until its pod pins the sources, plans the units from the
pinned row counts, and every unit's runner reads only its rows; scores equal ``evalkube run``
over the same files. A source that changed after it was pinned fails its unit, named."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    EVALKUBE,
    OperatorUrl,
    _free_port,
    _jobs,
    finished,
    install_crds,
    running_operator,
)
from tests.integration.cluster.sources_support import play_runner

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

EXACT = "def grade(sample, item):\n    return float(sample['output_text'] == item['a'])\n"
ROWS = [{"id": f"r{i}", "q": f"{i}?", "a": str(i)} for i in range(230)]
OUTPUTS = [{"id": f"r{i}", "output_text": str(i) if i % 3 else "no"} for i in range(230)]


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorUrl]:
    install_crds(control_plane)
    store = tmp_path_factory.mktemp("operator") / "results.db"
    with running_operator(control_plane, store, _free_port(), parallelism="20") as url:
        yield url


def suite(namespace: str, dataset: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    task = {
        "id": "qa",
        "dataset": {**dataset, "idField": "id"},
        "target": "{{ item.a }}",
        "outputs": outputs,
        "grader": {"type": "python", "source": EXACT, "metricId": "exact_match"},
    }
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalSuite",
        "metadata": {"name": "qa", "namespace": namespace},
        "spec": {"tasks": [task]},
    }


def eval_run(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "evalkube.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suiteRef": {"name": "qa"}, "models": ["precomputed"], "shardSize": 50, **spec},
    }


def write_claim(claims: Path) -> None:
    """The claim ``data``: a Parquet dataset in row groups of 40, JSONL outputs."""
    (claims / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ROWS), claims / "data" / "rows.parquet", row_group_size=40)
    (claims / "data" / "outputs.jsonl").write_text("".join(json.dumps(o) + "\n" for o in OUTPUTS))


def local_scores(tmp: Path, claims: Path) -> dict[str, Any]:
    """``evalkube run`` of the same suite over the same files (local paths)."""
    local = suite("x", {"uri": str(claims / "data" / "rows.parquet")},
                  {"uri": str(claims / "data" / "outputs.jsonl")})  # fmt: skip
    (tmp / "suite.yaml").write_text(json.dumps(local))
    out = tmp / "local.json"
    done = subprocess.run(
        [EVALKUBE, "run", str(tmp / "suite.yaml"), "--sandbox", "process",
         "--db", str(tmp / "local.db"), "--output", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    results: dict[str, Any] = json.loads(out.read_text())
    return results


def test_a_run_over_pvc_sources_plans_from_the_pins_and_scores_as_evalkube_run(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    claims = tmp_path / "claims"
    write_claim(claims)
    cp.apply(suite(ns, {"uri": "pvc://data/rows.parquet"}, {"uri": "pvc://data/outputs.jsonl"}))
    cp.apply(eval_run(ns, "sourced"))
    jobs = cp.wait_for(lambda: _jobs(cp, ns) or None, timeout=60, what="the prepare Job")
    assert list(jobs) == ["@prepare"]  # nothing is planned before the pins
    phase = cp.kubectl_json("get", "evalrun", "sourced", "-n", ns)["status"]
    assert phase["phase"] == "Pending"
    assert any(c["reason"] == "Preparing" for c in phase["conditions"])
    prepared = play_runner(cp, ns, jobs["@prepare"], tmp_path / "prepare", claims)
    assert prepared.returncode == 0, prepared.stderr + prepared.stdout
    units = cp.wait_for(
        lambda: (j := _jobs(cp, ns)) and len(j) == 6 and j, timeout=60, what="5 unit Jobs"
    )
    shards = sorted(u for u in units if u != "@prepare")
    assert shards == [f"qa.precomputed.{i:05d}" for i in range(5)]  # 230 rows in 50s
    for unit in shards:
        done = play_runner(cp, ns, units[unit], tmp_path / unit, claims)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "50 samples recorded" in done.stdout or unit.endswith("4")
    status = cp.wait_for(lambda: finished(cp, ns, "sourced"), timeout=60, what="finished")
    assert status["phase"] == "Succeeded", status
    [result] = status["results"]
    local = local_scores(tmp_path, claims)
    [expected] = local["results"]
    assert result["metrics"] == pytest.approx(expected["metrics"])
    assert result["metrics"]["exact_match"] == pytest.approx(153 / 230)
    assert result["counts"] == {"samples": 230, "valid": 230, "invalid": 0, "errored": 0}
    assert status["suiteVersion"].startswith("sha256:")


def test_a_source_changed_after_it_was_pinned_fails_its_unit_named(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    claims = tmp_path / "claims"
    write_claim(claims)
    cp.apply(suite(ns, {"uri": "pvc://data/rows.parquet"}, {"column": "a"}))
    cp.apply(eval_run(ns, "changed", shardSize=200))
    jobs = cp.wait_for(lambda: _jobs(cp, ns) or None, timeout=60, what="the prepare Job")
    assert play_runner(cp, ns, jobs["@prepare"], tmp_path / "prepare", claims).returncode == 0
    units = cp.wait_for(
        lambda: (j := _jobs(cp, ns)) and len(j) == 3 and j, timeout=60, what="2 unit Jobs"
    )
    pq.write_table(pa.Table.from_pylist(ROWS[:100]), claims / "data" / "rows.parquet")
    done = play_runner(cp, ns, units["qa.precomputed.00000"], tmp_path / "u0", claims)
    assert done.returncode == 2, done.stderr + done.stdout
    play_runner(cp, ns, units["qa.precomputed.00001"], tmp_path / "u1", claims)
    status = cp.wait_for(lambda: finished(cp, ns, "changed"), timeout=60, what="finished")
    assert status["phase"] == "Failed"
    failed = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert (
        "unit qa.precomputed.00000: tasks[qa].dataset.uri: pvc://data/rows.parquet changed "
        "since the run pinned it" in failed["message"]
    ), failed


def test_a_missing_source_fails_the_run_before_any_unit(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    (tmp_path / "claims" / "data").mkdir(parents=True)
    cp.apply(suite(ns, {"uri": "pvc://data/absent.jsonl"}, {"column": "a"}))
    cp.apply(eval_run(ns, "absent"))
    jobs = cp.wait_for(lambda: _jobs(cp, ns) or None, timeout=60, what="the prepare Job")
    play_runner(cp, ns, jobs["@prepare"], tmp_path / "prepare", tmp_path / "claims")
    status = cp.wait_for(lambda: finished(cp, ns, "absent"), timeout=60, what="finished")
    assert status["phase"] == "Failed"
    failed = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert failed["reason"] == "SourceUnavailable"
    assert "tasks[qa].dataset.uri" in failed["message"]
    assert "absent.jsonl" in failed["message"]
    assert list(_jobs(cp, ns)) == ["@prepare"]


def test_the_api_server_refuses_local_and_unpinned_https_uris(
    control_plane: ControlPlane, cluster_namespace: str
) -> None:
    install_crds(control_plane)
    for dataset, message in (
        ({"uri": "data/rows.jsonl"}, "must be s3://BUCKET/KEY, pvc://CLAIM/PATH or https://"),
        ({"uri": "https://example.org/rows.jsonl"}, "needs `sha256`"),
    ):
        manifest = suite(cluster_namespace, dataset, {"column": "a"})
        refused = control_plane.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert refused.returncode != 0
        assert message in refused.stderr, refused.stderr
