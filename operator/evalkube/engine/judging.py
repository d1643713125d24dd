"""Run ``score_model``/``label_model`` criteria: their calls go through the model bridge.

The unit runner (trusted) renders each sample's request (:class:`evalkube.grading.ModelJudge`)
and posts it to the bridge a grader's ``ctx`` would use, with a fresh execution token per
sample: the bridge injects the key, resolves ``model: auto`` to the run's ``judgeModel``,
enforces ``maxModelCalls`` and counts the call as ``judge``; the token's usage lands on the
sample like a Python grader's. A few calls run at once (:data:`JUDGE_CONCURRENCY`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from evalkube.grading import EmbeddingJudge, GradeOutcome, ModelJudge, TemplateError

Judge = ModelJudge | EmbeddingJudge

JUDGE_CONCURRENCY = 8
"""Model-grader calls in flight at once from one unit."""
EXECUTION_HEADER = "X-Evalkube-Execution"
"""The header the bridge charges a call to (the same as ``ctx``'s)."""


def judge_samples(
    judge: Judge,
    inputs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    endpoint: str | None,
    open_tokens: Callable[[int], list[str]],
) -> list[GradeOutcome]:
    """Outcomes of ``judge`` for each ``(sample, item)``; ``open_tokens(n)`` opens ``n``
    execution tokens on the bridge (and remembers them for the samples' usage)."""
    if endpoint is None:
        return [judge.failed("ModelAccessError", "no model bridge for this run") for _ in inputs]
    tokens = open_tokens(len(inputs))
    return asyncio.run(_judge_all(judge, inputs, tokens, endpoint))


async def _judge_all(
    judge: Judge,
    inputs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
    tokens: Sequence[str],
    endpoint: str,
) -> list[GradeOutcome]:
    uds = endpoint.removeprefix("unix:") if endpoint.startswith("unix:") else None
    transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
    base = "http://bridge" if uds else endpoint
    semaphore = asyncio.Semaphore(JUDGE_CONCURRENCY)
    async with httpx.AsyncClient(base_url=base, transport=transport, timeout=600.0) as client:

        async def one(
            sample: Mapping[str, Any], item: Mapping[str, Any], token: str
        ) -> GradeOutcome:
            try:
                body = judge.request(sample, item)
            except TemplateError as exc:
                return judge.failed("TemplateError", str(exc))
            async with semaphore:
                try:
                    reply = await client.post(
                        judge.path, json=body, headers={EXECUTION_HEADER: token}
                    )
                except httpx.HTTPError as exc:
                    return judge.failed("ModelCallError", f"model bridge unreachable: {exc}")
            try:
                data = reply.json()
            except ValueError:
                data = None
            if reply.status_code >= 400 or not isinstance(data, dict):
                error = data.get("error") if isinstance(data, dict) else None
                message = error.get("message") if isinstance(error, dict) else None
                return judge.failed(
                    "ModelCallError",
                    str(message or f"the bridge answered HTTP {reply.status_code}"),
                )
            return judge.verdict(data)

        return list(
            await asyncio.gather(*(one(s, i, t) for (s, i), t in zip(inputs, tokens, strict=True)))
        )
