"""Upgrading the chart from a previous version, CRDs included, on the real apiserver.

Helm never upgrades the CRDs in a chart's ``crds/``; docs/install.md#6-upgrading has users
apply them first (``kubectl apply --server-side --force-conflicts -f charts/evalkube/crds/``),
then ``helm upgrade``, which fails, naming that step, while the cluster's CRDs are not the
chart's (value ``crdCheck``). This test installs the chart of an earlier commit (its CRDs and its
templates, from ``git archive``), creates live EvalSuites and EvalRuns with status, runs the
documented steps, and checks that every object survives unchanged and the new schema is live.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.cluster.plugin import ControlPlane
from tests.integration.cluster.operator_support import run, suite

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "evalkube"
#: A chart before gates, several criteria and Chat Completions providers: EvalSuite's schema
#: grew by some 500 lines since, EvalRun's by 150.
PREVIOUS = "c497463"
CRDS = ("evalsuites.evalkube.io", "evalruns.evalkube.io")
GATE = {"thresholds": [{"task": "qa", "metric": "exact_match", "min": 0.75}]}
GATE_PATCH = (
    "patch", "evalrun", "nightly", "--type=merge", "-p", json.dumps({"spec": {"gate": GATE}}),
)  # fmt: skip


def _previous_chart(dest: Path) -> Path:
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", PREVIOUS, "charts/evalkube"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.fail(f"needs the git history (commit {PREVIOUS}): {exc}")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "charts" / "evalkube"


def _apply_crds(cp: ControlPlane, directory: Path) -> None:
    """The documented step (docs/install.md#6-upgrading)."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory))
    for name in CRDS:
        cp.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def _status_fields(cp: ControlPlane, crd: str) -> set[str]:
    found = cp.kubectl_json("get", "crd", crd)
    schema = found["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return set(schema["properties"]["status"]["properties"])


@pytest.fixture
def previous_crds(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    """The previous chart, its CRDs live; the current CRDs are put back afterwards whatever
    happens (other tests share the control plane)."""
    chart = _previous_chart(tmp_path)
    _apply_crds(control_plane, chart / "crds")
    try:
        yield chart
    finally:
        _apply_crds(control_plane, CHART / "crds")


def test_upgrade_from_previous_crds_keeps_live_objects(
    control_plane: ControlPlane, previous_crds: Path, cluster_namespace: str
) -> None:
    cp, ns = control_plane, cluster_namespace
    release = f"ev{uuid.uuid4().hex[:6]}"
    installed = cp.run(
        "helm", "install", release, str(previous_crds), "-n", ns, "--skip-crds", timeout=120
    )
    assert installed.returncode == 0, installed.stderr
    try:
        assert "ingestTokenSha256" not in _status_fields(cp, "evalruns.evalkube.io")
        cp.apply(suite(ns))
        cp.apply(run(ns))
        status = {
            "phase": "Running",
            "observedGeneration": 1,
            "summary": "qa exact_match=0.800",
            "units": {"total": 5, "succeeded": 4, "running": 1, "failed": 0, "pending": 0},
        }
        cp.kubectl(
            "patch", "evalrun", "nightly", "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip
        before = {kind: cp.kubectl_json("get", kind, "-n", ns)["items"] for kind in ("evs", "evr")}
        # the previous schema drops what the new chart's users write: why CRDs move first
        pruned = cp.kubectl(*GATE_PATCH, "-n", ns)
        assert 'unknown field "spec.gate"' in pruned.stderr
        assert "gate" not in cp.kubectl_json("get", "evalrun", "nightly", "-n", ns)["spec"]

        # forgetting the CRD step: the new chart refuses to upgrade, saying what to run
        early = cp.run("helm", "upgrade", release, str(CHART), "-n", ns, timeout=120)
        assert early.returncode != 0
        assert (
            "CustomResourceDefinition evalsuites.evalkube.io in the cluster is not this chart's"
            in early.stderr
        )
        assert (
            "kubectl apply --server-side --force-conflicts -f charts/evalkube/crds/" in early.stderr
        )

        _apply_crds(cp, CHART / "crds")
        upgraded = cp.run("helm", "upgrade", release, str(CHART), "-n", ns, timeout=120)
        assert upgraded.returncode == 0, upgraded.stderr

        after = {kind: cp.kubectl_json("get", kind, "-n", ns)["items"] for kind in ("evs", "evr")}
        # kept as written, plus the defaults of fields the new schema added (tasks'
        # graderInputs), which the API server fills in when it reads a stored object
        for task in before["evs"][0]["spec"]["tasks"]:
            task.setdefault("graderInputs", "evalkube")
        for kind, objects in before.items():
            assert [_identity(o) for o in after[kind]] == [_identity(o) for o in objects]
        # kept as written; the new schema's defaults fill what the old one lacked
        defaulted = {**status["units"], "queued": 0}
        assert after["evr"][0]["status"] == {**before["evr"][0]["status"], "units": defaulted}
        # the new schema is live: new spec fields accepted, the new status field described
        cp.kubectl(*GATE_PATCH, "-n", ns)
        assert cp.kubectl_json("get", "evalrun", "nightly", "-n", ns)["spec"]["gate"] == GATE
        assert "ingestTokenSha256" in _status_fields(cp, "evalruns.evalkube.io")
        cp.kubectl(
            "patch", "evalrun", "nightly", "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"ingestTokenSha256": "1" * 64}}),
        )  # fmt: skip
        kept = cp.kubectl_json("get", "evalrun", "nightly", "-n", ns)["status"]
        assert kept["ingestTokenSha256"] == "1" * 64
        assert kept["units"] == defaulted
        # a spec written before the upgrade can still be written back unchanged
        evs = after["evs"][0]
        cp.kubectl(
            "patch", "evalsuite", "qa", "-n", ns, "--type=merge",
            "-p", json.dumps({"metadata": {"labels": {"upgraded": "yes"}}}),
        )  # fmt: skip
        again = cp.kubectl_json("get", "evalsuite", "qa", "-n", ns)
        assert again["spec"] == evs["spec"]
        listed = cp.run("helm", "status", release, "-n", ns, "-o", "json").stdout
        assert json.loads(listed)["info"]["status"] == "deployed"
    finally:
        cp.run("helm", "uninstall", release, "-n", ns, timeout=120)


def _identity(obj: dict[str, Any]) -> tuple[str, str, Any]:
    meta = obj["metadata"]
    return meta["name"], meta["uid"], obj["spec"]
