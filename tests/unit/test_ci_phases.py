"""The phases of ``.ci/test.sh``: a test lands in the phase its fixtures need
(``tests/conftest.py``: marker ``builds``), so nothing that needs a binary built beside the tests
runs before the binary exists, and nothing is left out of every phase."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATHS = [
    "tests/unit/chart/test_images.py",  # some tests take the helm fixture, one does not
    "tests/integration/sources/test_s3_server.py",  # the weed and s3_server fixtures
    "tests/e2e/test_mlflow_tracking.py",  # the mlflow_server fixture
    "tests/integration/cluster/test_plugin_contract.py",  # cluster folder, needs no binary
    "tests/realnode/test_gvisor.py",  # marker realnode
]


def collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *args, *PATHS],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_each_test_is_in_the_phase_its_fixtures_need_and_in_exactly_one() -> None:
    everything = collected()
    first = collected("-m", "not builds")
    second = collected("-m", "builds and not realnode")
    third = collected("-m", "realnode")
    assert first | second | third == everything
    assert not first & second
    assert not first & third
    assert not second & third
    images = "tests/unit/chart/test_images.py::"
    assert images + "test_one_version_for_package_chart_and_images" in first
    assert images + "test_sandbox_image_follows_image_tag" in second
    assert {n for n in everything if "test_s3_server.py" in n} <= second
    assert {n for n in everything if "test_mlflow_tracking.py" in n} <= second
    assert {n for n in everything if "test_plugin_contract.py" in n} <= first
    assert third
    assert all(n.startswith("tests/realnode/") for n in third)
