"""The cluster plugin's contract when the binaries are missing: FAIL under CI, skip locally.

These run an inner pytest in a subprocess and need no control plane.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(120)

INNER_TEST = """
import pytest

@pytest.mark.cluster
def test_needs_cluster(control_plane):
    assert control_plane.kubeconfig.exists()
"""


def run_inner(
    tmp_path: Path, env_overrides: dict[str, str | None]
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for k, v in env_overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.cluster.plugin",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            "-rsfE",
            str(tmp_path / "test_inner.py"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        stdin=subprocess.DEVNULL,
    )


def run_without_binaries(tmp_path: Path, how: str, ci: str | None) -> tuple[int, str]:
    """The inner session with ``$CI`` at ``ci`` and no binaries: a bin dir that does not exist
    (``explicit-bin``) or an empty build cache (``empty-cache``); its exit code and output."""
    env: dict[str, str | None] = {"CI": ci}
    if how == "explicit-bin":
        env["EVALKUBE_CTRLPLANE_BIN"] = str(tmp_path / "no-such-bin")
    else:
        env["EVALKUBE_CTRLPLANE_BIN"] = None
        env["EVALKUBE_TOOLS_CACHE"] = str(tmp_path / "empty-cache")
    res = run_inner(tmp_path, env)
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize("how", ["explicit-bin", "empty-cache"])
def test_missing_binaries_fail_under_ci(tmp_path: Path, how: str) -> None:
    code, out = run_without_binaries(tmp_path, how, ci="true")
    assert code == 1, out
    assert "[CI] cluster tests cannot run" in out, out
    assert "build-tools.sh" in out, out
    assert "1 error" in out, out
    assert "skipped" not in out, out


@pytest.mark.parametrize("how", ["explicit-bin", "empty-cache"])
def test_missing_binaries_skip_locally(tmp_path: Path, how: str) -> None:
    code, out = run_without_binaries(tmp_path, how, ci=None)
    assert code == 0, out
    assert "1 skipped" in out, out
    assert "build-tools.sh" in out, out
