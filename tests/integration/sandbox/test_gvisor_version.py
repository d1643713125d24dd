"""The gVisor that grades locally is the pinned, current one, on a measured platform; an
outdated runsc is refused by name (``--sandbox gvisor``) or passed over with a warning
(``--sandbox auto``), never used quietly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evalkube.sandbox.runsc import MIN_RUNSC_DATE, PLATFORMS, runsc_path, runsc_version
from tests.integration.sandbox.support import backend

pytestmark = pytest.mark.timeout(300)

EVALKUBE = Path(sys.executable).parent / "evalkube"
SUITE = textwrap.dedent(
    """\
    apiVersion: evalkube.io/v1alpha1
    kind: EvalSuite
    metadata: {name: versions}
    spec:
      tasks:
      - id: t
        dataset:
          rows: [{q: a, output: a}, {q: b, output: c}]
        prompt: "{{ item.q }}"
        target: "{{ item.q }}"
        outputs: {column: output}
        grader:
          type: python
          metricId: exact_match
          source: |
            def grade(sample, item):
                return float(sample["output_text"] == item["q"])
    """
)


def _run(tmp_path: Path, sandbox: str, **env: str) -> subprocess.CompletedProcess[str]:
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    return subprocess.run(
        [str(EVALKUBE), "run", str(suite), "--sandbox", sandbox, "--db", str(tmp_path / "r.db")],
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb", **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _old_runsc(tmp_path: Path) -> Path:
    """A runsc that reports Debian 12's release (it is never asked to run a container)."""
    fake = tmp_path / "bin" / "runsc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'runsc version release-20221219.0'\necho 'spec: 1.0.2-dev'\n")
    fake.chmod(0o755)
    return fake


def test_the_runsc_found_here_is_not_older_than_the_pin() -> None:
    backend("gvisor")  # fails under CI when gVisor cannot run
    path = runsc_path()
    assert path is not None
    version = runsc_version(path)
    assert version.date is not None, (path, version)
    assert version.date >= MIN_RUNSC_DATE, (path, version)


def test_a_run_names_the_runsc_version_and_the_measured_platform(tmp_path: Path) -> None:
    backend("gvisor")
    done = _run(tmp_path, "gvisor")
    assert done.returncode == 0, done.stderr
    path = runsc_path()
    assert path is not None
    said = runsc_version(path).text
    footer = next(line for line in done.stdout.splitlines() if line.startswith("sandbox: "))
    assert f"gvisor (runsc {said}, " in footer
    assert any(f", {platform})" in footer for platform in PLATFORMS), footer


def test_a_platform_can_be_asked_for(tmp_path: Path) -> None:
    backend("gvisor")
    done = _run(tmp_path, "gvisor", EVALKUBE_GVISOR_PLATFORM="ptrace")
    assert done.returncode == 0, done.stderr
    assert ", ptrace) · " in done.stdout


def test_an_outdated_runsc_is_refused_by_name(tmp_path: Path) -> None:
    fake = _old_runsc(tmp_path)
    done = _run(tmp_path, "gvisor", EVALKUBE_RUNSC=str(fake))
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = " ".join(done.stderr.split())
    assert f"runsc at {fake} (release-20221219.0, 2022-12-19) is older than the gVisor" in message
    assert "make sandboxes" in message
    assert "Traceback" not in done.stderr


def test_auto_passes_over_an_outdated_runsc_with_a_warning(tmp_path: Path) -> None:
    backend("nsjail")
    fake = _old_runsc(tmp_path)
    done = _run(tmp_path, "auto", EVALKUBE_RUNSC=str(fake))
    assert done.returncode == 0, done.stderr
    message = " ".join(done.stderr.split())
    assert "warning: sandbox gvisor not used: runsc at" in message
    assert "2022-12-19) is older than the gVisor evalkube requires" in message
    assert "sandbox: nsjail" in done.stdout
