"""EvalRun: which suite, which models, which providers; and the status the operator writes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from evalkube import limits
from evalkube.models.base import SpecModel
from evalkube.models.crd import Rule, cel, cluster
from evalkube.models.gate import GateSpec, GateStatus
from evalkube.models.meta import ObjectMeta

MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9_-]*(:.+)?$")
#: A Kueue LocalQueue name as a label value can hold it (a DNS subdomain within 63 characters).
QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
PRECOMPUTED = "precomputed"
#: A model id; a cluster also checks its shape with the pattern (the CLI's validator names the
#: offending id instead).
ModelId = Annotated[str, Field(json_schema_extra=cluster(max_length=256, pattern=MODEL_ID.pattern))]


class SecretKeyRef(SpecModel):
    """A key of a Secret in the run's namespace."""

    name: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """Secret name."""
    key: str = Field(min_length=1, json_schema_extra=cluster(max_length=253))
    """Key within the Secret."""


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
    """Candidate generation parameters sent with every Responses API request."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output token cap."""
    concurrency: int = Field(default=limits.GENERATION_CONCURRENCY_DEFAULT, ge=1, le=256)
    """Concurrent requests per unit."""
    retries: int = Field(default=limits.GENERATION_RETRIES_DEFAULT, ge=0, le=20)
    """Retries on 429, 5xx and timeouts (exponential backoff, honouring Retry-After)."""


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
    shard_size: int = Field(default=limits.SHARD_SIZE_DEFAULT, ge=1, le=1_000_000)
    """Rows per work unit."""
    gate: GateSpec | None = None
    """Thresholds, error rate and baseline the finished run must pass (the Passed condition)."""
    queue_name: str | None = Field(
        default=None, max_length=63, json_schema_extra=cluster(pattern=QUEUE_NAME.pattern)
    )
    """Kueue LocalQueue of the run's work-unit Jobs: they get the label
    ``kueue.x-k8s.io/queue-name`` and start suspended until Kueue admits them (cluster only)."""

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
    """Mean of each per-sample score (missing counts 0) and the batch metrics."""
    counts: SampleCounts = Field(default_factory=SampleCounts)
    """Samples by outcome."""
    criteria: dict[str, CriterionCounts] = Field(default_factory=dict)
    """Passed and failed samples per criterion that sets ``passThreshold``."""
    model_calls: dict[str, int] = Field(default_factory=dict)
    """Model calls by purpose (candidate, judge, embedding)."""
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


class EvalRun(SpecModel):
    """One evaluation of an EvalSuite with one or more models; the operator runs the graders in
    sandboxed Jobs and writes the aggregated scores into status."""

    api_version: Literal["evalkube.io/v1alpha1"] = "evalkube.io/v1alpha1"
    kind: Literal["EvalRun"] = "EvalRun"
    metadata: ObjectMeta
    spec: EvalRunSpec
    status: EvalRunStatus | None = None
