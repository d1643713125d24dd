"""EvalSuite: tasks with their dataset, prompt, extraction, grader and declared metrics."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from evalkube.models.base import SpecModel
from evalkube.models.crd import Rule, cel, cluster, present
from evalkube.models.grader import GraderSpec, PreprocessSpec
from evalkube.models.meta import ObjectMeta
from evalkube.models.refs import ConfigMapKeyRef
from evalkube.models.run import Condition

#: A source URI's scheme as a cluster can read it (a local path is for ``evalkube run``).
CLUSTER_URI = r"^(s3|pvc|https)://"
#: A SHA-256 in hex, as ``sha256sum`` prints it.
SHA256_HEX = r"^[0-9a-f]{64}$"
#: Formats a ``uri`` source may hold; default from the name (``.jsonl``, ``.jsonl.gz``,
#: ``.jsonl.zst``, ``.parquet``, ``.csv``, ``.csv.gz``).
SourceFormat = Literal["jsonl", "parquet", "csv"]


def _uri_rules(kind: str) -> list[Rule]:
    """CEL rules of a ``uri`` source (``kind``: the field's name in messages)."""
    return [
        Rule(
            rule=f"!{present('uri')} || self.uri.matches('{CLUSTER_URI}')",
            message=(
                f"{kind}.uri must be s3://BUCKET/KEY, pvc://CLAIM/PATH or https://... in a "
                "cluster (a local path is for `evalkube run`; `evalkube submit` uploads it)"
            ),
            reason="FieldValueInvalid",
            field_path=".uri",
        ),
        Rule(
            rule=f"!{present('uri')} || !self.uri.startsWith('https://') || {present('sha256')}",
            message=f"an https:// {kind}.uri needs `sha256`: what is read is pinned to it",
            reason="FieldValueRequired",
            field_path=".sha256",
        ),
    ]


class DatasetSpec(SpecModel):
    """Where a task's rows come from: inline rows, a local file, a ConfigMap key, or a ``uri``
    (an object store, a PersistentVolumeClaim, a pinned HTTPS URL, a local file)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                rule=(
                    f"[{present('rows')}, {present('path')}, {present('configMapRef')}, "
                    f"{present('uri')}].filter(x, x).size() == 1"
                ),
                message="set exactly one of `rows`, `path`, `configMapRef` or `uri`",
            ),
            Rule(
                rule=f"!{present('path')}",
                message=(
                    "`path` names a file on your machine and is for local runs "
                    "(`evalkube run`); in a cluster use `uri` (s3://, pvc://, https:// with "
                    "sha256), or put the JSONL in a ConfigMap and use `configMapRef: {name, key}`"
                ),
                reason="FieldValueForbidden",
                field_path=".path",
            ),
            *_uri_rules("dataset"),
        )
    )

    rows: list[dict[str, Any]] | None = Field(
        default=None, json_schema_extra=cluster(max_items=10_000)
    )
    """Inline rows."""
    path: str | None = Field(default=None, json_schema_extra=cluster(max_length=4_096))
    """A JSONL (or ``.json`` array) file, relative to the suite file (local runs only)."""
    config_map_ref: ConfigMapKeyRef | None = None
    """A ConfigMap key holding JSONL (cluster runs)."""
    uri: str | None = Field(default=None, min_length=1, json_schema_extra=cluster(max_length=4_096))
    """``s3://BUCKET/KEY`` (the run's ``storage.s3``), ``pvc://CLAIM/PATH`` (mounted read-only
    into the runner), ``https://...`` (with ``sha256``), or a local path / ``file://`` URL
    (local runs). JSONL (plain, ``.gz``, ``.zst``), Parquet or CSV; shards read only their
    rows."""
    format: SourceFormat | None = None
    """Format of ``uri``; default from its name."""
    sha256: str | None = Field(default=None, pattern=SHA256_HEX)
    """SHA-256 of the object at ``uri`` (required for https://): a run reads those bytes or
    fails naming the object."""
    id_field: str | None = Field(default=None, json_schema_extra=cluster(max_length=253))
    """Row field holding a stable row id; default: the row's position."""

    @model_validator(mode="after")
    def _exactly_one(self) -> DatasetSpec:
        sources = ("rows", "path", "config_map_ref", "uri")
        if sum(getattr(self, n) is not None for n in sources) != 1:
            raise ValueError("set exactly one of `rows`, `path`, `configMapRef` or `uri`")
        _check_uri_source(self.uri, self.sha256, self.format)
        return self


def _check_uri_source(uri: str | None, sha256: str | None, format: str | None) -> None:
    """The checks a ``uri`` source gets wherever it is loaded (the CRD repeats them in CEL)."""
    if uri is None:
        if sha256 is not None or format is not None:
            raise ValueError("`sha256` and `format` describe a `uri`; set `uri` too")
        return
    if uri.startswith("https://") and sha256 is None:
        raise ValueError("an https:// uri needs `sha256`: what is read is pinned to it")
    if uri.startswith("http://"):
        raise ValueError(
            f"uri {uri!r}: plain http:// is not accepted; use https:// with sha256 (or s3://)"
        )


class Message(SpecModel):
    """One chat message of a prompt; ``content`` is a template."""

    role: Literal["system", "developer", "user", "assistant"]
    """Chat role."""
    content: str
    """Jinja2 template rendered with ``item`` (the row), ``few_shot`` and ``task_id``."""


class ExtractionSpec(SpecModel):
    """How ``extracted_output`` is derived from ``output_text``."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                rule=f"!has(self.type) || self.type != 'regex' || {present('pattern')}",
                message="`pattern` is required when type is `regex`",
                reason="FieldValueRequired",
                field_path=".pattern",
            ),
            Rule(
                rule=f"!has(self.type) || self.type != 'json' || {present('field')}",
                message="`field` is required when type is `json`",
                reason="FieldValueRequired",
                field_path=".field",
            ),
        )
    )

    type: Literal["none", "regex", "json", "choice"] = "none"
    """``none`` (stripped text), ``regex`` (first group), ``json`` (a field), ``choice``
    (the first of ``item.choices`` found in the text)."""
    pattern: str | None = Field(default=None, json_schema_extra=cluster(max_length=4_096))
    """Regular expression for ``regex``; its first group (or the whole match) is taken."""
    field: str | None = Field(default=None, json_schema_extra=cluster(max_length=1_024))
    """Dotted path of the value for ``json`` (for example ``answer`` or ``result.label``)."""
    ignore_case: bool = False
    """Case-insensitive matching for ``regex`` and ``choice``."""

    @model_validator(mode="after")
    def _required_parameters(self) -> ExtractionSpec:
        if self.type == "regex" and not self.pattern:
            raise ValueError("`pattern` is required when type is `regex`")
        if self.type == "json" and not self.field:
            raise ValueError("`field` is required when type is `json`")
        return self


class OutputsSpec(SpecModel):
    """Precomputed candidate outputs, so a suite runs with no model at all.

    Used by the model ``precomputed`` (or ``precomputed:LABEL`` to select lines whose
    ``model`` equals LABEL in a JSONL file).
    """

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                rule=(
                    f"[{present('column')}, {present('path')}, {present('uri')}]"
                    ".filter(x, x).size() == 1"
                ),
                message="set exactly one of `column`, `path` or `uri`",
            ),
            Rule(
                rule=f"!{present('path')}",
                message=(
                    "outputs.path names a file on your machine and is for local runs; in a "
                    "cluster use outputs.uri (s3://, pvc://, https:// with sha256) or "
                    "outputs.column"
                ),
                reason="FieldValueForbidden",
                field_path=".path",
            ),
            *_uri_rules("outputs"),
        )
    )

    column: str | None = Field(default=None, json_schema_extra=cluster(max_length=253))
    """Dataset column holding ``output_text``."""
    extracted_column: str | None = Field(default=None, json_schema_extra=cluster(max_length=253))
    """Dataset column holding ``extracted_output`` (skips extraction)."""
    path: str | None = Field(default=None, json_schema_extra=cluster(max_length=4_096))
    """JSONL file of ``{id, output_text, extracted_output?, model?}`` keyed by row id."""
    uri: str | None = Field(default=None, min_length=1, json_schema_extra=cluster(max_length=4_096))
    """The same records (JSONL, Parquet or CSV) at a ``uri``, as ``dataset.uri`` takes it."""
    format: SourceFormat | None = None
    """Format of ``uri``; default from its name."""
    sha256: str | None = Field(default=None, pattern=SHA256_HEX)
    """SHA-256 of the object at ``uri`` (required for https://)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> OutputsSpec:
        if sum(getattr(self, n) is not None for n in ("column", "path", "uri")) != 1:
            raise ValueError("set exactly one of `column`, `path` or `uri`")
        _check_uri_source(self.uri, self.sha256, self.format)
        return self


#: A stop sequence, as long as a cluster allows.
StopSequence = Annotated[str, Field(json_schema_extra=cluster(max_length=1_024))]
#: A metric id, as long as a cluster allows (a label value's 253).
MetricName = Annotated[str, Field(json_schema_extra=cluster(max_length=253))]


class TaskSpec(SpecModel):
    """One task of a suite: rows -> prompt -> candidate -> extraction -> grader."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            Rule(
                rule=f"{present('grader')} != {present('graders')}",
                message="set exactly one of `grader` or `graders` (a list of criteria)",
            )
        )
    )

    id: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9_.-]*[a-z0-9])?$")
    """Task id: lowercase letters, digits, ``_``, ``-``, ``.``; unique within the suite."""
    dataset: DatasetSpec
    """The task's rows."""
    preprocess: PreprocessSpec | None = None
    """Optional preprocessor, run in the sandbox before rendering."""
    prompt: str | list[Message] | None = None
    """Jinja2 template (or chat messages). Required unless outputs are precomputed."""
    target: str | None = Field(default=None, json_schema_extra=cluster(max_length=65_536))
    """Jinja2 template of the reference answer (``item.target``)."""
    choices: list[str] | str | None = None
    """Answer choices: a list, or the name of a row field holding the list."""
    few_shot: list[dict[str, Any]] = Field(
        default_factory=list, json_schema_extra=cluster(max_items=1_000)
    )
    """Few-shot example rows, available to templates as ``few_shot``."""
    stop: list[StopSequence] = Field(default_factory=list, json_schema_extra=cluster(max_items=32))
    """Stop sequences: ``output_text`` is cut at the first one before extraction."""
    extraction: ExtractionSpec = Field(default_factory=ExtractionSpec)
    """How to extract the answer from the output."""
    outputs: OutputsSpec | None = None
    """Precomputed outputs for the ``precomputed`` model."""
    grader: GraderSpec | None = None
    """The Python grader (or use ``graders`` for several criteria)."""
    graders: list[GraderSpec] | None = Field(default=None, min_length=1, max_length=20)
    """Several criteria over one set of candidates (OpenAI's ``testing_criteria``): each
    needs a unique ``name``, which is its default ``metricId``."""
    metrics: list[MetricName] | None = Field(default=None, json_schema_extra=cluster(max_items=64))
    """Declared metric ids; undeclared batch metrics are dropped from aggregates."""
    grader_inputs: Literal["evalkube", "openai"] = "evalkube"
    """What graders get as ``sample`` and ``item``. ``evalkube`` (docs/graders.md): the row
    plus ``prompt``, ``target``, ``reference_answer``, ``choices``, ``task_id``, and a sample
    with ``extracted_output``, ``model``, ids. ``openai`` (``evalkube import openai`` writes
    it): OpenAI's namespaces, ``item`` the row exactly and ``sample`` with ``output_text``,
    ``output_tools``, ``choices`` and, when the run asks for structured output,
    ``output_json``."""

    @model_validator(mode="after")
    def _one_grader_field(self) -> TaskSpec:
        if (self.grader is None) == (self.graders is None):
            raise ValueError("set exactly one of `grader` or `graders` (a list of criteria)")
        if self.graders is None:
            return self
        names: set[str] = set()
        metric_ids: set[str] = set()
        for index, grader in enumerate(self.graders):
            if grader.name is None:
                raise ValueError(f"graders[{index}].name is required: it names the criterion")
            if grader.name in names:
                raise ValueError(f"graders[{index}].name {grader.name!r} is used twice")
            names.add(grader.name)
            if "metric_id" not in grader.model_fields_set:
                grader.metric_id = grader.name
            if grader.metric_id in metric_ids:
                raise ValueError(
                    f"graders[{index}].metricId {grader.metric_id!r} is used by another "
                    "criterion; give each criterion its own"
                )
            metric_ids.add(grader.metric_id)
            if len(self.graders) > 1 and grader.resolved_execution == "aggregate":
                raise ValueError(
                    f"graders[{index}]: grade_batch graders cannot share a task with other "
                    "criteria; put it in a task of its own"
                )
        return self

    @property
    def criteria(self) -> list[GraderSpec]:
        """The task's graders in order (one for ``grader``)."""
        if self.graders is not None:
            return self.graders
        assert self.grader is not None
        return [self.grader]

    @property
    def primary_grader(self) -> GraderSpec:
        """The first criterion: its execution mode decides the task's units."""
        return self.criteria[0]

    def grader_fields(self) -> list[tuple[str, GraderSpec]]:
        """``(field, spec)`` per criterion: ``grader``, or ``graders[i]``. A Python
        criterion's sandbox program is named after its field."""
        if self.graders is None:
            return [("grader", self.primary_grader)]
        return [(f"graders[{i}]", g) for i, g in enumerate(self.graders)]

    def grader_programs(self) -> list[tuple[str, GraderSpec]]:
        """``(program name, spec)`` of the Python criteria (built-ins run in the engine)."""
        return [(name, g) for name, g in self.grader_fields() if not g.builtin]


class EvalSuiteSpec(SpecModel):
    """The tasks of a suite."""

    tasks: list[TaskSpec] = Field(
        min_length=1,
        max_length=200,
        json_schema_extra=cel(
            Rule(
                rule="self.all(t, self.exists_one(u, u.id == t.id))",
                message="task ids must be unique within a suite",
            )
        ),
    )
    """At least one task; ids must be unique."""

    @model_validator(mode="after")
    def _unique_task_ids(self) -> EvalSuiteSpec:
        seen: set[str] = set()
        for task in self.tasks:
            if task.id in seen:
                raise ValueError(f"task id {task.id!r} is used twice; task ids must be unique")
            seen.add(task.id)
        return self


class EvalSuiteStatus(SpecModel):
    """What the operator found when it checked the suite."""

    phase: Literal["Ready", "Invalid"] | None = None
    """Ready when every task's spec, code and references check out; otherwise Invalid."""
    observed_generation: int | None = None
    """The spec generation this status describes."""
    suite_version: str | None = None
    """sha256 over the spec, the grader and preprocessor code and the referenced datasets."""
    conditions: list[Condition] = Field(default_factory=list)
    """The Ready condition, with the problems in its message."""


class EvalSuite(SpecModel):
    """Tasks to evaluate: each task's dataset, prompt, extraction and sandboxed Python grader.
    EvalRuns reference a suite by name."""

    api_version: Literal["evalkube.io/v1alpha1"] = "evalkube.io/v1alpha1"
    kind: Literal["EvalSuite"] = "EvalSuite"
    metadata: ObjectMeta
    spec: EvalSuiteSpec
    status: EvalSuiteStatus | None = None
