"""Responses <-> Chat Completions translation (evalkube.proxy.chat), and the ``api`` setting.

The vectors in tests/fixtures/chat_completions.json are shared with the native proxy's Go
tests (operator/evalkube-proxy/chat_test.go): both engines must translate identically.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from evalkube.models.errors import SpecError, validate_spec
from evalkube.models.run import EvalRunSpec
from evalkube.proxy.chat import ChatTranslationError, chat_request, responses_answer
from evalkube.proxy.native import native_config
from evalkube.proxy.providers import providers_from_spec
from evalkube.proxy.upstream import Upstream, UpstreamError, response_output_text

pytestmark = pytest.mark.timeout(10)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "chat_completions.json").read_text()
)


@pytest.mark.parametrize("vector", VECTORS["requests"], ids=lambda v: v["name"])
def test_requests_translate_as_the_shared_vectors_say(vector: dict[str, Any]) -> None:
    body = copy.deepcopy(vector["responses"])
    assert chat_request(body) == vector["chat"]
    assert body == vector["responses"], "the caller's request must not be changed"


@pytest.mark.parametrize("vector", VECTORS["refused_requests"], ids=lambda v: v["name"])
def test_untranslatable_requests_are_refused_naming_the_field(vector: dict[str, Any]) -> None:
    with pytest.raises(ChatTranslationError) as refused:
        chat_request(vector["responses"])
    assert str(refused.value) == vector["error"]


@pytest.mark.parametrize("vector", VECTORS["answers"], ids=lambda v: v["name"])
def test_answers_translate_as_the_shared_vectors_say(vector: dict[str, Any]) -> None:
    answer = responses_answer(vector["chat"])
    assert answer == vector["responses"]
    # the SDK-style text the engine and graders read agrees with the output items
    assert response_output_text({**answer, "output_text": None}) == answer["output_text"]


@pytest.mark.parametrize("vector", VECTORS["refused_answers"], ids=lambda v: v["name"])
def test_unusable_completions_are_refused(vector: dict[str, Any]) -> None:
    with pytest.raises(ChatTranslationError) as refused:
        responses_answer(vector["chat"])
    assert str(refused.value) == vector["error"]


def _spec(api: str | None) -> dict[str, Any]:
    provider: dict[str, Any] = {"baseURL": "http://127.0.0.1:8000/v1"}
    if api is not None:
        provider["api"] = api
    return {"models": ["vllm:llama"], "providers": {"vllm": provider}}


def test_api_defaults_to_responses_and_reaches_both_engines_configuration() -> None:
    default = validate_spec(EvalRunSpec, _spec(None))
    chat = validate_spec(EvalRunSpec, _spec("chat_completions"))
    assert default.providers["vllm"].api == "responses"
    assert providers_from_spec(chat, environ={})["vllm"].api == "chat_completions"
    config = native_config(providers_from_spec(chat, environ={}), listen="unix:/x")
    assert config["providers"]["vllm"]["api"] == "chat_completions"
    assert chat.to_wire()["providers"]["vllm"]["api"] == "chat_completions"  # type: ignore[index]


def test_an_unknown_api_is_a_clear_error_naming_the_field() -> None:
    with pytest.raises(SpecError) as refused:
        validate_spec(EvalRunSpec, _spec("chat"))
    assert refused.value.problems == [
        "spec.providers.vllm.api: must be one of 'responses' or 'chat_completions' (got 'chat')"
    ]


def test_the_upstream_refuses_an_untranslatable_request_before_sending() -> None:
    spec = validate_spec(EvalRunSpec, _spec("chat_completions"))
    upstream = Upstream(providers_from_spec(spec, environ={}))
    path, payload = upstream.responses_call("vllm", {"model": "llama", "input": "hi"})
    assert path == "/chat/completions"
    assert json.loads(payload)["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(UpstreamError) as refused:
        upstream.responses_call("vllm", {"model": "llama", "input": "x", "conversation": "c1"})
    assert refused.value.kind == "configuration"
    assert str(refused.value).startswith(
        "provider vllm speaks Chat Completions (api: chat_completions): `conversation` needs"
    )
