"""The in-process model bridge for the synchronous local engine.

:class:`ModelBridge` runs the proxy's asyncio server in a background thread and gives the
engine plain blocking methods: :meth:`~ModelBridge.start` (the grader endpoint to hand the
sandbox), :meth:`~ModelBridge.configure_unit`, :meth:`~ModelBridge.take_usage`,
:meth:`~ModelBridge.stop`. Control operations are direct method calls (they hop onto the
server's loop), so the local bridge needs no control listener at all; graders only ever get
the grader endpoint.

Used by ``evalkube run`` through :func:`local_model_access` (the engine's bridge factory).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from evalkube import limits
from evalkube.models.run import EvalRunSpec
from evalkube.proxy.bridge_base import CONTROL_TIMEOUT, BridgeLifecycle, grader_listen
from evalkube.proxy.providers import providers_from_spec
from evalkube.proxy.server import ProxyServer, new_event_loop
from evalkube.proxy.service import CallRecorder, ProxyService
from evalkube.proxy.upstream import Provider, Upstream

T = TypeVar("T")


class ModelBridge(BridgeLifecycle):
    """The proxy in a background thread of this process (one per local run)."""

    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        judge_model: str | None = None,
        embedding_model: str | None = None,
        registry: CollectorRegistry | None = None,
        retries: int = limits.GENERATION_RETRIES_DEFAULT,
        backoff_base: float = 0.5,
        max_calls_per_execution: int = limits.MAX_MODEL_CALLS_DEFAULT,
        planned_executions: int | None = None,
        control_listen: str | None = None,
        control_token: str | None = None,
    ) -> None:
        self._service = ProxyService(
            Upstream(providers, retries=retries, backoff_base=backoff_base),
            judge_model=judge_model,
            embedding_model=embedding_model,
            registry=registry,
            max_calls_per_execution=max_calls_per_execution,
            planned_executions=planned_executions,
        )
        self._new_server = partial(
            ProxyServer, self._service, control_listen=control_listen, control_token=control_token
        )
        self.endpoint: str | None = None
        self.control_endpoint: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: ProxyServer | None = None
        self._stop: asyncio.Event | None = None
        self._tmpdir: str | None = None

    @classmethod
    def from_run_spec(
        cls,
        spec: EvalRunSpec,
        registry: CollectorRegistry | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> ModelBridge:
        """A bridge for ``spec``'s providers, judge and embedding models (not started).

        Keys: see :mod:`evalkube.proxy.providers` (``apiKeyEnv`` locally; key files for
        mounted Secrets).
        """
        return cls(
            providers_from_spec(spec, environ),
            judge_model=spec.judge_model,
            embedding_model=spec.embedding_model,
            registry=registry,
            retries=spec.generation.retries,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, socket_path: str | None = None) -> str:
        """Start serving; the grader endpoint (``unix:/path`` or ``http://127.0.0.1:PORT``).

        ``socket_path=None`` listens on a unix socket in a fresh private temporary directory
        (removed by :meth:`stop`); ``"127.0.0.1:0"``-style values listen on TCP loopback.
        """
        if self._thread is not None:
            raise RuntimeError("the model bridge is already started")
        if socket_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="evalkube-bridge-")
        listen = grader_listen(socket_path, self._tmpdir or "")
        loop = new_event_loop()
        ready: Future[None] = Future()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop, listen, ready), name="evalkube-model-bridge", daemon=True
        )
        self._thread.start()
        try:
            ready.result(CONTROL_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        assert self.endpoint is not None
        return self.endpoint

    def _run(self, loop: asyncio.AbstractEventLoop, listen: str, ready: Future[None]) -> None:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            runner.run(self._serve(listen, ready))

    async def _serve(self, listen: str, ready: Future[None]) -> None:
        try:
            self._server = self._new_server(listen=listen)
            self._stop = asyncio.Event()
            await self._server.start()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            await self._service.aclose()
            return
        self.endpoint = self._server.endpoint
        self.control_endpoint = self._server.control_endpoint
        ready.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await self._server.stop()

    def stop(self) -> None:
        """Stop serving, close upstream connections, remove the socket; idempotent."""
        loop, thread, stop = self._loop, self._thread, self._stop
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(stop.set if stop is not None else loop.stop)
            thread.join(CONTROL_TIMEOUT)
        self._loop = self._thread = None
        self._stop = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    # -- control -----------------------------------------------------------------------------
    def configure_unit(
        self, unit_id: str, max_calls_per_execution: int, planned_executions: int
    ) -> None:
        """Serve ``unit_id`` from now on: ``max_calls_per_execution`` per execution and
        ``max_calls_per_execution x planned_executions`` in total, fresh counters."""
        self._on_loop(
            lambda s: s.budgets.configure_unit(unit_id, max_calls_per_execution, planned_executions)
        )

    def open_executions(self, tokens: Iterable[str]) -> None:
        """Let graders call models with these execution tokens (until their usage is taken)."""
        opened = list(tokens)
        self._on_loop(lambda s: s.budgets.open(opened))

    def take_usage(self, execution_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Remove and return the usage of ``execution_ids`` (ids without calls are absent) and
        close them: ``{id: {"calls", "errors", "response_ids", "usage", "latency_ms",
        "by_purpose"}}``."""
        ids = list(execution_ids)
        return self._on_loop(lambda s: s.take_usage(ids))

    def budget(self) -> dict[str, object]:
        """The served unit's budget and use."""
        return self._on_loop(lambda s: s.budgets.snapshot())

    def keep_answers(self, recorder: CallRecorder) -> None:
        """Keep every answer of graders' calls with ``recorder``, and take kept ones from it
        instead of calling again (a resumed local run)."""
        self._running().recorder = recorder

    def metrics(self) -> str:
        """The bridge's Prometheus exposition (graders cannot read it)."""
        return self._running().metrics.exposition().decode()

    def _running(self) -> ProxyService:
        if self._loop is None:
            raise RuntimeError("the model bridge is not started; call start() first")
        return self._service

    def _on_loop(self, operation: Callable[[ProxyService], T]) -> T:
        """``operation(service)`` run on the server's loop thread (budgets and usage are not
        thread-safe), its result or exception handed back here."""
        service = self._running()

        async def run() -> T:
            return operation(service)

        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(CONTROL_TIMEOUT)


def local_model_access(spec: EvalRunSpec) -> ModelBridge:
    """The engine's bridge factory: a started :class:`ModelBridge` on a private unix socket.

    The result has ``endpoint``, ``configure_unit``, ``open_executions``, ``take_usage`` and
    ``close`` (:class:`evalkube.engine.driver.BridgeControl`).
    """
    bridge = ModelBridge.from_run_spec(spec)
    bridge.start()
    return bridge
