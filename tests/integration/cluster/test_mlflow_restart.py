"""MLflow logging that an operator restart cut short is finished by the next operator: the run
ended while its tracking server was down (``Tracked=Unknown``, retrying), the operator stopped,
the server came back; the restarted operator logs the run and sets ``Tracked=True``. (Its own
module: two operators must not run at once, and the other module's runs for a whole module.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    _free_port,
    install_crds,
    play_to_the_end,
    running_operator,
    suite,
)
from tests.integration.cluster.test_mlflow_tracking import tracked, tracked_condition
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def test_logging_cut_short_by_a_restart_is_finished_by_the_next_operator(
    control_plane: ControlPlane,
    cluster_namespace: str,
    mlflow_server: MlflowServer,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, cluster_namespace
    install_crds(cp)
    store = tmp_path / "results.db"
    later = MlflowServer(mlflow_server.bindir, tmp_path / "later")  # down for now
    with running_operator(cp, store, _free_port(), mlflow_attempts="20") as url:
        cp.apply(suite(ns))
        cp.apply(tracked(ns, "cut", {"trackingURI": later.url, "experiment": "restarts"}))
        status = play_to_the_end(cp, ns, "cut", url, tmp_path)
        assert status["phase"] == "Succeeded", status
        logging = next(c for c in status["conditions"] if c["type"] == "Tracked")
        assert (logging["status"], logging["reason"]) == ("Unknown", "Logging")
    later.start()
    try:
        with running_operator(cp, store, _free_port()):
            condition = tracked_condition(cp, ns, "cut")
        assert condition["status"] == "True", condition
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow import MlflowClient

        client: Any = MlflowClient(tracking_uri=later.url)
        experiment = client.get_experiment_by_name("restarts")
        (found,) = client.search_runs([experiment.experiment_id])
        assert found.info.run_id in condition["message"]
        assert found.data.metrics["qa/precomputed/exact_match"] == 0.8
    finally:
        later.stop()
