"""``evalkube proxy``: run the model bridge proxy (the work-unit pod's sidecar).

Mounted by the main CLI as a sub-app (``app.add_typer(proxy_cli.app, name="proxy")``).
Every option can also come from ``EVALKUBE_PROXY_<OPTION>`` (see
:class:`evalkube.proxy.settings.ProxySettings`); flags win over the environment.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from evalkube.proxy.native import NativeProxyUnavailable
from evalkube.proxy.server import serve_forever
from evalkube.proxy.settings import ProxySettings

app = typer.Typer(
    help="Run the model bridge proxy: graders' model calls with the run's credentials, "
    "budgets and audit.",
    no_args_is_help=False,
    add_completion=False,
)


@app.callback(invoke_without_command=True)
def proxy(
    listen: Annotated[
        str | None,
        typer.Option(help="Grader listener: unix:/path or host:port."),
    ] = None,
    control_listen: Annotated[
        str | None,
        typer.Option(
            help="Control listener (usage, budgets, candidate calls): unix:/path or host:port."
        ),
    ] = None,
    control_token_file: Annotated[
        Path | None,
        typer.Option(
            help="File with the token control requests must send (X-Evalkube-Control-Token)."
        ),
    ] = None,
    run_spec: Annotated[
        Path | None,
        typer.Option(
            help="EvalRun YAML/JSON (or its spec): providers, judge and embedding models."
        ),
    ] = None,
    max_calls: Annotated[
        int | None, typer.Option(help="max_model_calls per grader execution (default 64).")
    ] = None,
    planned_executions: Annotated[
        int | None,
        typer.Option(help="Executions planned for the unit; the unit total is max-calls x this."),
    ] = None,
    unit_id: Annotated[str | None, typer.Option(help="Name of the unit served.")] = None,
    judge_model: Annotated[str | None, typer.Option(help="Override the run's judgeModel.")] = None,
    embedding_model: Annotated[
        str | None, typer.Option(help="Override the run's embeddingModel.")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="Logging level.")] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="auto (default), native (the compiled evalkube-proxy binary) or python."),
    ] = None,
    egress_proxy: Annotated[
        str | None,
        typer.Option(help="Egress gateway http://host:port every upstream call goes through."),
    ] = None,
    egress_grant_file: Annotated[
        Path | None,
        typer.Option(help="File with the run's egress grant (re-read when it changes)."),
    ] = None,
) -> None:
    """Serve until SIGTERM or Ctrl-C."""
    given: dict[str, Any] = {
        key: value
        for key, value in {
            "listen": listen,
            "control_listen": control_listen,
            "control_token_file": control_token_file,
            "run_spec": run_spec,
            "max_calls": max_calls,
            "planned_executions": planned_executions,
            "unit_id": unit_id,
            "judge_model": judge_model,
            "embedding_model": embedding_model,
            "log_level": log_level,
            "engine": engine,
            "egress_proxy": egress_proxy,
            "egress_grant_file": egress_grant_file,
        }.items()
        if value is not None
    }
    try:
        settings = ProxySettings(**given)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        serve_forever(settings)
    except (OSError, ValueError, NativeProxyUnavailable) as exc:
        typer.echo(f"evalkube proxy: {exc}", err=True)
        raise typer.Exit(2) from None
