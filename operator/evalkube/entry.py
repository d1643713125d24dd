"""The ``evalkube`` command: ``evalkube proxy`` starts without the rest of the CLI.

Every work-unit pod starts ``evalkube proxy`` as its sidecar, under gVisor, where each module
imported costs system calls through the sentry. The full CLI (:mod:`evalkube.cli`) imports
every command's dependencies first (the store's SQLAlchemy, the reports, rich tables): about
twice what the proxy needs (``python -X importtime``: 0.9 s against 0.37 s on this machine's
host). So ``proxy`` goes straight to :mod:`evalkube.proxy.cli`, the same function the full
CLI mounts; every other command, ``--help`` included, goes to the full CLI.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Dispatch on the first argument."""
    if sys.argv[1:2] == ["proxy"]:
        from evalkube.proxy.cli import main as proxy

        proxy(sys.argv[2:])
        return
    from evalkube.cli import app

    app()
