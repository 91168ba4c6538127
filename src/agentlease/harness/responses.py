"""Model responses reduced to one shape for traces: ``{"text": ..., "tool_calls": [...]}``.

A recorder stores what a model call returns; wrap the call so it returns one of these reductions
and a trace (and its replay) does not depend on a provider's SDK or its response objects::

    ask = recorder.model(lambda **kw: from_openai_chat(client.chat.completions.create(**kw)
                                                       .model_dump()))
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import orjson

from agentlease._codec import JSON
from agentlease.errors import InvalidInput

__all__ = ["from_anthropic_message", "from_openai_chat"]


def from_openai_chat(response: dict[str, JSON]) -> JSON:
    """Reduce an OpenAI chat completion (as a dict) to ``{"text", "tool_calls"}``.

    Tool calls' JSON ``arguments`` are decoded (kept as the string if they are not JSON).

    Raises:
        InvalidInput: the dict has no ``choices[0].message``.
    """
    try:
        message: dict[str, Any] = cast(Any, response)["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise InvalidInput("not an OpenAI chat completion: no choices[0].message") from None
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls: list[JSON] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        with contextlib.suppress(orjson.JSONDecodeError, TypeError):
            arguments = orjson.loads(arguments)
        calls.append({"name": function.get("name", ""), "arguments": arguments})
    return {"text": content, "tool_calls": calls}


def from_anthropic_message(response: dict[str, JSON]) -> JSON:
    """Reduce an Anthropic message (as a dict) to ``{"text", "tool_calls"}``.

    Raises:
        InvalidInput: the dict has no list of ``content`` blocks.
    """
    blocks = response.get("content")
    if not isinstance(blocks, list):
        raise InvalidInput("not an Anthropic message: no list of content blocks")
    text: list[str] = []
    calls: list[JSON] = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            text.append(str(block.get("text", "")))
        elif isinstance(block, dict) and block.get("type") == "tool_use":
            calls.append({"name": block.get("name", ""), "arguments": block.get("input")})
    return {"text": "".join(text), "tool_calls": calls}
