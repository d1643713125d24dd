"""pytest plugin: a session-scoped real Kubernetes control plane (see tests/cluster/ctrlplane.py).

Registered from tests/conftest.py (``pytest_plugins = ["tests.cluster.plugin"]``) or with
``-p tests.cluster.plugin``.

- marker ``cluster``: the test needs the control plane; the ``control_plane`` fixture is added to
  it automatically. Select or deselect with ``-m cluster`` / ``-m "not cluster"``.
- fixture ``control_plane`` (session): a started ``ControlPlane`` -- ``.kubeconfig``, ``.bin``,
  ``.env``, ``.kubectl(*args)``, ``.kubectl_json(*args)``, ``.apply(obj_or_yaml)``,
  ``.run("helm", ...)``, ``.wait_for(fn)``, ``.node_name``, ``.server``, ``.logs_dir``.
- fixture ``cluster_namespace`` (function): a fresh namespace name, deleted afterwards.
- marker ``realnode``: the test needs a real node (tests/cluster/realnode.py: kubelet,
  containerd, runc and gVisor, kube-proxy, kube-router, CoreDNS in a private netns); the
  ``real_node`` fixture (session) is added to it automatically. Binaries from
  tests/cluster/build-node.sh, images from .ci/images.sh (``bash .ci/realnode.sh`` builds both).
  Missing host facilities or builds FAIL the test when ``$CI`` is set and skip it otherwise.
- marker ``nightly``: a test too slow for every CI run, for a nightly job (the real-node faults
  docs/operator.md's "What survives what" marks, every golden OpenAI case on the node).
  Deselected unless ``-m`` names it or ``EVALKUBE_NIGHTLY=1`` is set; ``make nightly`` runs them.

Binaries: ``$EVALKUBE_CTRLPLANE_BIN``, else the build cache of tests/cluster/build-tools.sh
(looked up with ``--print-if-cached``; the plugin never builds). If they are missing, tests that
need them FAIL when ``$CI`` is set (never skipped in CI), and are skipped locally with a message
saying how to build them.

When any test failed, the control plane's work dir (logs/, certificates, kubeconfig) is kept and
its path printed in the terminal summary; set ``EVALKUBE_KEEP_CTRLPLANE=1`` to always keep it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.cluster.ctrlplane import (
    COMPLETE_ANNOTATION,
    HOLD_ANNOTATION,
    BinariesMissing,
    ControlPlane,
    find_bin_dir,
)
from tests.cluster.realnode import (
    RealNode,
    find_images,
    find_node_bin,
    missing_facilities,
)

__all__ = ["COMPLETE_ANNOTATION", "HOLD_ANNOTATION", "ControlPlane", "RealNode"]

_KEPT: list[str] = []


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cluster: needs the real loopback Kubernetes control plane (fixture control_plane; "
        "binaries from tests/cluster/build-tools.sh). Never skipped when $CI is set.",
    )
    config.addinivalue_line(
        "markers",
        "realnode: needs a real node with gVisor (fixture real_node; binaries from "
        "tests/cluster/build-node.sh, images from .ci/images.sh). Never skipped when $CI is set.",
    )
    config.addinivalue_line(
        "markers",
        "nightly: too slow for every CI run; deselected unless -m names it or "
        "EVALKUBE_NIGHTLY=1 (make nightly).",
    )


def _nightly_selected(config: pytest.Config) -> bool:
    if os.environ.get("EVALKUBE_NIGHTLY", "") not in ("", "0"):
        return True
    return "nightly" in (config.getoption("markexpr", "") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # real-node tests last: their node (session scope) then runs only while they do; and of
    # those, the fault tests (tests/realnode/test_faults_*.py) last of all: they restart the
    # node's kubelet and containerd, and the attack tests must meet a node no fault touched
    # (a kubelet and containerd restart once let a grader reach the API server; see
    # docs/operator.md, "What survives what")
    items.sort(
        key=lambda item: (
            item.get_closest_marker("realnode") is not None,
            item.path.name.startswith("test_faults_"),
        )
    )
    if not _nightly_selected(config):
        nightly = [item for item in items if item.get_closest_marker("nightly")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("nightly")]
    for item in items:
        if item.get_closest_marker("cluster") and "control_plane" not in getattr(
            item, "fixturenames", ["control_plane"]
        ):
            item.fixturenames.append("control_plane")  # type: ignore[attr-defined]
        if item.get_closest_marker("realnode") and "real_node" not in getattr(
            item, "fixturenames", ["real_node"]
        ):
            item.fixturenames.append("real_node")  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    missing: str | None = None
    try:
        bin_dir = find_bin_dir()
    except BinariesMissing as exc:
        missing = str(exc)
    if missing is not None:  # outside the except block: no chained traceback in the report
        if _in_ci():
            pytest.fail(f"[CI] cluster tests cannot run: {missing}", pytrace=False)
        pytest.skip(f"cluster tests skipped: {missing}")
    yield from _for_the_session(
        request,
        ControlPlane(bin_dir),
        lambda cp: f"control plane up in {cp.startup_seconds:.1f}s at {cp.server} (bin {cp.bin})",
    )


Cluster = TypeVar("Cluster", ControlPlane, RealNode)


def _for_the_session(
    request: pytest.FixtureRequest, cluster: Cluster, started: Callable[[Cluster], str]
) -> Iterator[Cluster]:
    """Start ``cluster``, say ``started(cluster)``, yield it; stop it after the session, keeping
    its work dir (and saying where) when it failed to start, a test failed, or
    ``$EVALKUBE_KEEP_CTRLPLANE`` asks."""
    try:
        cluster.start()
    except BaseException:
        _KEPT.append(str(cluster.workdir))
        raise
    sys.stderr.write(f"\n[evalkube] {started(cluster)}\n")
    yield cluster
    failed = request.session.testsfailed > 0
    keep = failed or os.environ.get("EVALKUBE_KEEP_CTRLPLANE", "") not in ("", "0")
    cluster.stop(keep_workdir=keep)
    if keep:
        _KEPT.append(str(cluster.workdir))


@pytest.fixture
def cluster_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl(
        "delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False
    )


@pytest.fixture(scope="session")
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    problems = [f"this machine lacks {m}" for m in missing_facilities()]
    found: dict[str, Path] = {}
    for name, finder in (("cp", find_bin_dir), ("node", find_node_bin), ("images", find_images)):
        try:
            found[name] = finder()
        except BinariesMissing as exc:
            problems.append(str(exc))
    if problems:
        message = "real-node tests cannot run: " + "; ".join(problems)
        if _in_ci():
            pytest.fail(f"[CI] {message}", pytrace=False)
        pytest.skip(message)
    yield from _for_the_session(
        request,
        RealNode(found["cp"], found["node"], found["images"]),
        lambda node: (
            f"real node up in {node.startup_seconds:.1f}s (netns {node.netns}; {node.timings})"
        ),
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    for d in _KEPT:
        terminalreporter.write_line(
            f"[evalkube] control-plane logs kept in {Path(d) / 'logs'} "
            f"(work dir {d}: kubeconfig, certificates, etcd data)"
        )
