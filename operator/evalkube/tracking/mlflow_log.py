"""Log one finished run to an MLflow tracking server with the MLflow client (``mlflow-skinny``).

Blocking and bounded: every step (experiment, run, each batch of params/tags/metrics, each
artifact, the end) is tried :data:`~evalkube.limits.MLFLOW_ATTEMPTS` times with exponential
backoff on what can pass (connection errors, timeouts, 429 and 5xx); a refusal (401, 403, a bad
value) ends it at once. MLflow's own HTTP retries are switched off (they would wait minutes on
a server that is down) and each request has a timeout. Callers run it in a thread.

The MLflow run is found again by its ``evalkube.run_id`` tag, so logging a run twice (a retry
after a failure, an operator restarted while logging) updates one MLflow run instead of making
two. Credentials are MLflow's own variables (``MLFLOW_TRACKING_TOKEN``,
``MLFLOW_TRACKING_USERNAME``/``PASSWORD``), set only while a step runs and under a lock, so two
runs logged at once never see each other's. MLflow's usage telemetry is off.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    sleep_using_event,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
)

from evalkube import limits
from evalkube.tracking.content import TrackedContent

T = TypeVar("T")
#: MLflow's environment is process-wide: one step at a time sets it.
_ENV_LOCK = threading.Lock()


class TrackingFailed(RuntimeError):
    """The run could not be logged; the message says why (never a credential)."""


@dataclass(frozen=True)
class MlflowTarget:
    """Where to log, and as whom (credentials kept out of ``repr``)."""

    tracking_uri: str
    experiment: str
    token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def shown_uri(uri: str) -> str:
    """``uri`` as messages show it: a password in it (``http://user:secret@host``) masked."""
    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
        host = parts.hostname or ""
        netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "(a tracking URI that does not parse)"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Logged:
    """Where the run went: the MLflow run and experiment ids, and the run's page."""

    run_id: str
    experiment_id: str
    url: str


@dataclass(frozen=True)
class Artifact:
    """A file of the run's artifacts: ``write`` makes it at the path it is given."""

    name: str
    write: Callable[[Path], None]


def log_run(
    target: MlflowTarget,
    run_id: str,
    phase: str,
    content: TrackedContent,
    artifacts: Sequence[Artifact] = (),
    *,
    attempts: int = limits.MLFLOW_ATTEMPTS,
    backoff: float = limits.MLFLOW_BACKOFF_SECONDS,
    cancel: threading.Event | None = None,
) -> Logged:
    """Log the run; where it went. :class:`TrackingFailed` says why it could not. Setting
    ``cancel`` ends it before its next try (the operator stops)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param, RunTag
    except ImportError:
        raise TrackingFailed(
            "the MLflow client is not installed: pip install 'evalkube[mlflow]'"
        ) from None
    client = MlflowClient(tracking_uri=target.tracking_uri)

    def step(what: str, call: Callable[[], T]) -> T:
        return _retried(target, what, call, attempts, backoff, cancel or threading.Event())

    experiment_id = step("find the experiment", lambda: _experiment(client, target.experiment))
    mlflow_run = step("find the run", lambda: _existing_run(client, experiment_id, run_id))
    if mlflow_run is None:
        mlflow_run = step(
            "create the run",
            lambda: (
                client.create_run(
                    experiment_id, tags=content.tags, run_name=content.tags.get("mlflow.runName")
                ).info.run_id
            ),
        )
    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in content.params.items()]
    tags = [RunTag(k, v) for k, v in content.tags.items()]
    metrics = [Metric(k, v, now, 0) for k, v in content.metrics.items()]
    for chunk in _batches(params, tags, metrics):
        step(
            "log params, tags and metrics", functools.partial(client.log_batch, mlflow_run, **chunk)
        )
    with tempfile.TemporaryDirectory(prefix="evalkube-mlflow-") as folder:
        for artifact in artifacts:
            path = Path(folder) / artifact.name
            artifact.write(path)
            step(
                f"upload {artifact.name}",
                functools.partial(client.log_artifact, mlflow_run, str(path)),
            )
    status = "FINISHED" if phase == "Succeeded" else "FAILED"
    step("end the run", lambda: client.set_terminated(mlflow_run, status))
    base = shown_uri(target.tracking_uri).rstrip("/")
    page = f"{base}/#/experiments/{experiment_id}/runs/{mlflow_run}"
    return Logged(mlflow_run, experiment_id, page)


def _experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:  # another logger created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def _existing_run(client: Any, experiment_id: str, run_id: str) -> str | None:
    quoted = run_id.replace("\\", "\\\\").replace("'", "\\'")
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`evalkube.run_id` = '{quoted}'", max_results=1
    )
    return str(runs[0].info.run_id) if runs else None


def _batches(params: list[Any], tags: list[Any], metrics: list[Any]) -> Iterator[dict[str, Any]]:
    """``log_batch`` keyword arguments within MLflow's caps (100 params, 100 tags, 1,000
    metrics, 1,000 entities per request)."""
    small = max(len(params), len(tags))
    for start in range(0, small, 100):
        yield {"params": params[start : start + 100], "tags": tags[start : start + 100]}
    for start in range(0, len(metrics), 1000):
        yield {"metrics": metrics[start : start + 1000]}


def _passable(exc: BaseException) -> bool:
    """Worth another try: the server did not answer, timed out, or was busy or broken."""
    status = getattr(exc, "get_http_status_code", None)
    if callable(status):
        code = status()
        return isinstance(code, int) and (code >= 500 or code == 429)
    return isinstance(exc, OSError | TimeoutError)


@contextlib.contextmanager
def _environment(target: MlflowTarget) -> Iterator[None]:
    wanted = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(limits.MLFLOW_REQUEST_SECONDS),
        # the client prints "View run ..." to stdout, where `evalkube run` prints its scores
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
        "MLFLOW_TRACKING_TOKEN": target.token,
        "MLFLOW_TRACKING_USERNAME": target.username,
        "MLFLOW_TRACKING_PASSWORD": target.password,
    }
    settings = {name: value for name, value in wanted.items() if value is not None}
    with _ENV_LOCK:
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _retried(
    target: MlflowTarget,
    what: str,
    call: Callable[[], T],
    attempts: int,
    backoff: float,
    cancel: threading.Event,
) -> T:
    try:
        for attempt in Retrying(
            stop=stop_after_attempt(max(attempts, 1)) | stop_when_event_set(cancel),
            wait=wait_exponential(multiplier=backoff, max=limits.MLFLOW_BACKOFF_MAX_SECONDS),
            sleep=sleep_using_event(cancel),
            retry=retry_if_exception(_passable),
            reraise=False,
        ):
            with attempt, _environment(target):
                return call()
    except RetryError as exc:
        cause = exc.last_attempt.exception()
        raise TrackingFailed(
            f"MLflow at {shown_uri(target.tracking_uri)}: could not {what} after {attempts} "
            f"attempts: {_short(cause)}"
        ) from None
    except Exception as exc:
        raise TrackingFailed(
            f"MLflow at {shown_uri(target.tracking_uri)} refused to {what}: {_short(exc)}"
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _short(exc: BaseException | None) -> str:
    text = " ".join(str(exc).split()) if exc is not None else "unknown error"
    return text[: limits.STATUS_MESSAGE_CHARS // 4]
