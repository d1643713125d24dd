"""What a ``uri`` names: its scheme, where the object is, its format and compression.

Parsing is pure (no I/O), so the operator checks a suite's URIs without reaching any store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import unquote, urlsplit

from evalkube.models import ConfigError

Scheme = Literal["file", "s3", "pvc", "https"]
Format = Literal["jsonl", "parquet", "csv"]
Compression = Literal["gzip", "zstd"]

#: Schemes a cluster reads (a local file is for ``evalkube run``).
CLUSTER_SCHEMES: tuple[Scheme, ...] = ("s3", "pvc", "https")
_FORMATS: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
}
_COMPRESSIONS: dict[str, Compression] = {".gz": "gzip", ".zst": "zstd"}
#: A PersistentVolumeClaim name (an RFC 1123 subdomain).
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: An S3 bucket name, as AWS and the compatible stores accept it.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,253}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class SourceURI:
    """A parsed ``uri``: ``location`` is an absolute path (``file``), ``BUCKET/KEY`` (``s3``),
    ``CLAIM/PATH`` (``pvc``) or the URL itself (``https``)."""

    raw: str
    scheme: Scheme
    location: str
    format: Format
    compression: Compression | None

    @property
    def claim_path(self) -> tuple[str, str]:
        claim, _, path = self.location.partition("/")
        return claim, path


def parse_uri(
    raw: str, where: str, base_dir: Path | None = None, fmt: str | None = None
) -> SourceURI:
    """``raw`` parsed; ``base_dir`` resolves a relative local path (``None``: a local path is
    refused, as in a cluster). Errors name ``where`` (the field) and what to write instead."""
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        if base_dir is None:
            raise ConfigError(
                f"{where}: {raw!r} is a local path, which a cluster cannot read; use "
                "s3://BUCKET/KEY, pvc://CLAIM/PATH or https://... with sha256 (`evalkube "
                "submit` uploads local files)"
            )
        local = Path(unquote(parts.path)) if scheme == "file" else Path(raw)
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ConfigError(f"{where}: file:// URLs name this machine (file:///abs/path)")
        location = str((base_dir / local).resolve())
        return SourceURI(raw, "file", location, *_format(location, where, fmt))
    if scheme == "s3":
        bucket, key = parts.netloc, parts.path.lstrip("/")
        if not _BUCKET.match(bucket) or not key or parts.query or parts.fragment:
            raise ConfigError(f"{where}: {raw!r} is not s3://BUCKET/KEY")
        return SourceURI(raw, "s3", f"{bucket}/{key}", *_format(key, where, fmt))
    if scheme == "pvc":
        claim, path = parts.netloc, parts.path.lstrip("/")
        pure = PurePosixPath(path)
        if not _CLAIM.match(claim) or not path or ".." in pure.parts or parts.query:
            raise ConfigError(
                f"{where}: {raw!r} is not pvc://CLAIM/PATH (a PersistentVolumeClaim of the "
                "run's namespace and a path inside it, without '..')"
            )
        return SourceURI(raw, "pvc", f"{claim}/{pure}", *_format(path, where, fmt))
    if scheme == "https":
        if not parts.hostname or parts.username or parts.password:
            raise ConfigError(
                f"{where}: {raw!r} must be https://HOST/PATH without credentials in it"
            )
        return SourceURI(raw, "https", raw, *_format(parts.path, where, fmt))
    raise ConfigError(
        f"{where}: {raw!r}: scheme {parts.scheme!r} is not one evalkube reads; use s3://, "
        "pvc://, https:// (with sha256) or a local path"
    )


def _format(name: str, where: str, declared: str | None) -> tuple[Format, Compression | None]:
    """The format (declared, or from the name) and the compression (from the name)."""
    suffixes = PurePosixPath(name.lower()).suffixes
    compression = _COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression is not None:
        suffixes = suffixes[:-1]
    inferred = _FORMATS.get(suffixes[-1]) if suffixes else None
    fmt = _FORMATS.get(f".{declared}") if declared else inferred
    if fmt is None:
        raise ConfigError(
            f"{where}: cannot tell the format of {name!r} from its name; name it .jsonl, "
            ".parquet or .csv (.gz or .zst compressed for JSONL and CSV) or set `format`"
        )
    if fmt == "parquet" and compression is not None:
        raise ConfigError(
            f"{where}: {name!r}: a Parquet file compresses its own pages; store it without .gz/.zst"
        )
    return fmt, compression
