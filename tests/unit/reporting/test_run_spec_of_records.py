"""A recorded run's EvalRun spec is read from its snapshot, the one shape the store holds for
cluster and local runs alike: ``evalkube track`` finds an EvalRun's declared MLflow server."""

from __future__ import annotations

from evalkube.models import EvalRunSpec, EvalSuiteSpec
from evalkube.models.snapshot import RunSnapshot, SnapshotLocal, SnapshotRun, SnapshotSuite
from evalkube.reporting.track import run_spec, target_for

SUITE = {
    "tasks": [
        {
            "id": "qa",
            "dataset": {"rows": [{"q": "1"}]},
            "prompt": "{{ item.q }}",
            "grader": {"type": "python", "source": "def grade(s, i): return 1.0"},
        }
    ]
}
TRACKED = {
    "models": ["precomputed"],
    "tracking": {"mlflow": {"trackingURI": "http://mlflow.example:5000", "experiment": "e"}},
}


def _snapshot(run: SnapshotRun, local: SnapshotLocal | None) -> RunSnapshot:
    return RunSnapshot(
        run=run,
        suite=SnapshotSuite(name="s", spec=EvalSuiteSpec.model_validate(SUITE), version="sha256:0"),
        run_spec=EvalRunSpec.model_validate(TRACKED),
        local=local,
    )


def test_a_cluster_run_s_declared_tracking_server_is_found() -> None:
    doc = _snapshot(SnapshotRun(run_id="ns-r-1", namespace="ns", name="r", uid="1"), None)
    target = target_for(run_spec(doc.to_wire()), None, None, "s")
    assert target is not None
    assert (target.tracking_uri, target.experiment) == ("http://mlflow.example:5000", "e")


def test_a_local_run_s_declared_tracking_server_is_found() -> None:
    doc = _snapshot(SnapshotRun(run_id="r"), SnapshotLocal(base_dir="/data"))
    assert run_spec(doc.to_wire()).tracking == EvalRunSpec.model_validate(TRACKED).tracking
