"""Deleting a run while its daemon drives it: kopf stops the daemon and the run goes at once.

kopf keeps a finalizer on EvalRuns while a daemon runs for them, and removes it only once the
daemon has stopped; a daemon that ignored the stop would leave the run stuck in deletion.
"""

from __future__ import annotations

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import (
    OperatorUrl,
    metric,
    module_operator,
    run,
    run_status,
    suite,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

operator = module_operator()


def test_deleting_a_running_run_stops_its_daemon_and_the_run_is_gone(
    control_plane: ControlPlane, cluster_namespace: str, operator: OperatorUrl
) -> None:
    cp, ns = control_plane, cluster_namespace
    cp.apply(suite(ns))
    cp.apply(run(ns))
    # the Jobs' pods are held by kwok: the run stays Running, its daemon waiting for events
    cp.wait_for(lambda: run_status(cp, ns).get("phase") == "Running", what="Running")
    cp.wait_for(lambda: metric(operator, 'evalkube_runs{phase="Running"}') == 1, what="gauge")
    assert cp.kubectl_json("get", "evalrun", "nightly", "-n", ns)["metadata"]["finalizers"]

    cp.kubectl("delete", "evalrun", "nightly", "-n", ns, "--wait=true", "--timeout=30s")

    assert not cp.kubectl_json("get", "evalruns", "-n", ns)["items"]
    cp.wait_for(
        lambda: metric(operator, 'evalkube_runs{phase="Running"}') == 0,
        what="the deleted run dropped from evalkube_runs",
    )
