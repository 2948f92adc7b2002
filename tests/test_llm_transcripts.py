"""The fakes validate transcripts as the real APIs do, through the real SDKs.

An invalid history must fail a test the way it would fail in production: a
400 ``invalid_request_error`` in the API's own error shape, which the
providers report as a non-retryable error without a retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from bot.contracts.llm import ChatMessage, ProviderError, ToolCall
from bot.testing.anthropic import FakeAnthropic
from bot.testing.openai import FakeOpenAI
from tests.provider_helpers import RetryLog, anthropic_for, openai_for, request_for

KEY = "sk-test"


@pytest.fixture
async def claude() -> AsyncIterator[tuple[FakeAnthropic, anthropic.AsyncAnthropic]]:
    async with FakeAnthropic() as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
        yield fake, client
        await client.close()


@pytest.fixture
async def gpt() -> AsyncIterator[tuple[FakeOpenAI, openai.AsyncOpenAI]]:
    async with FakeOpenAI() as fake:
        client = openai.AsyncOpenAI(api_key=KEY, base_url=fake.base_url, max_retries=0)
        yield fake, client
        await client.close()


def use(id_: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": "read_file", "input": {"path": "a"}}


def result(id_: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id_, "content": "alpha"}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


INVALID_ANTHROPIC: dict[str, tuple[list[dict[str, Any]], str]] = {
    "no messages": ([], "at least one message is required"),
    "assistant first": (
        [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "hello"}],
        'first message must use the "user" role',
    ),
    "system role": (
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "messages.0.role: Input should be 'user' or 'assistant'",
    ),
    "empty string content": (
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "well?"},
        ],
        "messages.1: all messages must have non-empty content",
    ),
    "empty content list": ([{"role": "user", "content": []}], "non-empty content"),
    "empty text block": (
        [{"role": "user", "content": [text("hi"), text("")]}],
        "messages.0.content.1.text: text content blocks must be non-empty",
    ),
    "whitespace-only text": (
        [{"role": "user", "content": [text(" \n ")]}],
        "text content blocks must contain non-whitespace text",
    ),
    "empty final assistant prefill": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
        "messages.1: all messages must have non-empty content",
    ),
    "tool_use without tool_result": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [use("toolu_1")]},
            {"role": "user", "content": "and?"},
        ],
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_1",
    ),
    "tool_use as the last message": (
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": [use("toolu_1")]}],
        "`tool_use` ids were found without `tool_result` blocks",
    ),
    "one of two tool_uses unanswered": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [use("toolu_1"), use("toolu_2")]},
            {"role": "user", "content": [result("toolu_1")]},
        ],
        "immediately after: toolu_2",
    ),
    "text before the tool_result": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [use("toolu_1")]},
            {"role": "user", "content": [text("wait"), result("toolu_1")]},
        ],
        "`tool_use` ids were found without `tool_result` blocks immediately after",
    ),
    "tool_result without tool_use": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [result("toolu_9")]},
        ],
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9",
    ),
    "tool_result answering another id": (
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [use("toolu_1")]},
            {"role": "user", "content": [result("toolu_1"), result("toolu_2")]},
        ],
        "unexpected `tool_use_id` found in `tool_result` blocks: toolu_2",
    ),
    "tool_result in the first message": (
        [{"role": "user", "content": [result("toolu_1")]}],
        "unexpected `tool_use_id`",
    ),
}


@pytest.mark.parametrize("case", INVALID_ANTHROPIC)
async def test_messages_api_answers_400_invalid_request_error_to_an_invalid_transcript(
    claude: tuple[FakeAnthropic, anthropic.AsyncAnthropic], case: str
) -> None:
    fake, client = claude
    messages, expected = INVALID_ANTHROPIC[case]
    fake.reply_text("must not be used")

    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="m", max_tokens=10, messages=messages)  # type: ignore[arg-type]

    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert expected in body["error"]["message"]
    assert body["request_id"].startswith("req_")
    assert fake.pending == 1  # the model never saw it


VALID_ANTHROPIC: dict[str, list[dict[str, Any]]] = {
    "plain string": [{"role": "user", "content": "hi"}],
    "consecutive users merged": [
        {"role": "user", "content": "[Ann]: hi"},
        {"role": "user", "content": "[Bob]: hello"},
    ],
    "tool round trip then text": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [text("Reading."), use("toolu_1")]},
        {"role": "user", "content": [result("toolu_1")]},
        {"role": "user", "content": "[Bob]: me too"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "thanks"},
    ],
    "assistant prefill": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Sure"},
    ],
}


@pytest.mark.parametrize("case", VALID_ANTHROPIC)
async def test_messages_api_accepts_a_valid_transcript(
    claude: tuple[FakeAnthropic, anthropic.AsyncAnthropic], case: str
) -> None:
    fake, client = claude
    fake.reply_text("fine")

    message = await client.messages.create(
        model="m",
        max_tokens=10,
        messages=VALID_ANTHROPIC[case],  # type: ignore[arg-type]
    )

    assert message.content[0].type == "text"


def call(id_: str) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}


def tool(id_: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id_, "content": "alpha"}


ASK: dict[str, Any] = {"role": "user", "content": "go"}

INVALID_OPENAI: dict[str, tuple[list[dict[str, Any]], str, str]] = {
    "no messages": ([], "Invalid 'messages': empty array", "messages"),
    "unknown role": (
        [{"role": "robot", "content": "hi"}],
        "Invalid value: 'robot'",
        "messages[0].role",
    ),
    "tool_calls without tool messages": (
        [
            ASK,
            {"role": "assistant", "content": None, "tool_calls": [call("call_1")]},
            {"role": "user", "content": "and?"},
        ],
        "must be followed by tool messages responding to each 'tool_call_id'. The following "
        "tool_call_ids did not have response messages: call_1",
        "messages.[1].role",
    ),
    "tool_calls as the last message": (
        [ASK, {"role": "assistant", "content": None, "tool_calls": [call("call_1")]}],
        "did not have response messages: call_1",
        "messages.[1].role",
    ),
    "one of two calls answered": (
        [
            ASK,
            {"role": "assistant", "content": None, "tool_calls": [call("call_1"), call("call_2")]},
            tool("call_2"),
            {"role": "user", "content": "well?"},
        ],
        "did not have response messages: call_1",
        "messages.[1].role",
    ),
    "user message between call and result": (
        [
            ASK,
            {"role": "assistant", "content": None, "tool_calls": [call("call_1")]},
            {"role": "user", "content": "me too"},
            tool("call_1"),
        ],
        "did not have response messages: call_1",
        "messages.[1].role",
    ),
    "orphan tool message": (
        [ASK, tool("call_1")],
        "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'",
        "messages.[1].role",
    ),
    "tool message with an unknown id": (
        [
            ASK,
            {"role": "assistant", "content": None, "tool_calls": [call("call_1")]},
            tool("call_1"),
            tool("call_2"),
        ],
        "'tool_call_id' of 'call_2' not found in 'tool_calls' of previous message",
        "messages.[3].tool_call_id",
    ),
}


@pytest.mark.parametrize("case", INVALID_OPENAI)
async def test_chat_completions_answers_400_to_an_invalid_transcript(
    gpt: tuple[FakeOpenAI, openai.AsyncOpenAI], case: str
) -> None:
    fake, client = gpt
    messages, expected, param = INVALID_OPENAI[case]
    fake.reply_text("must not be used")

    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]

    assert caught.value.type == "invalid_request_error"
    assert caught.value.param == param
    assert expected in caught.value.message
    assert fake.pending == 1


async def test_chat_completions_accepts_a_tool_round_trip(
    gpt: tuple[FakeOpenAI, openai.AsyncOpenAI],
) -> None:
    fake, client = gpt
    fake.reply_text("fine")
    messages = [
        {"role": "system", "content": "be brief"},
        ASK,
        {"role": "assistant", "content": None, "tool_calls": [call("call_1"), call("call_2")]},
        tool("call_2"),
        tool("call_1"),
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "thanks"},
    ]

    completion = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]

    assert completion.choices[0].message.content == "fine"


ORPHAN_RESULT = (
    ChatMessage("user", "go"),
    ChatMessage("tool", "alpha", tool_call_id="call_lost", tool_name="read_file"),
)
UNANSWERED_CALL = (
    ChatMessage("user", "go"),
    ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "read_file", {}),)),
    ChatMessage("user", "well?"),
)


@pytest.mark.parametrize("history", [ORPHAN_RESULT, UNANSWERED_CALL], ids=["orphan", "unanswered"])
@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_provider_reports_an_invalid_history_as_a_non_retryable_400(
    kind: str, history: tuple[ChatMessage, ...]
) -> None:
    retries = RetryLog()
    fake: FakeAnthropic | FakeOpenAI
    async with FakeAnthropic() if kind == "anthropic" else FakeOpenAI() as fake:
        fake.reply_text("must not be used")
        provider = anthropic_for(fake) if isinstance(fake, FakeAnthropic) else openai_for(fake)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(request_for("m", *history), on_retry=retries)
        finally:
            await provider.aclose()

    assert caught.value.status == 400
    assert caught.value.retryable is False
    assert retries.calls == []
    assert len(fake.requests) == 1
    assert provider.breaker.state == "closed"
