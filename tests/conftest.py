"""Shared fixtures: stores on SQLite and on a real PostgreSQL server, a real MLflow server, a
real S3-compatible object store, example paths."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalkube.store import ResultStore
from tests.support.mlflow_server import MlflowServer, mlflow_bin
from tests.support.postgres import find_bindir, postgres_server
from tests.support.s3_server import S3Server, weed_bin

pytest_plugins = ["tests.cluster.plugin"]

ROOT = Path(__file__).resolve().parent.parent

# A test run started in the background of a non-interactive shell (`cmd &`, nohup) inherits
# SIGINT ignored, and so would every process the tests start: the Ctrl-C tests would find their
# children deaf to it. A handled signal is reset to its default in each child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
EXAMPLES = ROOT / "examples"

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
_libc = ctypes.CDLL(None, use_errno=True)


def _subreaper() -> int:
    flag = ctypes.c_int(0)
    _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value


@pytest.fixture(autouse=True)
def _no_subreaper_left_behind() -> Iterator[None]:
    """A worker driven in this process (the worker's unit tests) makes it a child subreaper,
    as the real worker is: every orphan after that (a killed test child's runsc sandbox) would
    become a zombie of pytest's, which no one reaps, and ``runsc delete --force`` waits for
    that pid to go (30 s, then a failed start). Each test gets back the flag it started with."""
    before = _subreaper()
    yield
    if _subreaper() != before:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, before, 0, 0, 0)


#: Fixtures that need a binary ``.ci/test.sh`` builds beside the tests (the control plane, the
#: real node, MLflow, SeaweedFS, helm, promtool). A test using one, itself or through another
#: fixture, is marked ``builds``: ``.ci/test.sh`` runs it once its builds are ready, and every
#: other test while they build (a cold machine's builds hide behind them).
BUILT_FIXTURES = frozenset(
    {"control_plane", "real_node", "mlflow_server", "s3_server", "weed", "helm", "promtool"}
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "builds: needs a binary .ci/test.sh builds beside the tests (set from the fixtures a "
        "test uses and the cluster/realnode markers; never set by hand)",
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by it
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if (
            uses & BUILT_FIXTURES
            or any(item.iter_markers("cluster"))
            or any(item.iter_markers("realnode"))
        ):
            item.add_marker(pytest.mark.builds)


def require(reason: str) -> None:
    """Skip locally, but fail under CI: a missing dependency there is a broken CI."""
    if os.environ.get("CI"):
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    url = os.environ.get("EVALKUBE_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    if find_bindir() is None:
        require("PostgreSQL server binaries are not installed (bash .ci/postgres.sh)")
    with postgres_server() as started:
        yield started


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ResultStore]:
    """A fresh results store on SQLite, and again on a real PostgreSQL server."""
    if request.param == "sqlite":
        opened = ResultStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    else:
        url = request.getfixturevalue("postgres_url")
        opened = ResultStore.open(url)
        from evalkube.store.schema import metadata

        metadata.drop_all(opened.engine)
        metadata.create_all(opened.engine)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real MLflow tracking server on loopback (SQLite backend, local artifact root) for the
    session; `bash .ci/mlflow.sh` installs it."""
    bindir = mlflow_bin()
    if bindir is None or not (bindir / "mlflow").exists():
        require("the MLflow tracking server is not installed (bash .ci/mlflow.sh)")
        raise AssertionError("unreachable")
    server = MlflowServer(bindir, tmp_path_factory.mktemp("mlflow")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def weed() -> Path:
    """SeaweedFS's ``weed`` binary; `bash .ci/seaweedfs.sh` builds it."""
    found = weed_bin()
    if found is None or not found.exists():
        require("SeaweedFS's weed binary is not built (bash .ci/seaweedfs.sh)")
        raise AssertionError("unreachable")
    return found


@pytest.fixture(scope="session")
def s3_server(weed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible store on loopback for the session: SeaweedFS's ``weed server`` with
    an S3 gateway that refuses unsigned requests (tests/support/s3_server.py). Tests make
    buckets of their own names."""
    with S3Server(weed, tmp_path_factory.mktemp("s3")) as server:
        yield server
