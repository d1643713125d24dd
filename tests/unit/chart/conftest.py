"""Binaries the chart tests run: helm (built with the control plane, tests/cluster) and
promtool (.ci/promtool.sh). Skipped locally when missing; a failure under CI."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.ctrlplane import BinariesMissing, find_bin_dir
from tests.conftest import require
from tests.support.promql import promtool_bin

CHART = Path(__file__).resolve().parents[3] / "charts" / "evalkube"


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return find_bin_dir() / "helm"
    except BinariesMissing as missing:
        require(f"helm: {missing}")
        raise


@pytest.fixture(scope="session")
def promtool() -> Path:
    found = promtool_bin()
    if found is None or not found.is_file():
        require("promtool: set EVALKUBE_PROMTOOL_BIN=$(bash .ci/promtool.sh | tail -1)")
    assert found is not None
    return found


def helm_template(helm: Path, *sets: str, show_only: str | None = None) -> list[dict[str, Any]]:
    """``helm template ev charts/evalkube -n team --set ...`` as documents."""
    args = [str(helm), "template", "ev", str(CHART), "--namespace", "team"]
    for item in sets:
        args += ["--set", item]
    if show_only:
        args += ["--show-only", show_only]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise HelmFailed(done.stderr)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


class HelmFailed(Exception):
    """helm refused the values (its stderr)."""
