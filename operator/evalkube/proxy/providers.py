"""Providers of an EvalRun, resolved for the proxy: base URLs, headers and key sources.

Where a provider's key comes from (first that exists wins, checked at every call so a
rotated Secret is picked up):

1. the file named by ``EVALKUBE_PROVIDER_<NAME>_KEY_FILE`` (``<NAME>``: the provider name
   upper-cased, every character other than A-Z and 0-9 replaced by ``_``);
2. for a provider with ``credentialsSecretRef``: the file ``<dir>/<provider name>``, where
   ``<dir>`` is ``EVALKUBE_PROVIDER_KEYS_DIR`` (default ``/var/run/secrets/evalkube/providers``):
   the controller mounts each provider's Secret key there (a projected volume with
   ``items: [{key: <secret key>, path: <provider name>}]``) into the proxy container only;
3. the environment variable named by ``apiKeyEnv`` (local runs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evalkube.models.run import EvalRun, EvalRunSpec
from evalkube.models.snapshot import RunSnapshot
from evalkube.proxy.upstream import Provider
from evalkube.sources.files import yaml_documents

KEYS_DIR_ENV = "EVALKUBE_PROVIDER_KEYS_DIR"
DEFAULT_KEYS_DIR = "/var/run/secrets/evalkube/providers"


def key_file_env(provider: str) -> str:
    """``openai`` -> ``EVALKUBE_PROVIDER_OPENAI_KEY_FILE``."""
    return f"EVALKUBE_PROVIDER_{re.sub(r'[^A-Z0-9]', '_', provider.upper())}_KEY_FILE"


def providers_from_spec(
    spec: EvalRunSpec, environ: Mapping[str, str] | None = None
) -> dict[str, Provider]:
    """The run's providers with their key sources resolved (see the module docstring)."""
    env = os.environ if environ is None else environ
    keys_dir = Path(env.get(KEYS_DIR_ENV) or DEFAULT_KEYS_DIR)
    providers: dict[str, Provider] = {}
    for name, p in spec.providers.items():
        key_file = env.get(key_file_env(name)) or None
        if key_file is None and p.credentials_secret_ref is not None:
            key_file = str(keys_dir / name)
        providers[name] = Provider(
            name=name,
            base_url=p.base_url,
            api_key_env=p.api_key_env,
            api_key_file=key_file,
            headers=dict(p.headers),
            timeout=p.timeout_seconds,
            api=p.api,
        )
    return providers


def load_run_spec(path: Path) -> EvalRunSpec:
    """An EvalRun (YAML or JSON; the first EvalRun document of the file), a bare spec, or a
    work-unit pod's run snapshot (:class:`~evalkube.models.snapshot.RunSnapshot`).

    Read as a suite or run file is: a regular file of at most
    :data:`~evalkube.limits.SUITE_FILE_BYTES`, its YAML within the alias budget; every
    failure is a :class:`~evalkube.models.ConfigError` (a ``ValueError``) naming the file."""
    documents = yaml_documents(path)
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "EvalRun":
            return EvalRun.model_validate(document).spec
    if len(documents) == 1 and isinstance(documents[0], dict):
        data: dict[str, Any] = documents[0]
        if "run_spec" in data:
            return RunSnapshot.model_validate(data).run_spec
        return EvalRunSpec.model_validate(data.get("spec", data))
    raise ValueError(f"{path}: no EvalRun (or EvalRun spec) found")
