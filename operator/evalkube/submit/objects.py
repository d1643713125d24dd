"""Uploads to the object store ``--store`` names, through s3fs as the run's pods read it.

The store is the run's ``spec.storage.s3`` (its endpoint and region; else
``AWS_ENDPOINT_URL``), with this machine's AWS credential chain (environment, profile). Keys
are content-addressed, so a HEAD comes first and an object already there of the same size is
not sent again. A file is streamed in parts of :data:`limits.SUBMIT_UPLOAD_PART_BYTES`
(:data:`limits.SUBMIT_UPLOAD_CONCURRENCY` at once): never read whole into memory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fsspec.callbacks import Callback

from evalkube import limits
from evalkube.models import ConfigError, S3StorageSpec
from evalkube.sources import SourceAccess
from evalkube.sources.access import s3_endpoint
from evalkube.submit.plan import Upload


class StoreUnreachable(RuntimeError):
    """The object store did not answer, or failed the request (not a refusal of ours)."""


class ObjectStore:
    """The store uploads go to."""

    def __init__(self, s3: S3StorageSpec | None) -> None:
        self.spec = s3
        self._access = SourceAccess(s3=s3)

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages."""
        return s3_endpoint(self.spec) or "AWS S3"

    def has(self, upload: Upload) -> bool:
        """Whether the object is there already with the file's size (a HEAD)."""
        path = f"{upload.bucket}/{upload.key}"
        try:
            info = self._call(upload, lambda fs: fs.info(path), missing_ok=True)
        except FileNotFoundError:
            return False
        return int(info.get("size", -1)) == upload.file.size

    def put(self, upload: Upload, advance: Callable[[int], None]) -> None:
        """Stream the file to its key; ``advance(bytes)`` as each part is sent."""
        path = f"{upload.bucket}/{upload.key}"
        with _local_bytes(upload) as local:
            self._call(
                upload,
                lambda fs: fs.put_file(
                    str(local),
                    path,
                    callback=_Advance(advance),
                    chunksize=limits.SUBMIT_UPLOAD_PART_BYTES,
                    max_concurrency=limits.SUBMIT_UPLOAD_CONCURRENCY,
                    ContentType="application/octet-stream",
                ),
            )

    def _call(self, upload: Upload, call: Callable[[Any], Any], *, missing_ok: bool = False) -> Any:
        where = f"{upload.file.field}: {upload.uri}"
        try:
            return call(self._access.s3_filesystem())
        except FileNotFoundError:
            if missing_ok:
                raise
            raise ConfigError(
                f"{where}: bucket {upload.bucket!r} does not exist at {self.endpoint}"
            ) from None
        except PermissionError as exc:
            raise ConfigError(
                f"{where}: access denied by {self.endpoint} ({exc}); check the AWS credentials "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the bucket"
            ) from None
        except Exception as exc:  # botocore and aiohttp errors, wrapped or not by s3fs
            if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
                raise ConfigError(
                    f"{where}: no AWS credentials found for {self.endpoint}; set "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
                ) from None
            raise StoreUnreachable(f"{where}: {self.endpoint}: {exc}") from None


@contextmanager
def _local_bytes(upload: Upload) -> Iterator[Path]:
    """The file to send: the file itself, or a ``.json`` array's JSONL in a temporary file."""
    if upload.file.converted is None:
        yield upload.file.path
        return
    with tempfile.TemporaryDirectory(prefix="evalkube-submit-") as tmp:
        converted = Path(tmp) / upload.file.filename
        converted.write_bytes(upload.file.converted)
        yield converted


class _Advance(Callback):  # type: ignore[misc]
    """fsspec's progress callback, as increments."""

    def __init__(self, advance: Callable[[int], None]) -> None:
        super().__init__()
        self._advance = advance
        self._sent = 0

    def call(self, hook_name: str | None = None, **kwargs: Any) -> None:
        done = int(self.value or 0)
        if done > self._sent:
            self._advance(done - self._sent)
            self._sent = done
