"""The grader and preprocessor declarations: the contract docs/graders.md states."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from evalkube import limits
from evalkube.models.base import SpecModel
from evalkube.models.crd import Rule, cel, cluster, present

Contract = Literal["sample", "batch", "model_backed"]
Execution = Literal["per_sample", "aggregate"]
ModelAccess = Literal["gateway", "none", "mka1"]
Isolation = Literal["unit", "sample"]
#: An image reference: ``[host[:port]/]name[/name...][:tag][@sha256:digest]`` (lower case).
_IMAGE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)

# strict: `timeoutSeconds: true` must not silently mean 1 second
TimeoutSeconds = Annotated[
    int, Field(strict=True, ge=limits.TIMEOUT_SECONDS_MIN, le=limits.TIMEOUT_SECONDS_MAX)
]
MaxModelCalls = Annotated[
    int, Field(strict=True, ge=limits.MAX_MODEL_CALLS_MIN, le=limits.MAX_MODEL_CALLS_MAX)
]


_EXACTLY_ONE_CODE = Rule(
    rule=f"{present('source')} != {present('file')}",
    message="set exactly one of `source` (inline Python) or `file` (configmap-name/key)",
)
_GRADER_CODE = Rule(
    rule=(
        f"has(self.type) && self.type != 'python' ? "
        f"!{present('source')} && !{present('file')} : "
        f"{present('source')} != {present('file')}"
    ),
    message=(
        "a python grader needs exactly one of `source` (inline Python) or `file` "
        "(configmap-name/key); a built-in grader has neither"
    ),
)
_FILE_REF = Rule(
    rule=(
        f"!{present('file')} || "
        "self.file.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-._a-zA-Z0-9]+$')"
    ),
    message=(
        "`file` must name a ConfigMap key as `configmap-name/key` in a cluster "
        "(the ConfigMap lives in the suite's namespace)"
    ),
    field_path=".file",
)


class _CodeRef(SpecModel):
    """Python code given inline (``source``) or by reference (``file``): exactly one."""

    source: str | None = Field(default=None, json_schema_extra=cluster(max_length=262_144))
    """Inline Python source."""
    file: str | None = Field(
        default=None,
        validation_alias=AliasChoices("file", "fileId", "file_id"),
        # a ConfigMap name (253), `/` and a key (253)
        json_schema_extra=cluster(max_length=507),
    )
    """Stored Python file: a ConfigMap key (``configmap-name/key``) in a cluster, a path
    (relative to the suite file) locally."""

    @model_validator(mode="after")
    def _exactly_one_source(self) -> _CodeRef:
        python = getattr(self, "type", "python") == "python"
        if python and (self.source is None) == (self.file is None):
            raise ValueError("set exactly one of `source` (inline Python) or `file`")
        return self


GraderType = Literal[
    "python", "string_check", "text_similarity", "multi", "score_model", "label_model"
]
StringOperation = Literal["eq", "ne", "like", "ilike"]
LocalMetric = Literal[
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]
SimilarityMetric = Literal[LocalMetric, "cosine"]
BUILTIN_FIELDS: dict[str, tuple[str, ...]] = {
    "string_check": ("input", "reference", "operation"),
    "text_similarity": ("input", "reference", "evaluation_metric"),
    "multi": ("graders", "calculate_output"),
    "score_model": ("input",),
    "label_model": ("input", "labels", "passing_labels"),
}
"""The fields each built-in type requires (python requires ``source`` or ``file``)."""
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    "score_model": ("model", "range", "sampling_params"),
    "label_model": ("model", "sampling_params"),
}
"""Further fields a built-in type may set."""
MODEL_TYPES = ("score_model", "label_model")


class GraderMessage(SpecModel):
    """One input message of a model grader; ``content`` is a template (``item``, ``sample``)."""

    role: Literal["system", "developer", "user", "assistant"]
    """Chat role."""
    content: str
    """Template, e.g. ``Grade {{ sample.output_text }} against {{ item.answer }}``."""


class SamplingParams(SpecModel):
    """Sampling parameters of a model grader's call (OpenAI's ``sampling_params``)."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature."""
    top_p: float | None = Field(default=None, ge=0, le=1)
    """Nucleus sampling."""
    seed: int | None = None
    """Seed, where the provider supports one."""
    max_completions_tokens: int | None = Field(default=None, ge=1)
    """Output token cap (sent as ``max_output_tokens``)."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """Reasoning effort of reasoning models."""


class SubGraderSpec(SpecModel):
    """A grader inside a ``multi`` grader: a built-in type, its score named by its key."""

    type: Literal["string_check", "text_similarity"]
    """``string_check`` or ``text_similarity``."""
    input: str
    """Template of the text graded, e.g. ``{{ sample.output_text }}``."""
    reference: str
    """Template of the text it is compared with, e.g. ``{{ item.answer }}``."""
    operation: StringOperation | None = None
    """``string_check``: ``eq``, ``ne``, ``like`` or ``ilike``."""
    evaluation_metric: LocalMetric | None = None
    """``text_similarity``: the metric (as for a ``text_similarity`` grader; not ``cosine``)."""
    name: str | None = None
    """Ignored (OpenAI exports carry it); the key in ``graders`` names the score."""

    @model_validator(mode="after")
    def _fields_of_type(self) -> SubGraderSpec:
        needed = "operation" if self.type == "string_check" else "evaluation_metric"
        other = "evaluation_metric" if self.type == "string_check" else "operation"
        if getattr(self, needed) is None:
            raise ValueError(f"`{to_camel(needed)}` is required for a {self.type} grader")
        if getattr(self, other) is not None:
            raise ValueError(f"`{to_camel(other)}` is not a field of a {self.type} grader")
        return self


def _metric_id_schema(schema: dict[str, Any]) -> None:
    """Leave ``metricId``'s default out of the CRD: the API server would write ``score`` into
    every criterion of a ``graders`` list, where the default is the criterion's name."""
    schema.pop("default", None)
    schema.update(cluster(max_length=253))


class GraderSpec(_CodeRef):
    """A grader (docs/graders.md): Python code, or one of OpenAI's built-in types."""

    model_config = ConfigDict(json_schema_extra=cel(_GRADER_CODE, _FILE_REF))

    type: GraderType
    """``python`` (your code, in the sandbox), or a built-in type evaluated by the engine:
    ``string_check``, ``text_similarity`` or ``multi`` (OpenAI's semantics; see
    docs/graders.md)."""
    input: str | list[GraderMessage] | None = None
    """Built-ins: template of the text graded, e.g. ``{{ sample.output_text }}``; for
    ``score_model``/``label_model`` the input messages (each content a template)."""
    model: str | None = None
    """Model graders: the model id (``provider:model``); unset or ``auto``: the run's
    ``judgeModel``."""
    range: list[float] | None = Field(default=None, min_length=2, max_length=2)
    """``score_model``: ``[min, max]`` of a valid score; default ``[0, 1]``."""
    sampling_params: SamplingParams | None = None
    """Model graders: sampling parameters of the call."""
    labels: list[str] | None = Field(default=None, min_length=1, max_length=100)
    """``label_model``: the labels the model chooses from."""
    passing_labels: list[str] | None = Field(default=None, min_length=1, max_length=100)
    """``label_model``: the labels that pass (score 1; any other label scores 0)."""
    reference: str | None = Field(default=None, json_schema_extra=cluster(max_length=65_536))
    """Built-ins: template of the text it is compared with, e.g. ``{{ item.answer }}``."""
    operation: StringOperation | None = None
    """``string_check``: ``eq``, ``ne``, ``like`` (contains) or ``ilike`` (contains, any case)."""
    evaluation_metric: SimilarityMetric | None = None
    """``text_similarity``: ``fuzzy_match``, ``bleu``, ``gleu``, ``meteor``,
    ``rouge_1``..``rouge_5``, ``rouge_l`` or ``cosine`` (of the run's ``embeddingModel``
    embeddings, via the bridge)."""
    graders: dict[str, SubGraderSpec] | None = Field(default=None, min_length=1, max_length=20)
    """``multi``: the graders whose scores ``calculateOutput`` combines, by name."""
    calculate_output: str | None = Field(default=None, min_length=1, max_length=1_000)
    """``multi``: a formula over the graders' names: numbers, ``+ - * / ^``, ``min``,
    ``max``, ``abs``, ``floor``, ``ceil``, ``exp``, ``sqrt``, ``log`` (never run as code)."""
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$",
    )
    """The criterion's name (OpenAI's ``testing_criteria[].name``): required in a task's
    ``graders`` list, where it is also the default ``metricId``."""
    pass_threshold: float | None = Field(default=None, allow_inf_nan=False)
    """A sample passes this criterion when its ``metricId`` score is >= the threshold
    (OpenAI's semantics); passed and failed samples are counted per criterion."""
    contract: Contract = "sample"
    """``sample`` (``grade``), ``batch`` (``grade_batch``) or ``model_backed`` (with ``ctx``)."""
    execution: Execution | None = None
    """Override: ``per_sample`` runs ``grade``, ``aggregate`` runs ``grade_batch``.
    Default follows ``contract``: ``batch`` -> ``aggregate``, otherwise ``per_sample``."""
    model_access: ModelAccess | None = None
    """``gateway`` enables ``ctx.responses_create``/``ctx.embeddings_create``
    (``mka1`` is a synonym). Default ``gateway`` for ``model_backed``, otherwise ``none``."""
    metric_id: str = Field(default="score", min_length=1, json_schema_extra=_metric_id_schema)
    """Score key used when the grader returns one number (default ``score``; in a ``graders``
    list, the criterion's ``name``)."""
    timeout_seconds: TimeoutSeconds = limits.TIMEOUT_SECONDS_DEFAULT
    """Wall-clock limit of one grader execution, 1..600 seconds."""
    max_model_calls: MaxModelCalls = limits.MAX_MODEL_CALLS_DEFAULT
    """Model bridge calls allowed from one grader execution, 0..500."""
    isolation: Isolation | None = None
    """``unit`` (default): one warm worker grades the unit's samples one after another (files and
    processes a sample leaves are cleaned before the next). ``sample``: every execution in a
    fresh process forked from the warm worker, its result encoded by the worker, its
    processes killed and its scratch files wiped afterwards, so a sample can change only its
    own result: for graders that run model output. Slower (a fork per sample)."""
    environment: str | None = None
    """The packages the grader may import. ``default``: the grader environment (OpenAI's
    python-grader package set, docs/graders.md); ``stdlib``: the standard library only; a
    path (``/``, ``./``, ``../`` or ``~``): locally, a venv or ``pip install --target``
    directory; otherwise an image: in a cluster, the grader container's image (built FROM
    the evalkube-sandbox image)."""

    @field_validator("environment")
    @classmethod
    def _check_environment(cls, value: str | None) -> str | None:
        if value is None or value in ("default", "stdlib"):
            return value
        if value.startswith(("/", "./", "../", "~")):
            if any(c.isspace() or not c.isprintable() or c == ":" for c in value):
                raise ValueError(
                    f"the path {value!r} holds whitespace, `:` or control characters (the "
                    "sandboxes' bind syntax): move the environment to a plainer path"
                )
            return value
        if not _IMAGE.fullmatch(value):
            raise ValueError(
                f"{value!r} is neither `default`, `stdlib`, a path (starting with /, ./, ../ "
                "or ~) nor an image reference (e.g. registry.example/graders:1.0)"
            )
        return value

    @model_validator(mode="after")
    def _fields_of_type(self) -> GraderSpec:
        if self.type != "python":
            for name in ("source", "file"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"`{name}` is for python graders; a {self.type} grader has none"
                    )
            for name in BUILTIN_FIELDS[self.type]:
                if getattr(self, name) is None:
                    raise ValueError(f"`{to_camel(name)}` is required for a {self.type} grader")
            if self.type == "text_similarity" and self.pass_threshold is None:
                raise ValueError("`passThreshold` is required for a text_similarity grader")
        allowed = BUILTIN_FIELDS.get(self.type, ()) + OPTIONAL_FIELDS.get(self.type, ())
        for name in (
            "input",
            "reference",
            "operation",
            "evaluation_metric",
            "graders",
            "calculate_output",
            "model",
            "range",
            "sampling_params",
            "labels",
            "passing_labels",
        ):
            if getattr(self, name) is not None and name not in allowed:
                raise ValueError(f"`{to_camel(name)}` is not a field of a {self.type} grader")
        messages = self.type in MODEL_TYPES
        if self.input is not None and isinstance(self.input, list) != messages:
            raise ValueError(
                "`input` of a model grader is a list of messages ({role, content})"
                if messages
                else f"`input` of a {self.type} grader is a template string"
            )
        if self.range is not None and self.range[0] >= self.range[1]:
            raise ValueError("`range` is [min, max] with min < max")
        bounds = self.score_bounds
        if self.pass_threshold is not None and bounds is not None:
            low, high = bounds
            if not low < self.pass_threshold <= high:
                raise ValueError(
                    f"`passThreshold` {self.pass_threshold} is outside the score range "
                    f"({low}, {high}] of a {self.type} grader: "
                    + (
                        "no sample could pass"
                        if self.pass_threshold > high
                        else "every sample passes"
                    )
                )
        if self.labels is not None and self.passing_labels is not None:
            unknown = sorted(set(self.passing_labels) - set(self.labels))
            if unknown:
                raise ValueError(f"`passingLabels` {unknown} are not among `labels`")
        return self

    @property
    def score_bounds(self) -> tuple[float, float] | None:
        """The scores a built-in grader gives (``None``: any number, python and multi)."""
        if self.type == "score_model":
            low, high = self.range or (0.0, 1.0)
            return float(low), float(high)
        if self.evaluation_metric == "cosine":
            return -1.0, 1.0
        if self.type in ("string_check", "text_similarity", "label_model"):
            return 0.0, 1.0
        return None

    @property
    def builtin(self) -> bool:
        """Evaluated by the engine (not Python code in the sandbox)."""
        return self.type != "python"

    @property
    def calls_models(self) -> bool:
        """A built-in whose engine-side grading calls models (through the bridge)."""
        return self.type in MODEL_TYPES or self.evaluation_metric == "cosine"

    @property
    def resolved_pass_threshold(self) -> float | None:
        """``passThreshold``; a ``string_check`` passes on a match (score 1) by default."""
        if self.pass_threshold is None and self.type in ("string_check", "label_model"):
            return 1.0
        return self.pass_threshold

    @field_validator("model_access")
    @classmethod
    def _normalize_access(cls, value: ModelAccess | None) -> ModelAccess | None:
        return "gateway" if value == "mka1" else value

    @property
    def resolved_execution(self) -> Execution:
        """The execution mode after applying the contract's default."""
        if self.execution is not None:
            return self.execution
        return "aggregate" if self.contract == "batch" else "per_sample"

    @property
    def resolved_model_access(self) -> Literal["gateway", "none"]:
        """Model access after applying the contract's default."""
        if self.calls_models:
            return "gateway"
        if self.model_access is not None:
            return "gateway" if self.model_access != "none" else "none"
        return "gateway" if self.contract == "model_backed" else "none"

    @property
    def resolved_isolation(self) -> Isolation:
        """Isolation after applying the default (``unit``)."""
        return self.isolation or "unit"

    @property
    def entrypoint(self) -> Literal["grade", "grade_batch"]:
        """The function the grader file must define."""
        return "grade_batch" if self.resolved_execution == "aggregate" else "grade"


class PreprocessSpec(_CodeRef):
    """A Python preprocessor run in the sandbox before prompt rendering."""

    model_config = ConfigDict(json_schema_extra=cel(_EXACTLY_ONE_CODE, _FILE_REF))

    type: Literal["python"]
    """Must be ``python``."""
    contract: Literal["sample", "batch"] = "sample"
    """``sample`` defines ``transform(row) -> row``; ``batch`` defines
    ``transform_batch(rows) -> rows`` (may drop or add rows)."""
    timeout_seconds: TimeoutSeconds = limits.TIMEOUT_SECONDS_DEFAULT
    """Wall-clock limit of one preprocessor execution, 1..600 seconds."""

    @property
    def entrypoint(self) -> Literal["transform", "transform_batch"]:
        """The function the preprocessor file must define."""
        return "transform_batch" if self.contract == "batch" else "transform"
