"""Responses API <-> Chat Completions: for providers with ``api: chat_completions``.

Many self-hosted servers (vLLM, llama.cpp, Ollama) serve only ``POST /v1/chat/completions``.
Graders keep calling ``ctx.responses_create(...)`` and candidate generation keeps building
Responses requests: :func:`chat_request` turns such a request into a Chat Completions one and
:func:`responses_answer` turns the completion back into a Responses object (``output_text``,
``output`` items, ``usage``, ``id``, ``model``, ``status``).

The native proxy (``operator/evalkube-proxy/chat.go``) implements the same mapping; the
vectors in ``tests/fixtures/chat_completions.json`` are checked against both.

Request mapping: ``instructions`` -> a leading system message; ``input`` (a string or a list
of message, ``function_call`` and ``function_call_output`` items; ``developer`` -> ``system``)
-> ``messages``; ``max_output_tokens`` -> ``max_tokens``; ``text.format`` -> ``response_format``;
function ``tools`` and ``tool_choice`` -> their Chat shapes; ``reasoning.effort`` ->
``reasoning_effort``. Fields that only mean something to a Responses server (``store``,
``background``, ``include``, ...) are dropped; those that need its server-side state
(``previous_response_id``, ``conversation``, ``prompt``) are refused; every other field
(``temperature``, ``top_p``, ``seed``, ``user``, ``parallel_tool_calls``, server extras such as
``top_k``) is passed through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: The path a chat provider is called on (below its base URL).
CHAT_PATH = "/chat/completions"

#: Responses-only fields a Chat Completions server would not understand (or would refuse).
DROPPED = frozenset(
    {
        "stream",
        "stream_options",
        "store",
        "background",
        "include",
        "truncation",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "max_tool_calls",
        "top_logprobs",
    }
)
#: Fields that need a Responses server's stored state: no faithful translation exists.
REFUSED = ("previous_response_id", "conversation", "prompt")
_HANDLED = frozenset(
    {"input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "reasoning"}
)
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_SCHEMA_KEYS = ("name", "description", "schema", "strict")
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")
#: A chat ``finish_reason`` that leaves the answer incomplete -> its Responses reason.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class ChatTranslationError(ValueError):
    """The request (or the answer) has no faithful counterpart; the message names the field."""


def _quoted(value: Any) -> str:
    """A value in a message, spelled the same by the native proxy: 'text', else JSON."""
    if isinstance(value, str):
        return f"'{value}'"
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request for the Responses request ``body`` (model already bare)."""
    for name in REFUSED:
        if body.get(name) is not None:
            raise ChatTranslationError(
                f"`{name}` needs a provider that keeps Responses state; "
                "a Chat Completions provider cannot honour it"
            )
    out: dict[str, Any] = {
        key: value for key, value in body.items() if key not in DROPPED and key not in _HANDLED
    }
    out["messages"] = _messages(body)
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if text is not None:
        if not isinstance(text, dict):
            raise ChatTranslationError("`text` must be an object such as {'format': {...}}")
        response_format = _response_format(text.get("format"))
        if response_format is not None:
            out["response_format"] = response_format
    for name, convert in (("tools", _tools), ("tool_choice", _tool_choice)):
        if body.get(name) is not None:
            out[name] = convert(body[name])
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    out["stream"] = False
    return out


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ChatTranslationError("`instructions` must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list):
        raise ChatTranslationError("`input` must be a string or a list of input items")
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise ChatTranslationError(f"{where} must be an object")
        kind = item.get("type")
        if kind is None or kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                raise ChatTranslationError(f"{where}.output must be a string")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
        elif kind == "reasoning":
            continue  # a previous answer's reasoning: a chat server cannot take it back
        else:
            raise ChatTranslationError(
                f"{where}: item type {_quoted(kind)} cannot be sent to a Chat Completions provider"
            )
    return messages


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    given = item.get("role")
    role = _ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise ChatTranslationError(f"{where}.role must be user, assistant, system or developer")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ChatTranslationError(f"{where}.content must be a string or a list of parts")
    parts = [_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": role, "content": parts[0]["text"]}
    return {"role": role, "content": parts}


def _part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise ChatTranslationError(f"{where} must be an object")
    kind = part.get("type")
    if isinstance(kind, str) and kind in _TEXT_PARTS:
        return {"type": "text", "text": part.get("text")}
    if kind == "input_image":
        if part.get("image_url") is None:
            raise ChatTranslationError(
                f"{where}: input_image needs image_url (a URL or data: URL) for a "
                "Chat Completions provider"
            )
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise ChatTranslationError(
        f"{where}: content type {_quoted(kind)} cannot be sent to a Chat Completions provider"
    )


def _response_format(fmt: Any) -> dict[str, Any] | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {key: fmt[key] for key in _SCHEMA_KEYS if key in fmt},
        }
    raise ChatTranslationError("`text.format.type` must be text, json_object or json_schema")


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ChatTranslationError("`tools` must be a list")
    out = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ChatTranslationError(
                f"tools[{index}]: a Chat Completions provider takes function tools only "
                f"(got type {_quoted(kind)})"
            )
        function = {key: tool[key] for key in _FUNCTION_KEYS if key in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ChatTranslationError(
        "`tool_choice` must be auto, none, required or {'type': 'function', 'name': ...}"
    )


def responses_answer(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses object for the chat completion ``chat`` (its first choice)."""
    choices = chat.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ChatTranslationError("a chat completion without choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ChatTranslationError("a chat completion whose first choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ChatTranslationError("a chat completion whose message content is not text")
    answer_id = chat.get("id")
    suffix = answer_id if isinstance(answer_id, str) else ""
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{suffix}",
                "summary": [{"type": "summary_text", "text": reasoning}],
            }
        )
    calls = message.get("tool_calls")
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    refusal = message.get("refusal")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str) and (content or not calls):
        parts.append({"type": "output_text", "text": content, "annotations": []})
    if isinstance(refusal, str) and refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    if parts:
        output.append(
            {
                "type": "message",
                "id": f"msg_{suffix}",
                "status": "completed",
                "role": "assistant",
                "content": parts,
            }
        )
    for call in calls:
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = call.get("id")
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call_id if isinstance(call_id, str) else ''}",
                "call_id": call_id,
                "name": function.get("name"),
                "arguments": function.get("arguments"),
                "status": "completed",
            }
        )
    finish = choices[0].get("finish_reason")
    incomplete = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
    return {
        "id": answer_id,
        "object": "response",
        "created_at": chat.get("created"),
        "model": chat.get("model"),
        "status": "completed" if incomplete is None else "incomplete",
        "incomplete_details": None if incomplete is None else {"reason": incomplete},
        "error": None,
        "output": output,
        "output_text": content or "",
        "usage": _usage(chat.get("usage")),
    }


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens_details")
    completion = usage.get("completion_tokens_details")
    cached = prompt.get("cached_tokens") if isinstance(prompt, dict) else None
    reasoning = completion.get("reasoning_tokens") if isinstance(completion, dict) else None
    return {
        "input_tokens": usage.get("prompt_tokens"),
        "input_tokens_details": {"cached_tokens": cached if cached is not None else 0},
        "output_tokens": usage.get("completion_tokens"),
        "output_tokens_details": {"reasoning_tokens": reasoning if reasoning is not None else 0},
        "total_tokens": usage.get("total_tokens"),
    }
