"""What a local suite becomes in a cluster: the rewriting of ``evalkube submit``.

Everything here is pure except :class:`LocalFile`'s reading and hashing of the files a suite
names, so the rewriting is tested without a cluster or an object store:

- a task's local dataset (``path``, or a ``uri`` naming a local file) and local outputs
  (``outputs.path``, a local ``outputs.uri``) become objects under ``--store``
  (``PREFIX/<suite>/<sha256>/<filename>``, so the same bytes are never uploaded twice) named by
  ``uri: s3://...``; a ``.json`` array becomes JSONL. Without ``--store`` a JSONL dataset that
  fits a ConfigMap becomes one (``configMapRef``; its name holds the bytes' sha256, so a run
  in flight never sees a later submit's rows); anything else is refused, naming the file and
  ``--store``.
- grader and preprocessor ``file`` paths become keys of the suite's code ConfigMap
  (``<suite>-code``) and ``file: <suite>-code/<key>``.
- a path-based ``environment`` is refused (a cluster cannot mount a local directory).
- a provider whose key is in an environment variable (``apiKeyEnv``, as local runs name it)
  gets it from a Secret the submit creates (``<run>-provider-keys``, one key per provider,
  owned by the EvalRun once it exists so deleting the run deletes it):
  ``credentialsSecretRef`` replaces ``apiKeyEnv``. A variable that is not set is refused,
  naming it. The key itself never enters a manifest that is printed (:meth:`Plan.shown`).

The result is checked as the operator will check it (:func:`~evalkube.controller.snapshot.
check_suite`) before anything leaves this machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from evalkube import limits
from evalkube.controller import names
from evalkube.controller.snapshot import check_suite
from evalkube.engine.loading import LoadedSuite, iter_json_rows, resolve_run_spec
from evalkube.models import (
    ConfigError,
    ConfigMapKeyRef,
    DatasetSpec,
    EvalRun,
    EvalRunSpec,
    EvalSuite,
    OutputsSpec,
    SecretKeyRef,
    SpecError,
    SuiteRef,
    TaskSpec,
    validate_spec,
)
from evalkube.models.base import SpecModel
from evalkube.sandbox.environment import is_path
from evalkube.sources import SourceURI, parse_uri
from evalkube.sources.files import open_regular

#: Who applied an object (the field manager of the server-side apply, and a label).
FIELD_MANAGER = "evalkube-submit"
MANAGED_BY = {names.LABEL_MANAGED_BY: FIELD_MANAGER}
LABEL_SUITE = f"{names.DOMAIN}/suite"
#: The annotation of the provider keys' Secret naming each key's environment variable.
KEYS_FROM = f"{names.DOMAIN}/keys-from-env"
#: A Kubernetes object name (an RFC 1123 subdomain).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: An S3 bucket, as the stores accept it.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
#: What a ConfigMap key may hold.
_KEY_CHARS = re.compile(r"[^-._a-zA-Z0-9]")
#: A Secret's data key (Kubernetes: ``[-._a-zA-Z0-9]+``, not ``.`` or ``..``).
_SECRET_KEY = re.compile(r"^(?!\.\.?$)[-._a-zA-Z0-9]{1,253}$")
#: Line breaks ``str.splitlines`` sees but a JSONL reader does not: valid raw inside a JSON
#: string, so written as their escapes (the same value) in a ConfigMap, whose rows the operator
#: counts by ``splitlines``.
_SPLITLINES_ONLY = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_JSONL_SUFFIXES = (".jsonl", ".ndjson")


class SubmitRefused(ConfigError):
    """The suite cannot go to a cluster as it is; ``problems`` says why, one line each."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "cannot submit:\n" + "\n".join(f"  - {problem}" for problem in self.problems)
        )


@dataclass(frozen=True, slots=True)
class Store:
    """``--store s3://BUCKET[/PREFIX]``: where local data files are uploaded."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, raw: str) -> Store:
        parts = urlsplit(raw)
        prefix = parts.path.strip("/")
        if (
            parts.scheme != "s3"
            or not _BUCKET.match(parts.netloc)
            or parts.query
            or parts.fragment
            or ".." in PurePosixPath(prefix).parts
        ):
            raise ConfigError(
                f"--store {raw!r}: give s3://BUCKET or s3://BUCKET/PREFIX (the run's "
                "spec.storage.s3 store; credentials from the AWS environment or profile)"
            )
        return cls(parts.netloc, prefix)

    def key(self, suite: str, sha256: str, filename: str) -> str:
        """The content-addressed key of a file: the same bytes always get the same key."""
        return "/".join(part for part in (self.prefix, suite, sha256, filename) if part)


@dataclass(frozen=True, slots=True)
class LocalFile:
    """A local data file as the cluster will get it: its bytes (the file itself, or the JSONL
    of a ``.json`` array in ``converted``), their size and SHA-256, the name they go by."""

    field: str
    """The field that names it (``tasks[qa].dataset.path``)."""
    path: Path
    filename: str
    size: int
    sha256: str
    converted: bytes | None = None

    @classmethod
    def jsonl(cls, path: Path, field: str) -> LocalFile:
        """A ``path`` dataset or outputs file (JSONL, or a ``.json`` array made JSONL)."""
        if path.suffix == ".json":
            rows = iter_json_rows(path, field)  # bounded: limits.DATASET_JSON_BYTES
            data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
            digest = hashlib.sha256(data).hexdigest()
            return cls(field, path, f"{path.stem}.jsonl", len(data), digest, data)
        name = path.name if path.name.lower().endswith(_JSONL_SUFFIXES) else f"{path.name}.jsonl"
        return cls.as_is(path, field, _key_name(name))

    @classmethod
    def as_is(cls, path: Path, field: str, filename: str | None = None) -> LocalFile:
        """The file's own bytes, hashed as they are streamed (never held whole)."""
        digest = hashlib.sha256()
        size = 0
        with open_regular(path, field) as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        return cls(field, path, filename or _key_name(path.name), size, digest.hexdigest())

    @property
    def named(self) -> str:
        """The file as messages name it."""
        return shown(self.path)

    def read(self) -> bytes:
        """The bytes, for a file small enough for a ConfigMap."""
        if self.converted is not None:
            return self.converted
        with open_regular(self.path, self.field) as handle:
            return handle.read(self.size + 1)


@dataclass(frozen=True, slots=True)
class Upload:
    """A local file to put at ``uri`` (unless the store has it already)."""

    file: LocalFile
    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass
class Plan:
    """Everything ``evalkube submit`` uploads and applies, in order."""

    namespace: str
    suite_name: str
    run_name: str
    config_maps: list[dict[str, Any]] = field(default_factory=list)
    suite: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    uploads: list[Upload] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    secret: dict[str, Any] | None = None
    """The provider keys read from ``apiKeyEnv`` variables (``stringData``), if any."""

    @property
    def manifests(self) -> list[dict[str, Any]]:
        """ConfigMaps and the keys' Secret first (the suite's check reads the ConfigMaps; a
        pod must find the Secret), then the EvalSuite, then the EvalRun."""
        return [*self.config_maps, *([self.secret] if self.secret else []), self.suite, self.run]

    def shown(self) -> list[dict[str, Any]]:
        """:attr:`manifests` as ``--dry-run`` prints them: the keys replaced by where they
        come from."""
        if self.secret is None:
            return self.manifests
        where = {key: f"<the value of ${var}>" for key, var in self.secret_sources.items()}
        secret = {**self.secret, "stringData": where}
        return [secret if m is self.secret else m for m in self.manifests]

    @property
    def secret_name(self) -> str:
        """The keys' Secret's name (empty when there is none)."""
        return str(self.secret["metadata"]["name"]) if self.secret is not None else ""

    @property
    def secret_sources(self) -> dict[str, str]:
        """Secret key -> the environment variable it was read from."""
        if self.secret is None:
            return {}
        sources: dict[str, str] = json.loads(self.secret["metadata"]["annotations"][KEYS_FROM])
        return sources

    def owned_secret(self, run_uid: str) -> dict[str, Any] | None:
        """The keys' Secret owned by the applied EvalRun (Kubernetes deletes it with the
        run)."""
        if self.secret is None:
            return None
        owner = {
            "apiVersion": self.run["apiVersion"],
            "kind": "EvalRun",
            "name": self.run_name,
            "uid": run_uid,
        }
        meta = {**self.secret["metadata"], "ownerReferences": [owner]}
        return {**self.secret, "metadata": meta}


def namespace_of(
    loaded: LoadedSuite, run: EvalRun | None, flag: str | None, context_default: str
) -> str:
    """``-n``, else the namespace the files name, else the kubeconfig context's; a file
    naming another namespace than ``-n`` is refused (as kubectl does)."""
    named = {
        where: meta.namespace
        for where, meta in (
            ("the suite file", loaded.suite.metadata),
            ("the run file", run.metadata if run is not None else None),
        )
        if meta is not None and meta.namespace
    }
    if flag is not None:
        for where, namespace in named.items():
            if namespace != flag:
                raise ConfigError(
                    f"{where} names namespace {namespace!r}, not the {flag!r} of -n/--namespace; "
                    "drop one of them"
                )
        return flag
    if len(set(named.values())) > 1:
        raise ConfigError(
            "the suite and run files name different namespaces "
            f"({', '.join(sorted(set(named.values())))}); give -n/--namespace"
        )
    return next(iter(named.values()), context_default)


def build_plan(
    loaded: LoadedSuite,
    run: EvalRun | None,
    *,
    namespace: str,
    now: datetime,
    store: Store | None = None,
    run_name: str | None = None,
    models: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Plan:
    """The cluster's view of ``loaded`` and ``run``; :class:`SubmitRefused` lists every
    problem at once."""
    problems: list[str] = []
    suite_name = loaded.name
    spec = resolve_run_spec(loaded, run, models)
    name = run_name or (run.metadata.name if run is not None else None)
    name = name or names.fit(suite_name, now.strftime("%Y%m%d-%H%M%S"), 253)
    for named, value, fix in (
        ("metadata.name:", suite_name, "rename the suite"),
        ("the EvalRun's name", name, "give --name"),
    ):
        if not _NAME.match(value):
            problems.append(
                f"{named} {value!r} is not a Kubernetes name (lowercase letters, digits, '-' "
                f"and '.'); {fix}"
            )
    plan = Plan(namespace, suite_name, name)
    rewriter = _Rewriter(loaded, store, plan, problems)
    suite = loaded.suite.model_copy(deep=True)
    for task in suite.spec.tasks:
        rewriter.task(task)
    code = rewriter.code_config_map()
    plan.config_maps = ([code] if code else []) + list(rewriter.data.values())
    if run is not None and spec.suite_ref is not None and spec.suite_ref.name != suite_name:
        plan.warnings.append(
            f"the run file's suiteRef {spec.suite_ref.name!r} is replaced by the submitted "
            f"suite {suite_name!r}"
        )
    spec = spec.model_copy(update={"suite_ref": SuiteRef(name=suite_name)})
    spec, plan.secret = _provider_keys(spec, name, namespace, suite_name, environ, problems)
    if plan.uploads:
        plan.warnings.extend(_storage_warnings(spec.storage.s3 if spec.storage else None))
    suite_meta = _meta(loaded.suite.metadata.model_dump(), suite_name, namespace, suite_name)
    run_meta = _meta(run.metadata.model_dump() if run else {}, name, namespace, suite_name)
    plan.suite = _resource(suite.api_version, "EvalSuite", suite_meta, suite.spec)
    plan.run = _resource(suite.api_version, "EvalRun", run_meta, spec)
    if not problems:
        problems.extend(_checked(plan))
    if problems:
        raise SubmitRefused(problems)
    return plan


def spelled(model: SpecModel) -> dict[str, Any]:
    """``model`` as the CRDs spell it (camelCase, :meth:`SpecModel.to_wire`), with only the
    fields the files set (or this rewriting did): a default stays the cluster's to apply (an
    EvalRun without ``shardSize`` takes the operator's)."""
    return model.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")


def _resource(api_version: str, kind: str, meta: dict[str, Any], spec: SpecModel) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spelled(spec)}


def _checked(plan: Plan) -> list[str]:
    """Problems of the manifests as the API server and the operator will see them."""
    problems: list[str] = []
    for model, manifest in ((EvalSuite, plan.suite), (EvalRun, plan.run)):
        try:
            validate_spec(model, manifest, prefix="")
        except SpecError as exc:
            problems.extend(f"{manifest['kind']} {p}" for p in exc.problems)
    data = {
        (cm["metadata"]["name"], key): value
        for cm in plan.config_maps
        for key, value in cm["data"].items()
    }
    check = check_suite(plan.namespace, plan.suite["spec"], lambda _ns, n, k: data.get((n, k)))
    problems.extend(check.problems)
    return problems


def _provider_keys(
    spec: EvalRunSpec,
    run_name: str,
    namespace: str,
    suite: str,
    environ: Mapping[str, str] | None,
    problems: list[str],
) -> tuple[EvalRunSpec, dict[str, Any] | None]:
    """``spec`` with each ``apiKeyEnv`` provider reading the keys' Secret, and that Secret
    (``None`` when no provider names a variable)."""
    environ = os.environ if environ is None else environ
    keys: dict[str, str] = {}
    sources: dict[str, str] = {}
    secret_name = names.fit(run_name, "provider-keys", 253)
    providers = dict(spec.providers)
    for provider, config in spec.providers.items():
        if config.credentials_secret_ref is not None or not config.api_key_env:
            continue
        variable = config.api_key_env
        value = environ.get(variable)
        if not value:
            problems.append(
                f"providers.{provider}.apiKeyEnv: the environment variable {variable} is not "
                "set here, and a cluster run reads its key from a Secret this submit makes of "
                f"it; export {variable}, or name an existing Secret with "
                f"providers.{provider}.credentialsSecretRef"
            )
            continue
        if not _SECRET_KEY.match(provider):
            problems.append(
                f"providers.{provider}.apiKeyEnv: the provider's name becomes the key of the "
                "Secret that holds its API key, and may hold only letters, digits, '-', '_' "
                "and '.' (at most 253); rename the provider"
            )
            continue
        keys[provider], sources[provider] = value, variable
        providers[provider] = config.model_copy(
            update={
                "api_key_env": None,
                "credentials_secret_ref": SecretKeyRef(name=secret_name, key=provider),
            }
        )
    if not keys:
        return spec, None
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name,
            "namespace": namespace,
            "labels": {**MANAGED_BY, LABEL_SUITE: names.run_label(suite)},
            "annotations": {KEYS_FROM: json.dumps(sources, sort_keys=True)},
        },
        "type": "Opaque",
        "stringData": keys,
    }
    return spec.model_copy(update={"providers": providers}), secret


def _storage_warnings(s3: Any) -> list[str]:
    if s3 is None:
        return [
            "the run has no spec.storage.s3: its pods read the uploaded s3:// objects from AWS "
            "S3 without credentials; set endpointURL, accessKeyIDSecretRef and "
            "secretAccessKeySecretRef in the run file"
        ]
    if s3.access_key_id_secret_ref is None or s3.secret_access_key_secret_ref is None:
        return [
            "spec.storage.s3 names no credentials (accessKeyIDSecretRef, "
            "secretAccessKeySecretRef): the run's pods read the uploaded objects anonymously"
        ]
    return []


def _meta(source: Mapping[str, Any], name: str, namespace: str, suite: str) -> dict[str, Any]:
    """Metadata as applied: the file's labels and annotations, nothing server-owned."""
    labels = {**(source.get("labels") or {}), **MANAGED_BY, LABEL_SUITE: names.run_label(suite)}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if source.get("annotations"):
        meta["annotations"] = dict(source["annotations"])
    return meta


def shown(path: Path) -> str:
    """A path as messages name it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _key_name(name: str) -> str:
    return _KEY_CHARS.sub("_", name)[-200:] or "data.jsonl"


class _Rewriter:
    """Rewrites one task at a time (in place, on a copy of the suite), collecting uploads,
    ConfigMaps and problems."""

    def __init__(
        self, loaded: LoadedSuite, store: Store | None, plan: Plan, problems: list[str]
    ) -> None:
        self.loaded = loaded
        self.store = store
        self.plan = plan
        self.problems = problems
        self.code_name = names.fit(loaded.name, "code", 253)
        #: resolved file -> its key in the code ConfigMap
        self.code_keys: dict[str, str] = {}
        self.code: dict[str, str] = {}
        #: ConfigMap name -> manifest
        self.data: dict[str, dict[str, Any]] = {}
        self._files: dict[tuple[str, Path], LocalFile] = {}

    # -- data ---------------------------------------------------------------------------------
    def task(self, task: TaskSpec) -> None:
        where = f"tasks[{task.id}]"
        for source in (self.dataset, self.outputs):
            try:
                source(task, where)
            except ConfigError as exc:
                self.problems.append(str(exc))
        self.programs(task, where)

    def dataset(self, task: TaskSpec, where: str) -> None:
        dataset = task.dataset
        found = self._local(dataset, f"{where}.dataset")
        if found is None:
            return
        local, source = found
        if self.store is not None:
            uri, sha256 = self._uploaded(local, dataset.sha256, source)
            task.dataset = DatasetSpec(
                uri=uri, format=dataset.format, sha256=sha256, id_field=dataset.id_field
            )
        elif source is None or (source.format == "jsonl" and source.compression is None):
            task.dataset = DatasetSpec(
                config_map_ref=self._config_map(local), id_field=dataset.id_field
            )
        else:
            self.problems.append(
                f"{local.field}: {local.named} is {_described(source.format, source.compression)}"
                ", which only an object store serves a cluster; give --store s3://BUCKET/PREFIX "
                "to upload it"
            )

    def outputs(self, task: TaskSpec, where: str) -> None:
        outputs = task.outputs
        if outputs is None:
            return
        found = self._local(outputs, f"{where}.outputs")
        if found is None:
            return
        local, source = found
        if self.store is None:
            self.problems.append(
                f"{local.field}: {local.named}: a cluster reads precomputed outputs from "
                "outputs.uri (an object store) or outputs.column; give --store "
                "s3://BUCKET/PREFIX to upload it"
            )
            return
        uri, sha256 = self._uploaded(local, outputs.sha256, source)
        task.outputs = OutputsSpec(
            uri=uri,
            format=outputs.format,
            sha256=sha256,
            extracted_column=outputs.extracted_column,
        )

    def _local(
        self, spec: DatasetSpec | OutputsSpec, field: str
    ) -> tuple[LocalFile, SourceURI | None] | None:
        """The local file of a ``path`` source (made JSONL), or of a local ``uri`` (as it is,
        checked against the declared ``sha256``) with the parsed uri; ``None`` for a source
        the cluster reads itself."""
        base = self.loaded.base_dir
        if spec.path is not None:
            return self._file("jsonl", base / spec.path, f"{field}.path"), None
        if spec.uri is None or urlsplit(spec.uri).scheme.lower() not in ("", "file"):
            return None
        source = parse_uri(spec.uri, f"{field}.uri", base, spec.format)
        local = self._file("as_is", Path(source.location), f"{field}.uri")
        if spec.sha256 is not None and spec.sha256 != local.sha256:
            raise ConfigError(
                f"{field}.sha256: {local.named} has sha256 {local.sha256}, not the declared "
                f"{spec.sha256}; fix the sha256 or the file"
            )
        return local, source

    def _uploaded(
        self, local: LocalFile, declared: str | None, source: SourceURI | None
    ) -> tuple[str, str | None]:
        """The ``uri`` and ``sha256`` of an uploaded source: a Parquet file is pinned by its
        footer (and ETag) unless a declared sha256 asks for a read of it all."""
        parquet = source is not None and source.format == "parquet"
        return self._upload(local).uri, declared if parquet else local.sha256

    def _file(self, kind: str, path: Path, field: str) -> LocalFile:
        """Each file read and hashed once, however many tasks name it."""
        key = (kind, path.resolve())
        if key not in self._files:
            made = LocalFile.jsonl(path, field) if kind == "jsonl" else LocalFile.as_is(path, field)
            self._files[key] = made
        return dataclasses.replace(self._files[key], field=field)

    def _upload(self, local: LocalFile) -> Upload:
        assert self.store is not None
        key = self.store.key(self.loaded.name, local.sha256, local.filename)
        upload = Upload(local, self.store.bucket, key)
        if all(u.key != key for u in self.plan.uploads):
            self.plan.uploads.append(upload)
        return upload

    def _config_map(self, local: LocalFile) -> ConfigMapKeyRef:
        """The ConfigMap holding ``local`` (refused past :data:`limits.SUBMIT_CONFIGMAP_BYTES`,
        naming ``--store``)."""
        bound = limits.SUBMIT_CONFIGMAP_BYTES
        if local.size > bound:
            raise ConfigError(
                f"{local.field}: {local.named} is {local.size:,} bytes, more than a ConfigMap "
                f"holds ({bound:,} bytes here; Kubernetes stores at most 1 MiB per object); give "
                "--store s3://BUCKET/PREFIX to upload it to an object store instead"
            )
        try:
            text = local.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{local.field}: {local.named} is not UTF-8 text (byte {exc.start}), which a "
                "ConfigMap's data must be; give --store s3://BUCKET/PREFIX to upload it"
            ) from None
        for raw, escaped in _SPLITLINES_ONLY.items():
            text = text.replace(raw, escaped)
        name = names.fit(self.loaded.name, f"data-{local.sha256[:10]}", 253)
        self.data[name] = self._config_map_manifest(name, {local.filename: text})
        return ConfigMapKeyRef(name=name, key=local.filename)

    def _config_map_manifest(self, name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.plan.namespace,
                "labels": {**MANAGED_BY, LABEL_SUITE: names.run_label(self.loaded.name)},
            },
            "data": data,
        }

    # -- code ---------------------------------------------------------------------------------
    def programs(self, task: TaskSpec, where: str) -> None:
        codes: list[tuple[str, Any]] = list(task.grader_programs())
        if task.preprocess is not None:
            codes.append(("preprocess", task.preprocess))
        for kind, code in codes:
            environment = getattr(code, "environment", None)
            if environment is not None and is_path(environment):
                self.problems.append(
                    f"{where}.{kind}.environment: {environment!r} is a directory on this "
                    "machine, which a cluster cannot mount; build an image FROM the "
                    "evalkube-sandbox image with those packages installed (docs/graders.md) "
                    "and name it here, or use `default` or `stdlib`"
                )
            if code.file is None:
                continue
            text, filename = self.loaded.sources[(task.id, kind)]
            code.file = f"{self.code_name}/{self._code_key(Path(filename), text)}"

    def _code_key(self, path: Path, text: str) -> str:
        """The file's key: its name, or with a hash of its path when another file of the
        suite has that name."""
        resolved = str(path.resolve())
        if resolved not in self.code_keys:
            key = _key_name(path.name)
            if key in self.code:
                digest = hashlib.sha256(resolved.encode()).hexdigest()[:8]
                key = _key_name(f"{path.stem}-{digest}{path.suffix}")
            self.code_keys[resolved] = key
            self.code[key] = text
        return self.code_keys[resolved]

    def code_config_map(self) -> dict[str, Any] | None:
        if not self.code:
            return None
        size = sum(len(text.encode()) for text in self.code.values())
        if size > limits.SUBMIT_CONFIGMAP_BYTES:
            largest = sorted(self.code, key=lambda k: -len(self.code[k]))[:3]
            self.problems.append(
                f"the suite's grader and preprocessor files hold {size:,} bytes, more than its "
                f"code ConfigMap {self.code_name} holds ({limits.SUBMIT_CONFIGMAP_BYTES:,}); the "
                f"largest: {', '.join(largest)}; make them smaller"
            )
        return self._config_map_manifest(self.code_name, dict(sorted(self.code.items())))


def _described(fmt: str, compression: str | None) -> str:
    shown = {"jsonl": "JSONL", "csv": "CSV", "parquet": "Parquet"}[fmt]
    return f"{compression}-compressed {shown}" if compression else shown
