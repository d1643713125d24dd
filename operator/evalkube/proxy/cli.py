"""``evalkube proxy``: run the model bridge proxy (the work-unit pod's sidecar).

Mounted on the main CLI by :func:`register`. Its
flags are :class:`evalkube.proxy.settings.ProxySettings`' fields, parsed by pydantic-settings
(``--run-spec``, ``--max-calls``, ...; ``--help`` lists them with their docs), so a setting
is declared once. Each can also come from ``EVALKUBE_PROXY_<FIELD>``; flags win.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import typer

from evalkube.proxy.native import NativeProxyUnavailable
from evalkube.proxy.server import serve_forever
from evalkube.proxy.settings import ProxySettings


def register(app: typer.Typer) -> None:
    """Add ``evalkube proxy`` to ``app``: every argument is left to pydantic-settings."""
    app.command(
        "proxy",
        help="Run the model bridge proxy: graders' model calls with the run's credentials, "
        "budgets and audit. `evalkube proxy --help` lists its flags.",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(proxy)


def proxy(ctx: typer.Context) -> None:
    """Serve until SIGTERM or Ctrl-C."""
    main(ctx.args)


def main(args: Sequence[str] | None = None) -> None:
    """``evalkube proxy`` with ``args`` (default: this process's arguments)."""
    try:  # bad flags (pydantic's errors are ValueErrors), files, ports or engine: one line
        settings = ProxySettings.from_cli(sys.argv[1:] if args is None else args)
        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        serve_forever(settings)
    except (OSError, ValueError, NativeProxyUnavailable) as exc:
        typer.echo(f"evalkube proxy: {exc}", err=True)
        raise SystemExit(2) from None
