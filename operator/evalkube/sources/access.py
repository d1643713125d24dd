"""How this process reaches sources: object stores through s3fs, PersistentVolumeClaims where
the pod mounts them, https:// through httpx, local files; every open checked against its pin.

Only trusted code reads sources (``evalkube run``, a work-unit pod's runner, the run's prepare
pod), never a grader. In a cluster the runner reaches the store through the egress gateway
(``proxy``: its URL with the run's grant as Basic credentials), as the proxy sidecar reaches
providers; the store's credentials are the runner's environment (``AWS_ACCESS_KEY_ID``...,
from the Secrets ``spec.storage.s3`` names).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import ssl
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from evalkube import limits
from evalkube.models import ConfigError, S3StorageSpec
from evalkube.sources.files import open_regular
from evalkube.sources.pins import SourcePin
from evalkube.sources.uri import SourceURI

#: Where a work-unit pod mounts the PersistentVolumeClaims its sources name (read-only).
PVC_ROOT = Path("/var/run/evalkube/pvc")
#: Block size of object-store reads (one ranged GET each; a shard's rows come in a few).
S3_BLOCK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store says of an object without reading it."""

    size: int
    etag: str | None = None
    version_id: str | None = None
    mtime_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Opened:
    """An opened source: its bytes, and their SHA-256 where opening read them whole."""

    handle: IO[bytes]
    info: ObjectInfo
    """The object's size and identity as it was opened."""
    sha256: str | None = None


class SourceChanged(ConfigError):
    """The object is not the one the run pinned (changed, replaced, or gone)."""


@dataclass
class SourceAccess:
    """Where and how sources are read by this process.

    ``s3``: the run's ``spec.storage.s3`` (endpoint and region; credentials from the
    environment's AWS chain); ``pvc_root``: where claims are mounted (``None``: not in a pod,
    pvc:// refused); ``proxy``: an HTTP proxy every s3:// and https:// request goes through
    (a callable, so a renewed grant is read at each open).
    """

    s3: S3StorageSpec | None = None
    pvc_root: Path | None = None
    proxy: Callable[[], str] | None = None
    ca_bundle: Path | None = None
    """PEM certificates to trust for https:// (default: the system's and ``SSL_CERT_FILE``)."""
    _s3fs: dict[tuple[int, bool, str | None], Any] = field(default_factory=dict, repr=False)

    # -- opening ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self, source: SourceURI, where: str, pin: SourcePin | None = None) -> Iterator[Opened]:
        """The object's bytes as stored (compressed when it is), seekable; with ``pin``, only
        when it is still the object pinned (else :class:`SourceChanged`)."""
        if source.scheme in ("file", "pvc"):
            with open_regular(self.local_path(source, where), where) as handle:
                st = os.fstat(handle.fileno())
                if pin is not None and (st.st_size, st.st_mtime_ns) != (pin.size, pin.mtime_ns):
                    raise SourceChanged(
                        f"{where}: {source.raw} changed since the run pinned it (size "
                        f"{pin.size:,} -> {st.st_size:,}, or modified since); a run reads "
                        "the bytes it started with: put them back, or start a new run"
                    )
                yield Opened(handle, ObjectInfo(size=st.st_size, mtime_ns=st.st_mtime_ns))
            return
        if source.scheme == "s3":
            with self._open_s3(source, where, pin) as handle:
                details = handle.raw.details  # type: ignore[attr-defined]
                version = details.get("VersionId")  # "null" from an unversioned bucket
                info = ObjectInfo(
                    size=int(details.get("size", 0)),
                    etag=details.get("ETag"),
                    version_id=(None if version in (None, "", "null") else str(version))
                    or (pin.version_id if pin is not None else None),
                )
                yield Opened(handle, info)
            return
        with self._fetch_https(source, where, pin.sha256 if pin else None) as opened:
            yield opened

    def local_path(self, source: SourceURI, where: str) -> Path:
        """The file of a ``file`` or ``pvc`` source."""
        if source.scheme == "file":
            return Path(source.location)
        if self.pvc_root is None:
            raise ConfigError(
                f"{where}: {source.raw} names a PersistentVolumeClaim, which only a cluster "
                "run mounts; locally give the file's path"
            )
        claim, inner = source.claim_path
        return self.pvc_root / claim / inner

    # -- s3 -----------------------------------------------------------------------------------
    def s3_filesystem(self, version_aware: bool = False) -> Any:
        """An s3fs filesystem for the run's store (one per process, since s3fs's event loop
        does not survive a fork, and per proxy grant and versioning)."""
        import s3fs  # imported here: the operator never reads a source

        proxy = self.proxy() if self.proxy is not None else None
        key = (os.getpid(), version_aware, proxy)
        if key not in self._s3fs:
            spec = self.s3 or S3StorageSpec()
            endpoint = s3_endpoint(self.s3)
            config: dict[str, Any] = {
                "connect_timeout": limits.SOURCE_CONNECT_SECONDS,
                "read_timeout": limits.SOURCE_READ_SECONDS,
                "retries": {"max_attempts": limits.SOURCE_ATTEMPTS, "mode": "standard"},
            }
            if endpoint:
                config["s3"] = {"addressing_style": "path"}
            if proxy:
                config["proxies"] = {"http": proxy, "https": proxy}
            client: dict[str, Any] = {"region_name": spec.region or "us-east-1"}
            if self.ca_bundle is not None:
                client["verify"] = str(self.ca_bundle)
            self._s3fs[key] = s3fs.S3FileSystem(
                endpoint_url=endpoint,
                client_kwargs=client,
                config_kwargs=config,
                version_aware=version_aware,
                skip_instance_cache=True,
                default_block_size=S3_BLOCK_BYTES,
            )
        return self._s3fs[key]

    def _s3_call(
        self,
        source: SourceURI,
        where: str,
        call: Callable[[Any, str], Any],
        version_aware: bool = False,
    ) -> Any:
        fs = self.s3_filesystem(version_aware)
        try:
            return call(fs, source.location)
        except FileNotFoundError:
            raise ConfigError(
                f"{where}: {source.raw} does not exist (or the run's credentials may not list it)"
            ) from None
        except PermissionError as exc:
            raise ConfigError(
                f"{where}: {source.raw}: access denied ({exc}); check spec.storage.s3's credentials"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read {source.raw} ({exc})") from None

    @contextlib.contextmanager
    def _open_s3(
        self, source: SourceURI, where: str, pin: SourcePin | None
    ) -> Iterator[io.BufferedReader]:
        versioned = pin is not None and pin.version_id is not None
        # Parquet is read in the exact ranges pyarrow asks for (a footer, column chunks);
        # JSONL and CSV sequentially, a block ahead
        cache = "none" if source.format == "parquet" else "readahead"
        kwargs: dict[str, Any] = {"mode": "rb", "cache_type": cache}
        if pin is not None and versioned:
            kwargs["version_id"] = pin.version_id
        handle = self._s3_call(
            source, where, lambda fs, path: fs.open(path, **kwargs), version_aware=versioned
        )
        try:
            if pin is not None and not versioned:
                etag = handle.details.get("ETag")
                if etag != pin.etag or int(handle.details.get("size", -1)) != pin.size:
                    raise SourceChanged(
                        f"{where}: {source.raw} changed since the run pinned it (ETag "
                        f"{pin.etag} -> {etag}); a run reads the bytes it started with: put "
                        "them back, or start a new run"
                    )
            # s3fs makes every ranged GET If-Match the ETag it opened: a change mid-read
            # fails the read instead of mixing two objects. Its file reads lines only whole:
            # a buffered reader bounds them (and keeps s3fs's block cache underneath).
            yield io.BufferedReader(handle, buffer_size=1 << 16)
        finally:
            handle.close()

    # -- https --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _fetch_https(self, source: SourceURI, where: str, sha256: str | None) -> Iterator[Opened]:
        """The whole object in a temporary file, its SHA-256 checked before it is read."""
        proxy = self.proxy() if self.proxy is not None else None
        digest = hashlib.sha256()
        size = 0
        timeout = httpx.Timeout(limits.SOURCE_READ_SECONDS, connect=limits.SOURCE_CONNECT_SECONDS)
        with tempfile.TemporaryFile() as spool:
            try:
                verify: Any = True
                if self.ca_bundle is not None:
                    verify = ssl.create_default_context(cafile=str(self.ca_bundle))
                with httpx.stream(
                    "GET",
                    source.raw,
                    proxy=proxy,
                    timeout=timeout,
                    follow_redirects=False,
                    verify=verify,
                ) as response:
                    if response.status_code != 200:
                        raise ConfigError(
                            f"{where}: {source.raw} answered HTTP {response.status_code}"
                        )
                    for block in response.iter_raw(1 << 20):
                        size += len(block)
                        if size > limits.SOURCE_HTTPS_BYTES_MAX:
                            raise ConfigError(
                                f"{where}: {source.raw} is larger than "
                                f"{limits.SOURCE_HTTPS_BYTES_MAX:,} bytes; put it in an "
                                "object store (s3://) or on a volume (pvc://)"
                            )
                        digest.update(block)
                        spool.write(block)
            except httpx.HTTPError as exc:
                raise ConfigError(f"{where}: cannot fetch {source.raw} ({exc})") from None
            if sha256 is not None and digest.hexdigest() != sha256:
                raise SourceChanged(
                    f"{where}: {source.raw} has sha256 {digest.hexdigest()}, not the "
                    f"{sha256} it is pinned to; nothing of it was read"
                )
            spool.seek(0)
            yield Opened(spool, ObjectInfo(size=size), digest.hexdigest())


def s3_endpoint(spec: S3StorageSpec | None) -> str | None:
    """The store's endpoint: ``spec.storage.s3``'s, else the AWS variables' (else AWS S3)."""
    return (
        (spec.endpoint_url if spec else None)
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
