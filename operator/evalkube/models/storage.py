"""``spec.storage`` of an EvalRun: how the run reaches the object store its datasets live in.

A suite names where its rows are (``dataset.uri: s3://bucket/key``); the run says how to reach
that store here, so one suite runs against AWS, a cluster's SeaweedFS or MinIO unchanged. In a
cluster the credentials come from Secrets the trusted runner mounts (never the grader); locally
they come from the usual AWS chain (environment, profile), and ``endpointURL`` from here or
``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from evalkube.models.base import SpecModel
from evalkube.models.crd import cluster
from evalkube.models.refs import ConfigMapKeyRef, SecretKeyRef

#: An endpoint the runner can reach: ``http(s)://host[:port]``, no path, no credentials.
ENDPOINT_URL = re.compile(r"^https?://[^\s/@]+/?$")


class S3StorageSpec(SpecModel):
    """An S3-compatible object store (AWS S3, SeaweedFS, MinIO, Ceph RGW, GCS interop)."""

    endpoint_url: str | None = Field(
        default=None,
        validation_alias="endpointURL",
        serialization_alias="endpointURL",
        json_schema_extra=cluster(max_length=2_048, pattern=ENDPOINT_URL.pattern),
    )
    """The store's endpoint, for example ``http://seaweedfs.storage.svc:8333``; unset: AWS
    (or ``AWS_ENDPOINT_URL`` in local runs)."""
    region: str | None = Field(default=None, json_schema_extra=cluster(max_length=64))
    """Signing region; default ``us-east-1``."""
    access_key_id_secret_ref: SecretKeyRef | None = Field(
        default=None,
        validation_alias="accessKeyIDSecretRef",
        serialization_alias="accessKeyIDSecretRef",
    )
    """Secret key holding the access key id (cluster runs; the runner alone mounts it)."""
    secret_access_key_secret_ref: SecretKeyRef | None = None
    """Secret key holding the secret access key (cluster runs; the runner alone mounts it)."""

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not ENDPOINT_URL.match(value):
            raise ValueError(
                f"endpointURL {value!r} must be http(s)://host[:port] with no path or "
                "credentials (credentials come from accessKeyIDSecretRef and "
                "secretAccessKeySecretRef)"
            )
        return value.rstrip("/") if value else value


class StorageSpec(SpecModel):
    """Object stores the run's ``s3://`` datasets and outputs are read from."""

    s3: S3StorageSpec | None = None
    """The S3-compatible store of every ``s3://`` URI of the suite."""
    ca_bundle_config_map_ref: ConfigMapKeyRef | None = None
    """A ConfigMap key holding PEM certificates the runner trusts for https:// sources and
    an https:// ``endpointURL`` (a private CA; cluster runs: locally ``SSL_CERT_FILE`` and
    ``AWS_CA_BUNDLE``)."""
