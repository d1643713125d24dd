"""Settings of ``evalkube proxy`` (the pod sidecar): flags, or ``EVALKUBE_PROXY_*`` variables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from evalkube import limits
from evalkube.proxy.egress import EgressGateway, check_gateway_url


class ProxySettings(BaseSettings):
    """Every setting of the model bridge proxy; each can come from ``EVALKUBE_PROXY_<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="EVALKUBE_PROXY_",
        extra="ignore",
        use_attribute_docstrings=True,
        cli_prog_name="evalkube proxy",
        cli_kebab_case=True,
        cli_implicit_flags=False,
    )

    @classmethod
    def from_cli(cls, args: Sequence[str]) -> ProxySettings:
        """The settings from command-line flags (``--run-spec PATH``), then the environment."""
        return cls(_cli_parse_args=list(args))

    listen: str = "unix:/var/run/evalkube/bridge/model.sock"
    """Grader listener: ``unix:/path`` or ``host:port`` (loopback only in practice). The
    socket's directory is what the grader container mounts."""
    control_listen: str | None = None
    """Control listener (usage take, budget, candidate calls): ``unix:/path`` in a volume the
    grader never mounts, or ``host:port``. Without it there is no control API."""
    control_token_file: Path | None = None
    """File holding a token every control request must send in ``X-Evalkube-Control-Token``
    (needed when the control listener is TCP: a pod's containers share loopback)."""
    run_spec: Path | None = None
    """EvalRun (YAML/JSON) or its spec: providers, judge and embedding models."""
    judge_model: str | None = None
    """Overrides the run's ``judgeModel``."""
    embedding_model: str | None = None
    """Overrides the run's ``embeddingModel``."""
    max_calls: int = Field(
        default=limits.MAX_MODEL_CALLS_DEFAULT,
        ge=limits.MAX_MODEL_CALLS_MIN,
        le=limits.MAX_MODEL_CALLS_MAX,
    )
    """``max_model_calls`` of each grader execution."""
    planned_executions: int | None = Field(default=None, ge=0)
    """Executions the unit plans: the unit total is ``max_calls x planned_executions``. Unset:
    no unit total until the runner sets one through the control API."""
    unit_id: str = "default"
    """Name of the unit being served (in budget messages and the control API)."""
    retries: int | None = Field(default=None, ge=0, le=20)
    """Upstream retries on 429/5xx/timeouts (default: the run's ``generation.retries``)."""
    log_level: str = "INFO"
    """Logging level."""
    engine: Literal["auto", "native", "python"] = "auto"
    """Which implementation serves: ``native`` (the compiled ``evalkube-proxy``, about three
    times the calls per core), ``python`` (aiohttp, in this process), or ``auto``: native
    when its binary is found and the run uses no ``local:`` model, else python."""

    egress_proxy: str | None = None
    """Egress gateway (``http://host:port``) every upstream call goes through, with the grant
    of ``egress_grant_file`` (work-unit pods reach nothing else). Unset: calls go direct."""
    egress_grant_file: Path | None = None
    """File holding the run's egress grant (a mounted Secret, re-read when it changes)."""
    state_dir: Path | None = None
    """Directory of the native engine's journal (budgets, execution tokens, usage, requests
    sent upstream), replayed when the proxy starts again in the same Pod after it was killed
    (a volume only the proxy mounts). The Python engine ignores it. Unset: nothing kept."""

    @model_validator(mode="after")
    def _egress_pair(self) -> ProxySettings:
        if (self.egress_proxy is None) != (self.egress_grant_file is None):
            raise ValueError("set egress_proxy and egress_grant_file together, or neither")
        if self.egress_proxy is not None:
            check_gateway_url(self.egress_proxy)
        return self

    def egress(self) -> EgressGateway | None:
        """The gateway upstream calls go through, or None for direct calls."""
        if self.egress_proxy is None or self.egress_grant_file is None:
            return None
        return EgressGateway(self.egress_proxy, self.egress_grant_file)

    def control_token(self) -> str | None:
        if self.control_token_file is None:
            return None
        token = self.control_token_file.read_text().strip()
        if not token:
            raise ValueError(f"control token file {self.control_token_file} is empty")
        return token
