"""The chart's images, versions, UIDs, PodDisruptionBudgets and RuntimeClass option.

One version for both images (the package's, the chart's appVersion, the operator's default
images), settable by tag or by digest; the images' USER is the UID the chart runs them as; a
PDB wherever several replicas run; the RuntimeClass created on request.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import evalkube
from evalkube.controller import manifests
from evalkube.controller.settings import OperatorSettings
from tests.unit.chart.conftest import CHART, HelmFailed, helm_template

ROOT = CHART.parents[1]
DIGEST = "sha256:" + "ab" * 32


def _env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    operator = _deployment(docs, "operator")
    [container] = operator["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def _deployment(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    [found] = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def test_one_version_for_package_chart_and_images() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == package == evalkube.__version__
    defaults = OperatorSettings()
    assert defaults.runner_image.rsplit(":", 1)[1] == package
    assert defaults.sandbox_image.rsplit(":", 1)[1] == package


def test_sandbox_image_follows_image_tag(helm: Path) -> None:
    env = _env(helm_template(helm))
    assert env["EVALKUBE_SANDBOX_IMAGE"].endswith(":" + evalkube.__version__)
    env = _env(helm_template(helm, "image.tag=1.2.3"))
    assert env["EVALKUBE_RUNNER_IMAGE"] == "ghcr.io/evalkube/evalkube:1.2.3"
    assert env["EVALKUBE_SANDBOX_IMAGE"] == "ghcr.io/evalkube/evalkube-sandbox:1.2.3"
    env = _env(helm_template(helm, "image.tag=1.2.3", "sandboxImage.tag=1.2.3-gpu"))
    assert env["EVALKUBE_SANDBOX_IMAGE"] == "ghcr.io/evalkube/evalkube-sandbox:1.2.3-gpu"


def test_images_can_be_pinned_by_digest(helm: Path) -> None:
    docs = helm_template(helm, f"image.digest={DIGEST}", f"sandboxImage.digest={DIGEST}")
    pinned = f"ghcr.io/evalkube/evalkube@{DIGEST}"
    for component in ("operator", "egress-gateway"):
        [container] = _deployment(docs, component)["spec"]["template"]["spec"]["containers"]
        assert container["image"] == pinned
    env = _env(docs)
    assert env["EVALKUBE_RUNNER_IMAGE"] == pinned
    assert env["EVALKUBE_SANDBOX_IMAGE"] == f"ghcr.io/evalkube/evalkube-sandbox@{DIGEST}"
    with pytest.raises(HelmFailed, match="at '/image/digest'"):
        helm_template(helm, "image.digest=latest")


def _dockerfile_user(path: Path) -> int:
    users = re.findall(r"^USER (\d+):(\d+)$", path.read_text(), re.MULTILINE)
    [(uid, gid)] = users
    assert uid == gid
    return int(uid)


def test_one_uid_per_image_in_the_dockerfile_and_the_chart(helm: Path) -> None:
    docs = helm_template(helm)
    operator_uid = _dockerfile_user(ROOT / "operator" / "Dockerfile")
    for component in ("operator", "egress-gateway"):
        context = _deployment(docs, component)["spec"]["template"]["spec"]["securityContext"]
        assert context["runAsUser"] == context["runAsGroup"] == operator_uid
    # work-unit containers (runner and proxy from the operator image, grader from the
    # sandbox image) run as the sandbox image's USER
    assert _dockerfile_user(ROOT / "sandbox_image" / "Dockerfile") == manifests.NOBODY


def _pdbs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "PodDisruptionBudget"
    }


def test_pod_disruption_budgets_where_several_replicas_run(helm: Path) -> None:
    pdbs = _pdbs(helm_template(helm))
    assert set(pdbs) == {"egress-gateway"}  # one operator replica; two gateways
    docs = helm_template(
        helm, "replicas=2", "store.type=postgres", "store.postgres.existingSecret=pg"
    )
    pdbs = _pdbs(docs)
    assert set(pdbs) == {"operator", "egress-gateway"}
    for component, pdb in pdbs.items():
        labels = _deployment(docs, component)["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1
    assert not _pdbs(helm_template(helm, "egress.replicas=1"))
    assert not _pdbs(helm_template(helm, "podDisruptionBudget.enabled=false"))


def test_runtime_class_is_created_on_request(helm: Path) -> None:
    assert not [d for d in helm_template(helm) if d["kind"] == "RuntimeClass"]
    docs = helm_template(
        helm,
        "runtimeClass.create=true",
        "runtimeClass.handler=runsc-systrap",
        "runtimeClass.nodeSelector.sandbox\\.gke\\.io/runtime=gvisor",
    )
    [runtime_class] = [d for d in docs if d["kind"] == "RuntimeClass"]
    assert runtime_class["metadata"]["name"] == _env(docs)["EVALKUBE_RUNTIME_CLASS"] == "gvisor"
    assert runtime_class["handler"] == "runsc-systrap"
    assert runtime_class["scheduling"]["nodeSelector"] == {"sandbox.gke.io/runtime": "gvisor"}
    with pytest.raises(HelmFailed, match="at '/runtimeClassName'"):
        helm_template(helm, "runtimeClass.create=true", "runtimeClassName=")
