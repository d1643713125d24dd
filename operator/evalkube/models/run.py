"""EvalRun: which suite, which models, which providers; and the status the operator writes."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from evalkube import limits
from evalkube.models.base import SpecModel
from evalkube.models.crd import Rule, cel, cluster
from evalkube.models.gate import GateSpec, GateStatus
from evalkube.models.meta import ObjectMeta
from evalkube.models.refs import SecretKeyRef
from evalkube.models.storage import StorageSpec
from evalkube.models.tracking import TrackingSpec

MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9_-]*(:.+)?$")
#: A Kueue LocalQueue name as a label value can hold it (a DNS subdomain within 63 characters).
QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
PRECOMPUTED = "precomputed"
#: A model id; a cluster also checks its shape with the pattern (the CLI's validator names the
#: offending id instead).
ModelId = Annotated[str, Field(json_schema_extra=cluster(max_length=256, pattern=MODEL_ID.pattern))]


ProviderAPI = Literal["responses", "chat_completions"]


class ProviderSpec(SpecModel):
    """An OpenAI-compatible provider (Responses or Chat Completions, and Embeddings APIs)."""

    base_url: str = Field(
        min_length=1,
        validation_alias="baseURL",
        serialization_alias="baseURL",
        json_schema_extra=cluster(max_length=2_048),
    )
    """API base URL, for example ``https://api.openai.com/v1``."""
    credentials_secret_ref: SecretKeyRef | None = None
    """Secret holding the API key (cluster runs)."""
    api_key_env: str | None = Field(default=None, json_schema_extra=cluster(max_length=253))
    """Environment variable holding the API key (local runs)."""
    headers: dict[str, Annotated[str, Field(json_schema_extra=cluster(max_length=8_192))]] = Field(
        default_factory=dict,
        json_schema_extra=cluster(max_properties=32)
        | cel(
            Rule(
                rule=(
                    "self.all(h, !(h.lowerAscii() in ['authorization', 'api-key', 'x-api-key']))"
                ),
                message=(
                    "headers must not carry credentials (Authorization, api-key, x-api-key); "
                    "use credentialsSecretRef"
                ),
                reason="FieldValueForbidden",
            )
        ),
    )
    """Extra request headers (never credentials: use the Secret or environment variable)."""
    timeout_seconds: float = Field(default=60.0, gt=0, le=600)
    """Per-request timeout."""
    api: ProviderAPI = "responses"
    """API serving model answers: ``responses`` (``POST /responses``) or ``chat_completions``
    (``POST /chat/completions``, as vLLM, llama.cpp and Ollama serve; evalkube translates the
    Responses requests of candidate generation and graders, and the answers back)."""

    @field_validator("headers")
    @classmethod
    def _no_credentials_in_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() in {"authorization", "api-key", "x-api-key"}:
                raise ValueError(
                    f"header {name!r} carries credentials; use credentialsSecretRef or apiKeyEnv"
                )
        return value


class GenerationSpec(SpecModel):
    """Candidate generation parameters sent with every Responses API request (a Chat
    Completions provider gets their Chat counterparts: docs/proxy.md)."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output token cap."""
    top_p: float | None = Field(default=None, ge=0, le=1)
    """Nucleus sampling."""
    seed: int | None = Field(default=None, strict=True)
    """Seed, where the provider supports one."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """Reasoning effort of reasoning models (sent as ``reasoning.effort``)."""
    response_format: dict[str, Any] | None = None
    """Structured output: ``{type: json_object}`` or ``{type: json_schema, json_schema:
    {name, schema, strict}}`` (OpenAI's ``response_format``; sent as ``text.format``). An
    imported OpenAI task's graders then get ``sample.output_json``."""
    tools: list[dict[str, Any]] | None = Field(
        default=None, json_schema_extra=cluster(max_items=128)
    )
    """Tools the model may call: function tools in the Chat Completions shape (``{type:
    function, function: {name, description, parameters, strict}}``) or the Responses shape
    (``{type: function, name, ...}``); calls reach graders as ``sample.output_tools``."""
    tool_choice: str | dict[str, Any] | None = None
    """``auto``, ``none``, ``required``, or one function (``{type: function, function:
    {name}}`` or ``{type: function, name}``)."""
    concurrency: int = Field(default=limits.GENERATION_CONCURRENCY_DEFAULT, ge=1, le=256)
    """Concurrent requests per unit."""
    retries: int = Field(default=limits.GENERATION_RETRIES_DEFAULT, ge=0, le=20)
    """Retries on 429, 5xx and timeouts (exponential backoff, honouring Retry-After)."""

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        kind = value.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise ValueError(
                f"responseFormat.type {kind!r} must be text, json_object or json_schema"
            )
        schema = value.get("json_schema")
        if kind == "json_schema" and not (
            isinstance(schema, dict) and isinstance(schema.get("name"), str)
        ):
            raise ValueError(
                "responseFormat of type json_schema needs json_schema: {name, schema, strict}"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, tool in enumerate(value or []):
            function = tool.get("function", tool)
            if tool.get("type") != "function" or not isinstance(function, dict):
                raise ValueError(
                    f"tools[{index}]: only function tools ({{type: function, function: "
                    f"{{name, parameters}}}}) can be carried, not type {tool.get('type')!r}"
                )
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise ValueError(f"tools[{index}]: a function tool needs a `name`")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is None or value in ("auto", "none", "required"):
            return value
        if isinstance(value, dict) and value.get("type") == "function":
            function = value.get("function", value)
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                return value
        raise ValueError(
            "toolChoice must be auto, none, required or {type: function, function: {name}}"
        )


class SuiteRef(SpecModel):
    """Reference to an EvalSuite in the run's namespace."""

    name: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """EvalSuite name."""


class EvalRunSpec(SpecModel):
    """What to evaluate and with which models."""

    model_config = ConfigDict(
        json_schema_extra=cluster(required=["suiteRef"])
        | cel(
            Rule(
                rule=(
                    "self.models.all(m, m == 'precomputed' || m.startsWith('precomputed:') || "
                    "m == 'local' || m.startsWith('local:') || "
                    "(has(self.providers) && self.providers.exists(p, m == p || "
                    "m.startsWith(p + ':'))))"
                ),
                message=(
                    "every model's provider (the part before `:`) must be declared in "
                    "`providers` (add providers.<name>.baseURL), or be `precomputed`"
                ),
                field_path=".models",
            )
        )
    )

    suite_ref: SuiteRef | None = None
    """The suite to run (required in a cluster; the CLI takes the suite file instead)."""
    models: list[ModelId] = Field(
        min_length=1,
        max_length=50,
        json_schema_extra=cel(
            Rule(rule="self.all(m, self.exists_one(n, n == m))", message="models must be unique")
        ),
    )
    """Models under test as ``provider:model``; ``precomputed`` uses the tasks' outputs."""
    judge_model: ModelId | None = None
    """Model for ``ctx.responses_create(model="auto")``."""
    embedding_model: ModelId | None = None
    """Model for ``ctx.embeddings_create(model="auto")``."""
    providers: dict[str, ProviderSpec] = Field(
        default_factory=dict, json_schema_extra=cluster(max_properties=32)
    )
    """Providers by name, as used in model ids."""
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    """Candidate generation parameters."""
    shard_size: int | None = Field(default=None, ge=1, le=1_000_000)
    """Rows per work unit. Unset: in a cluster the operator's ``EVALKUBE_SHARD_SIZE``
    (resolved once, into the run's snapshot), locally 10,000."""
    gate: GateSpec | None = None
    """Thresholds, error rate and baseline the finished run must pass (the Passed condition)."""
    queue_name: str | None = Field(
        default=None, max_length=63, json_schema_extra=cluster(pattern=QUEUE_NAME.pattern)
    )
    """Kueue LocalQueue of the run's work-unit Jobs: they get the label
    ``kueue.x-k8s.io/queue-name`` and start suspended until Kueue admits them (cluster only)."""
    tracking: TrackingSpec | None = None
    """Experiment trackers the finished run is logged to (MLflow)."""
    storage: StorageSpec | None = None
    """How the run reaches the object store of the suite's ``s3://`` datasets and outputs."""

    @field_validator("models")
    @classmethod
    def _model_ids(cls, value: list[str]) -> list[str]:
        for model in value:
            if not MODEL_ID.match(model):
                raise ValueError(
                    f"model {model!r} is not `provider:model` (or `precomputed[:label]`)"
                )
        if len(set(value)) != len(value):
            raise ValueError("models must be unique")
        return value

    @field_validator("queue_name")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        if value is not None and not QUEUE_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a Kueue LocalQueue name: use lowercase letters, digits, "
                "'-' and '.', starting and ending with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _providers_known(self) -> EvalRunSpec:
        for field, models in (
            ("models", self.models),
            ("judgeModel", [self.judge_model] if self.judge_model else []),
            ("embeddingModel", [self.embedding_model] if self.embedding_model else []),
        ):
            for model in models:
                provider = model.split(":", 1)[0]
                if provider in (PRECOMPUTED, "local") or provider in self.providers:
                    continue
                raise ValueError(
                    f"{field}: provider {provider!r} of {model!r} is not declared in "
                    f"`providers`; add providers.{provider}.baseURL"
                )
        return self


Phase = Literal["Pending", "Running", "Succeeded", "Failed"]


class Condition(SpecModel):
    """A Kubernetes-style status condition."""

    type: str
    """Condition type: Ready or Succeeded."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = ""
    """Machine-readable reason in CamelCase."""
    message: str = ""
    """What happened and what to do, for people."""
    observed_generation: int | None = None
    """The spec generation the condition was computed from."""
    last_transition_time: str | None = None
    """When the status last changed (RFC 3339)."""


class SampleCounts(SpecModel):
    """Counts of samples by outcome."""

    samples: int = 0
    """All samples of the task and model."""
    valid: int = 0
    """Graded with a valid result."""
    invalid: int = 0
    """Samples whose grader raised, timed out or returned an invalid value (scored 0)."""
    errored: int = 0
    """No grade: preprocessing, rendering, generation or extraction failed."""


class CriterionCounts(SpecModel):
    """Pass/fail of one criterion with a ``passThreshold`` (OpenAI's ``result_counts``)."""

    passed: int = 0
    """Graded samples whose score is >= the threshold."""
    failed: int = 0
    """Graded samples (valid or invalid) whose score is below the threshold."""


class TaskModelResult(SpecModel):
    """Aggregates of one task x model."""

    task: str
    """Task id."""
    model: str
    """Model id."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Mean of each per-sample score (missing counts 0) and the batch metrics: the declared
    ones, then others in name order up to 64 in all."""
    metrics_omitted: int | None = None
    """Metric names left out of ``metrics`` by the cap (at least this many); their scores stay
    on the samples in the store."""
    counts: SampleCounts = Field(default_factory=SampleCounts)
    """Samples by outcome."""
    criteria: dict[str, CriterionCounts] = Field(default_factory=dict)
    """Passed and failed samples per criterion that sets ``passThreshold``."""
    model_calls: dict[str, int] = Field(default_factory=dict)
    """Model calls by purpose (candidate, judge, embedding), and ``retries``: requests sent
    again that may have reached the provider (each may be billed)."""
    error: str | None = None
    """Why the task's batch grading failed, when it did."""


class UnitCounts(SpecModel):
    """Work units of a run by state."""

    total: int = 0
    """Units planned for the run (shards, plus one grade_batch unit per batch task x model)."""
    succeeded: int = 0
    """Units whose runner recorded every sample and reported the unit done."""
    running: int = 0
    """Units with a Job that has not finished."""
    failed: int = 0
    """Units whose Job failed after its retries, or that never reported; see the conditions."""
    pending: int = 0
    """Units waiting for a Job (parallelism cap, or a grade_batch unit waiting for its shards)."""
    queued: int = 0
    """Running units whose Job is suspended, waiting for Kueue to admit it (``queueName``)."""


class EvalRunStatus(SpecModel):
    """What the operator observed and computed; aggregates only (samples live in the store)."""

    phase: Phase = "Pending"
    """Pending, Running, Succeeded or Failed."""
    observed_generation: int | None = None
    """The spec generation this status describes."""
    suite_version: str | None = None
    """Version (sha256) of the suite snapshot the run executes."""
    started_at: str | None = None
    """When the operator started the run."""
    completed_at: str | None = None
    """When the run finished."""
    summary: str | None = None
    """One-line score summary shown by `kubectl get evalruns`."""
    units: UnitCounts | None = None
    """Work units by state."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready and Succeeded conditions, with observedGeneration."""
    results: list[TaskModelResult] = Field(default_factory=list)
    """Aggregates per task x model."""
    gate: GateStatus | None = None
    """The gate's checks, when the run has a gate."""
    ingest_token_sha256: str | None = Field(default=None, max_length=128)
    """SHA-256 of the run's ingest token (the token itself is in the run's Secret, which the
    operator writes but never reads back)."""
    snapshot_sha256: str | None = Field(default=None, max_length=128)
    """SHA-256 of the run's snapshot (``snapshot.json`` of its ConfigMap), written before the
    operator creates it: a snapshot that differs was made or replaced by someone else, and
    the run fails instead of running it."""


class EvalRun(SpecModel):
    """One evaluation of an EvalSuite with one or more models; the operator runs the graders in
    sandboxed Jobs and writes the aggregated scores into status."""

    api_version: Literal["evalkube.io/v1alpha1"] = "evalkube.io/v1alpha1"
    kind: Literal["EvalRun"] = "EvalRun"
    metadata: ObjectMeta
    spec: EvalRunSpec
    status: EvalRunStatus | None = None
