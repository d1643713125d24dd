"""The grader environment: the packages graders may import, beside the standard library.

One environment is managed: the lock file ``evalkube_sandbox/grader-env.lock.txt`` (the
package set of OpenAI's python-grader image) installed by ``.ci/grader-env.sh`` (``make
grader-env``, ``make setup``) into a pip ``--target`` directory outside the work tree, keyed
by the lock's hash::

    ${EVALKUBE_GRADER_ENV_CACHE:-~/.cache/evalkube-grader-env}/<key>/site-packages

(``/var/cache/evalkube-grader-env`` for root: see :func:`cache_root`).

Every local backend shows it read-only at :data:`INSIDE_ENVIRONMENT` and the worker appends
that to ``sys.path`` after the standard library, without ``site`` processing: a grader that
imports nothing pays nothing. The grader image installs the same lock at the same path.

A task picks another with ``grader.environment``: ``default`` (the managed one), ``stdlib``
(nothing), a path (locally: a venv or a ``--target`` directory) or an image (in a cluster:
the grader container's image).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

import evalkube_sandbox
from evalkube.util.cache_home import user_cache_home

#: The lock file, shipped inside the worker package (so the image build and a wheel have it).
LOCK_FILE = Path(evalkube_sandbox.__file__).resolve().parent / "grader-env.lock.txt"
#: The pinned archives the environment's nltk data (``site-packages/nltk_data``) comes from.
NLTK_LOCK_FILE = LOCK_FILE.with_name("nltk-data.lock.txt")
#: Where the environment's nltk corpora are inside it: the workers' ``NLTK_DATA``.
NLTK_DATA_DIR = "nltk_data"
#: Where the environment's site-packages appear inside sandboxes and the grader image.
INSIDE_ENVIRONMENT = "/opt/evalkube-env"
DEFAULT = "default"
STDLIB = "stdlib"
CREATE_HINT = "create it with `make grader-env` (runs .ci/grader-env.sh)"


class EnvironmentProblem(ValueError):
    """A task's ``environment`` cannot be used here; the message names the field."""


def lock_key() -> str:
    """The locks' hash: the cache key .ci/grader-env.sh uses too."""
    return hashlib.sha256(LOCK_FILE.read_bytes() + NLTK_LOCK_FILE.read_bytes()).hexdigest()[:16]


def cache_root() -> Path:
    """``$EVALKUBE_GRADER_ENV_CACHE``, else ``/var/cache/evalkube-grader-env`` for root (its
    home is closed to the sandbox user, uid 65534, that bwrap drops to), else
    ``${XDG_CACHE_HOME:-~/.cache}/evalkube-grader-env``. .ci/grader-env.sh agrees."""
    if explicit := os.environ.get("EVALKUBE_GRADER_ENV_CACHE"):
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/var/cache/evalkube-grader-env")
    return user_cache_home() / "evalkube-grader-env"


def default_dir() -> Path:
    """Where the managed environment of this lock lives (whether or not it exists)."""
    return cache_root() / lock_key()


@cache
def default_site_packages() -> Path | None:
    """The managed environment's package directory, or ``None`` when it is not created."""
    root = default_dir()
    if (root / ".complete").is_file():
        return root / "site-packages"
    print(
        f"evalkube: the grader environment is not installed ({root}): graders get the "
        f"standard library only; {CREATE_HINT}",
        file=sys.stderr,
    )
    return None


def is_path(value: str) -> bool:
    """A local environment (a directory) rather than an image reference."""
    return value.startswith(("/", "./", "../", "~"))


def site_packages_of(directory: Path) -> Path:
    """``directory``'s package directory: a venv's ``lib/python3.X/site-packages`` or the
    directory itself (a ``pip install --target`` directory)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        directory / "site-packages",
        directory / "lib" / version / "site-packages",
    ):
        if candidate.is_dir():
            return candidate
    return directory


@dataclass(frozen=True, slots=True)
class LocalEnvironment:
    """What a local sandbox mounts for a task: a host package directory, or nothing."""

    site_packages: Path | None


def resolve_local(
    value: str | None, *, field: str = "grader.environment", base: Path | None = None
) -> LocalEnvironment:
    """The host directory a local sandbox mounts for ``environment: value`` (a relative path
    is taken from ``base``, the suite file's folder).

    :class:`EnvironmentProblem` (naming ``field``) for an image or a missing directory.
    """
    if value is None or value == DEFAULT:
        return LocalEnvironment(default_site_packages())
    if value == STDLIB:
        return LocalEnvironment(None)
    if not is_path(value):
        raise EnvironmentProblem(
            f"{field}: {value!r} is an image, which only a cluster run can use; locally name "
            f"a directory (a venv or a `pip install --target` directory), {DEFAULT!r} or "
            f"{STDLIB!r}"
        )
    directory = Path(value).expanduser()
    if base is not None and not directory.is_absolute():
        directory = base / directory
    if not directory.is_dir():
        raise EnvironmentProblem(
            f"{field}: {value!r} is not a directory here; name a venv or a `pip install "
            f"--target` directory, {DEFAULT!r} or {STDLIB!r}"
        )
    return LocalEnvironment(site_packages_of(directory.resolve()))


def image_allowed(image: str, sandbox_image: str, patterns: Sequence[str]) -> bool:
    """Whether a task may name ``image`` as its grader environment in a cluster.

    The grader container runs the image's own ``python3`` as its supervisor, the process that
    enforces the grader's memory, process and log limits and kills every grader process when
    a worker ends: an image is therefore as trusted as the sandbox image, and only the
    platform's own patterns (the operator's ``grader_images``) admit one.
    """
    return image == sandbox_image or any(fnmatchcase(image, p) for p in patterns)


def cluster_image(value: str | None, default_image: str, *, field: str) -> str:
    """The grader container's image for ``environment: value`` in a cluster."""
    if value is None or value in (DEFAULT, STDLIB):
        return default_image
    if is_path(value):
        raise EnvironmentProblem(
            f"{field}: {value!r} is a local directory, which a cluster run cannot mount; name "
            f"an image built FROM the evalkube-sandbox image, {DEFAULT!r} or {STDLIB!r}"
        )
    return value
