"""The package layering (docs/development.md): import-linter's contracts hold on this tree, each one
fails when a module breaks it, and the operator does not load the local engine at run time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(cwd / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_contract_is_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "violation", "contract"),
    [
        # grading is pure domain: it reaches the store only through protocols
        ("evalkube/grading/results.py", "import evalkube.store", "package layers"),
        # proxy and sandbox are siblings
        ("evalkube/proxy/usage.py", "import evalkube.sandbox.backends", "package layers"),
        # the operator and the local runner are siblings: neither imports the other
        ("evalkube/controller/names.py", "import evalkube.local.engine", "package layers"),
        ("evalkube/local/parallel.py", "import evalkube.controller.names", "package layers"),
        # the untrusted worker is stdlib-only and knows nothing of the host package
        ("evalkube_sandbox/errors.py", "import evalkube.limits", "the grader worker imports"),
    ],
)
def test_a_violation_breaks_its_contract(
    tmp_path: Path, module: str, violation: str, contract: str
) -> None:
    shutil.copytree(ROOT / "operator" / "evalkube", tmp_path / "evalkube")
    shutil.copytree(ROOT / "sandbox_image" / "evalkube_sandbox", tmp_path / "evalkube_sandbox")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{violation}  # injected by the test\n")
    done = lint_imports(tmp_path, pythonpath=str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    broken = [line for line in done.stdout.splitlines() if line.endswith(" BROKEN")]
    assert len(broken) == 1, done.stdout
    assert broken[0].startswith(contract)


def test_importing_the_operator_does_not_load_the_local_engine() -> None:
    probe = (
        "import sys\n"
        "import evalkube.controller.handlers, evalkube.controller.api\n"
        "import evalkube.controller.run_reconciler\n"
        "print(sorted(m for m in sys.modules if m.startswith('evalkube.local')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"
