"""Wall time and host peak RSS of every input-surface attack (docs/security.md "Input surfaces").

Not a test: prints figures. Runs the attack tests (each runs the real ``evalkube`` command in
a child process, :mod:`tests.security.bounded`) with ``EVALKUBE_ATTACK_LOG`` set and prints,
per command, its exit code, wall time and peak RSS; the targets are under 30 s and under
500 MB per attack.

    python benchmarks/attacks.py
    python benchmarks/attacks.py tests/security/test_templates.py   # some of them
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [
    "tests/security/test_input_files.py",
    "tests/security/test_import_export.py",
    "tests/security/test_templates.py",
    "tests/security/test_result_volume.py",
    "tests/security/test_terminal.py",
]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "attacks.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(argv or FILES)],
            cwd=ROOT,
            env={**os.environ, "EVALKUBE_ATTACK_LOG": str(log)},
            check=False,
        )
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    print(f"\n{'attack (test :: command)':<96} {'exit':>4} {'s':>7} {'MB':>7}")
    for row in rows:
        name = f"{row['test'].split('::', 1)[-1][:44]} :: {row['command'][:48]}"
        print(f"{name:<96} {row['code']:>4} {row['seconds']:>7.2f} {row['peak_rss_mb']:>7.1f}")
    if rows:
        print(
            f"\n{len(rows)} commands: longest {max(r['seconds'] for r in rows):.2f} s, "
            f"largest {max(r['peak_rss_mb'] for r in rows):.1f} MB peak RSS"
        )
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
