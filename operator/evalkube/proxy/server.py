"""The model bridge proxy's process: its listeners (:mod:`.routes`), event loop and shutdown,
for ``evalkube proxy`` (:func:`serve_forever`) and :class:`~evalkube.proxy.bridge.ModelBridge`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from evalkube import limits
from evalkube.proxy.routes import ProxyApps
from evalkube.proxy.service import ProxyService
from evalkube.proxy.settings import ProxySettings
from evalkube.proxy.upstream import Provider, Upstream
from evalkube.util.gctune import relaxed_gc
from evalkube.util.net import parse_listen

log = logging.getLogger("evalkube.proxy")

#: Pending connections each listener queues (a grader opening many at once must not make
#: the next honest connect fail: unix sockets refuse at once when the queue is full).
LISTEN_BACKLOG = 1024


def bind_socket(address: str, *, mode: int = 0o600) -> tuple[socket.socket, str]:
    """A listening socket for ``address`` and the endpoint clients use to reach it."""
    target = parse_listen(address)
    if isinstance(target, str):
        path = Path(target)
        if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, mode)
        sock.listen(LISTEN_BACKLOG)
        return sock, f"unix:{path}"
    host, port = target
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
    return sock, f"http://{shown}:{bound[1]}"


class ProxyServer:
    """Runs the grader and control listeners of one :class:`ProxyService` on the current loop."""

    def __init__(
        self,
        service: ProxyService,
        *,
        listen: str | None,
        control_listen: str | None = None,
        control_token: str | None = None,
    ) -> None:
        self.service = service
        self.apps = ProxyApps(service, control_token)
        self.listen = listen
        self.control_listen = control_listen
        self.endpoint: str | None = None
        self.control_endpoint: str | None = None
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        if self.listen:
            self.endpoint = await self._serve(self.apps.grader_app(), self.listen, 0o666)
        if self.control_listen:
            self.control_endpoint = await self._serve(
                self.apps.control_app(), self.control_listen, 0o600
            )

    async def _serve(self, app: web.Application, address: str, mode: int) -> str:
        sock, endpoint = bind_socket(address, mode=mode)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        # SockSite would otherwise listen() again with aiohttp's backlog of 128.
        site = web.SockSite(runner, sock, backlog=LISTEN_BACKLOG)
        await site.start()
        self._runners.append(runner)
        return endpoint

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        for endpoint in (self.endpoint, self.control_endpoint):
            if endpoint is not None and endpoint.startswith("unix:"):
                Path(endpoint.removeprefix("unix:")).unlink(missing_ok=True)
        await self.service.aclose()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (the proxy's hot path is event-loop and
    transport work: 16% fewer instructions per proxied call, counted with callgrind), else
    asyncio's (which ``EVALKUBE_EVENT_LOOP=asyncio`` forces)."""
    if os.environ.get("EVALKUBE_EVENT_LOOP", "").lower() != "asyncio":
        with contextlib.suppress(ImportError):
            import uvloop

            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run`` on :func:`new_event_loop`, with the collector tuned for the hot path."""
    with relaxed_gc(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main)


async def run_until_stopped(server: ProxyServer, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        # no handler off the main thread (ValueError, RuntimeError) or on Windows
        # (NotImplementedError): the caller that runs it there stops it through ``stop``
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
    await server.start()
    log.info(
        "model bridge proxy listening: graders %s, control %s",
        server.endpoint or "-",
        server.control_endpoint or "-",
    )
    try:
        await stop.wait()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        await server.stop()


def serve_forever(settings: ProxySettings, registry: CollectorRegistry | None = None) -> None:
    """Run ``evalkube proxy`` until SIGTERM/SIGINT (the pod sidecar entry point); with the native
    engine this process becomes ``evalkube-proxy`` (``exec``) on the same settings and run spec."""
    from evalkube.proxy import native
    from evalkube.proxy.providers import load_run_spec, providers_from_spec

    providers: dict[str, Provider] = {}
    judge_model = settings.judge_model
    embedding_model = settings.embedding_model
    retries = settings.retries
    if settings.run_spec is not None:
        spec = load_run_spec(settings.run_spec)
        providers = providers_from_spec(spec)
        judge_model = judge_model or spec.judge_model
        embedding_model = embedding_model or spec.embedding_model
        retries = spec.generation.retries if retries is None else retries
    retries = limits.GENERATION_RETRIES_DEFAULT if retries is None else retries
    token = settings.control_token()

    binary = _native_engine(settings.engine, judge_model, embedding_model)
    if binary is not None:
        log.info("model bridge proxy: native engine %s", binary)
        native.exec_native(
            binary,
            native.native_config(
                providers,
                listen=settings.listen,
                control_listen=settings.control_listen,
                control_token_file=settings.control_token_file,
                judge_model=judge_model,
                embedding_model=embedding_model,
                max_calls=settings.max_calls,
                planned_executions=settings.planned_executions,
                unit_id=settings.unit_id,
                retries=retries,
                log_level=settings.log_level,
                egress_proxy=settings.egress_proxy,
                egress_grant_file=settings.egress_grant_file,
                state_dir=settings.state_dir,
            ),
        )
    if settings.state_dir is not None:
        log.warning(
            "model bridge proxy: the python engine keeps no journal (--state-dir %s is ignored): "
            "if this process is killed, its budgets, tokens and usage are lost",
            settings.state_dir,
        )

    service = ProxyService(
        Upstream(providers, retries=retries, egress=settings.egress()),
        judge_model=judge_model,
        embedding_model=embedding_model,
        registry=registry,
        max_calls_per_execution=settings.max_calls,
        planned_executions=settings.planned_executions,
        unit_id=settings.unit_id,
    )
    server = ProxyServer(
        service, listen=settings.listen, control_listen=settings.control_listen, control_token=token
    )
    run(run_until_stopped(server))


def _native_engine(engine: str, judge_model: str | None, embedding_model: str | None) -> str | None:
    """The native binary to exec for ``engine``, or None to serve from Python."""
    from evalkube.proxy import native

    if engine == "python":
        return None
    local = native.uses_local_provider(judge_model, embedding_model)
    if engine == "native":
        if local:
            raise ValueError(
                "the run's judge or embedding model uses the local: provider, which only the "
                "Python proxy serves; use --engine python (or auto)"
            )
        return native.require_native_binary()
    if local:
        log.info("model bridge proxy: python engine (the run uses the local: provider)")
        return None
    binary = native.native_binary()
    if binary is None:
        log.info("model bridge proxy: python engine (%s not found)", native.BINARY_NAME)
    return binary
