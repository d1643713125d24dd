"""An EvalRun whose name is longer than a label value (63 characters) runs like any other.

EvalRun names may have 253 characters, and a scheduled run's name is its schedule's plus a
time. The run's Jobs, Pods and NetworkPolicy carry a shortened ``evalkube.io/run`` label
(``names.run_label``); the operator finds the run of a Job event from the Job's
``evalkube.io/run-name`` annotation. Before, the API server refused the Jobs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    OperatorUrl,
    module_operator,
    play_to_the_end,
    run,
    suite,
)

from evalkube.controller import names

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

operator = module_operator()


def test_a_run_named_beyond_63_characters_runs_to_the_end(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl, tmp_path: Path
) -> None:
    cp, ns = control_plane, cluster_namespace
    name = "nightly-" + "regression-" * 10 + "202612030900"
    assert len(name) > 63
    cp.apply(suite(ns))
    cp.apply(run(ns, name))
    status = play_to_the_end(cp, ns, name, operator, tmp_path)
    assert status["phase"] == "Succeeded", status
    assert status["units"]["succeeded"] == status["units"]["total"] > 0
    jobs = cp.kubectl_json("get", "jobs", "-n", ns)["items"]
    assert jobs
    for job in jobs:
        assert job["metadata"]["labels"][names.LABEL_RUN] == names.run_label(name)
        assert job["metadata"]["annotations"][names.ANNOTATION_RUN] == name
