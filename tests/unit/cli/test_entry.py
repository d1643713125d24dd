"""The ``evalkube`` command's entry point: the proxy sidecar of every work-unit pod starts
without importing the rest of the CLI (nor the store's SQLAlchemy); other commands get the
full CLI."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("evalkube.cli", "sqlalchemy", "evalkube.store.database", "evalkube.reporting")


def _imported_by(*argv: str) -> tuple[list[str], str]:
    code = (
        "import json, sys\n"
        f"sys.argv = ['evalkube', *{list(argv)!r}]\n"
        "from evalkube import entry\n"
        "try:\n"
        "    entry.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout + done.stderr


def test_the_proxy_starts_without_the_full_cli() -> None:
    heavy, output = _imported_by("proxy", "--help")
    assert "--run-spec" in output  # the proxy's own help, from its settings
    assert heavy == []


def test_every_other_command_gets_the_full_cli() -> None:
    heavy, output = _imported_by("--help")
    assert "evalkube.cli" in heavy
    assert "submit" in output
    assert "proxy" in output
