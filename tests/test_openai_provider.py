"""OpenAIProvider driven through the real ``openai`` SDK against FakeOpenAI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from functools import partial

import openai
import pytest

from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, LLMRequest, ProviderError, ToolCall, ToolSpec
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from bot.testing.openai import FakeOpenAI, FunctionCall
from plugins.openai_provider import OpenAIProvider
from plugins.provider_retry import RetryPolicy
from tests.provider_helpers import OPENAI_KEY as KEY
from tests.provider_helpers import RetryLog, openai_for, request_for

ask = partial(request_for, "llama3.2")


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key=KEY) as server:
        yield server


@pytest.fixture
async def provider(fake: FakeOpenAI) -> AsyncIterator[OpenAIProvider]:
    p = openai_for(fake)
    yield p
    await p.aclose()


async def test_streamed_text_reaches_on_text_in_order_and_equals_final_text(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.reply_text(["Hel", "lo, ", "wor", "ld!"])
    fragments: list[str] = []

    response = await provider.complete(ask(), on_text=fragments.append)

    assert fragments == ["Hel", "lo, ", "wor", "ld!"]
    assert response.text == "Hello, world!"
    assert response.tool_calls == ()
    assert response.stop_reason == "stop"


async def test_parallel_tool_call_deltas_are_accumulated_by_index(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    arguments = {"path": "notes/ä.txt", "lines": [1, 2, 3], "options": {"strip": True}}
    fake.reply_tool_calls(
        FunctionCall("read_file", arguments, id="call_A"),
        FunctionCall("list_dir", {"path": "."}, id="call_B"),
        text="Checking.",
    )

    response = await provider.complete(ask())

    assert response.text == "Checking."
    assert response.tool_calls == (
        ToolCall("call_A", "read_file", arguments),
        ToolCall("call_B", "list_dir", {"path": "."}),
    )
    assert response.stop_reason == "tool_calls"


async def test_invalid_json_arguments_are_passed_on_raw_instead_of_crashing(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.reply_tool_calls(
        FunctionCall("write_file", "{'path': 'a.txt',", id="call_bad"),
        FunctionCall("list_dir", "", id="call_empty"),
    )

    response = await provider.complete(ask())

    assert response.tool_calls == (
        ToolCall("call_bad", "write_file", {"_invalid_arguments": "{'path': 'a.txt',"}),
        ToolCall("call_empty", "list_dir", {}),
    )


async def test_usage_is_read_from_the_final_usage_chunk(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.reply("answer", prompt_tokens=222, completion_tokens=33)

    response = await provider.complete(ask())

    assert (response.usage.input_tokens, response.usage.output_tokens) == (222, 33)
    assert fake.last_request.body["stream_options"] == {"include_usage": True}


async def test_request_streams_with_model_tools_max_tokens_and_api_key(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.reply_text("ok")
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    request = LLMRequest(
        model="qwen2.5",
        system="You are Roost.",
        messages=(ChatMessage("user", "read a.txt"),),
        tools=(ToolSpec("read_file", "Read a file.", schema),),
        max_tokens=777,
    )

    await provider.complete(request)

    sent = fake.last_request
    assert sent.path == "/v1/chat/completions"
    assert sent.api_key == KEY
    assert sent.body["stream"] is True
    assert sent.body["model"] == "qwen2.5"
    assert sent.body["max_tokens"] == 777
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {"name": "read_file", "description": "Read a file.", "parameters": schema},
        }
    ]
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are Roost."},
        {"role": "user", "content": "read a.txt"},
    ]


async def test_no_tools_and_empty_system_are_left_out(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.reply_text("ok")

    await provider.complete(LLMRequest(model="m", system="", messages=(ChatMessage("user", "x"),)))

    assert "tools" not in fake.last_request.body
    assert fake.last_request.body["messages"] == [{"role": "user", "content": "x"}]


async def test_history_carries_tool_calls_as_json_strings_and_results_as_tool_messages(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.reply_text("done")
    history = (
        ChatMessage("user", "[Ann]: read both files"),
        ChatMessage("user", "[Bob]: and hurry"),
        ChatMessage(
            "assistant",
            "Reading.",
            tool_calls=(
                ToolCall("call_1", "read_file", {"path": "a.txt"}),
                ToolCall("call_2", "read_file", {"path": "b.txt"}),
            ),
        ),
        ChatMessage("tool", "alpha", tool_call_id="call_1", tool_name="read_file"),
        ChatMessage(
            "tool", "no such file", tool_call_id="call_2", tool_name="read_file", is_error=True
        ),
        ChatMessage("assistant", "Only a.txt exists."),
        ChatMessage("user", "[Ann]: thanks"),
    )

    await provider.complete(ask(*history))

    messages = fake.last_request.body["messages"]
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1] == {"role": "user", "content": "[Ann]: read both files\n\n[Bob]: and hurry"}
    assistant = messages[2]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == "Reading."
    assert [
        (c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ] == [
        ("call_1", "function", "read_file", {"path": "a.txt"}),
        ("call_2", "function", "read_file", {"path": "b.txt"}),
    ]
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "alpha"},
        {"role": "tool", "tool_call_id": "call_2", "content": "no such file"},
        {"role": "assistant", "content": "Only a.txt exists."},
        {"role": "user", "content": "[Ann]: thanks"},
    ]


@pytest.mark.parametrize("status", [429, 500, 502, 503])
async def test_transient_http_error_is_retried_with_on_retry_then_succeeds(
    fake: FakeOpenAI, provider: OpenAIProvider, status: int
) -> None:
    fake.fail(status, "busy")
    fake.reply_text("recovered")
    retries = RetryLog()

    response = await provider.complete(ask(), on_retry=retries)

    assert response.text == "recovered"
    assert len(fake.requests) == 2
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 6)]
    assert str(status) in retries.calls[0][2]


async def test_three_failures_below_the_breaker_threshold_raise_after_two_retries(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    # With the default threshold the third failure would open the breaker and
    # hold the call instead (tests/test_llm_outage.py).
    provider.breaker = CircuitBreaker(BreakerPolicy(threshold=10))
    provider.retry = RetryPolicy(3, 0.001)
    for _ in range(3):
        fake.fail(429, "Rate limit reached")
    fake.reply_text("never reached")
    retries = RetryLog()

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask(), on_retry=retries)

    assert caught.value.retryable is True
    assert caught.value.status == 429
    assert "3 attempts" in str(caught.value)
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 3), (3, 3)]
    assert len(fake.requests) == 3
    assert isinstance(caught.value.__cause__, openai.RateLimitError)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, "rejected the request (400)"),
        (401, "OPENAI_API_KEY"),
        (403, "403"),
        (404, "model name"),
    ],
)
async def test_client_error_raises_at_once_without_retry(
    fake: FakeOpenAI, provider: OpenAIProvider, status: int, expected: str
) -> None:
    fake.fail(status, "scripted client error")
    fake.reply_text("must not be used")
    retries = RetryLog()

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask(), on_retry=retries)

    assert caught.value.retryable is False
    assert caught.value.status == status
    assert expected in str(caught.value)
    assert retries.calls == []
    assert len(fake.requests) == 1


async def test_wrong_api_key_is_reported_as_rejected_key(fake: FakeOpenAI) -> None:
    settings = Settings(openai_api_key="sk-wrong", openai_base_url=fake.base_url)
    provider = OpenAIProvider(settings, retry_base_delay=0.001)
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ask())
    finally:
        await provider.aclose()

    assert caught.value.status == 401
    assert "OPENAI_API_KEY" in str(caught.value)


async def test_keyless_local_server_gets_a_placeholder_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with FakeOpenAI() as fake:
        fake.reply_text("hi from ollama")
        provider = OpenAIProvider(Settings(openai_base_url=fake.base_url))
        try:
            response = await provider.complete(ask())
        finally:
            await provider.aclose()

    assert response.text == "hi from ollama"
    assert fake.last_request.api_key == "not-needed"


async def test_server_error_object_after_text_is_retried_and_the_answer_restarts(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.fail_mid_stream("model crashed", text_before="Half an ans")
    fake.reply_text(["The whole ", "answer."])
    fragments: list[str] = []
    retries = RetryLog()

    response = await provider.complete(ask(), on_text=fragments.append, on_retry=retries)

    assert "".join(fragments) == "Half an ansThe whole answer."
    assert response.text == "The whole answer."
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 6)]
    assert "model crashed" in retries.calls[0][2]
    assert len(fake.requests) == 2


async def test_error_object_mid_stream_before_text_is_retried(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.fail_mid_stream("temporarily unavailable")
    fake.reply_text("second try")
    fragments: list[str] = []
    retries = RetryLog()

    response = await provider.complete(ask(), on_text=fragments.append, on_retry=retries)

    assert response.text == "second try"
    assert "".join(fragments) == "second try"
    assert len(retries.calls) == 1


async def test_bad_request_error_mid_stream_is_not_retried(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.fail_mid_stream("context too long", error_type="BadRequestError", code="400")
    fake.reply_text("must not be used")

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is False
    assert len(fake.requests) == 1


async def test_unreachable_server_is_a_retryable_error_naming_the_url() -> None:
    async with FakeOpenAI() as fake:
        url = fake.base_url
    provider = OpenAIProvider(
        Settings(openai_base_url=url),
        max_attempts=3,
        retry_base_delay=0.001,
        breaker=CircuitBreaker(BreakerPolicy(threshold=10)),
    )
    retries = RetryLog()
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ask(), on_retry=retries)
    finally:
        await provider.aclose()

    assert caught.value.retryable is True
    assert url in str(caught.value)
    assert len(retries.calls) == 2


async def test_unreachable_server_holds_the_call_with_a_reason_naming_the_url() -> None:
    async with FakeOpenAI() as fake:
        url = fake.base_url
    provider = OpenAIProvider(Settings(openai_base_url=url), retry_base_delay=0.001)
    held = asyncio.Event()
    retries: list[tuple[int, int, str]] = []

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        retries.append((attempt, max_attempts, error))
        if attempt == 0:
            held.set()

    task = asyncio.create_task(provider.complete(ask(), on_retry=on_retry))
    try:
        await asyncio.wait_for(held.wait(), 10)
        assert provider.breaker.is_open
        # Held, not failed: only the caller's cancellation (the run timeout) ends it.
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await provider.aclose()

    assert [(a, m) for a, m, _ in retries] == [(2, 6), (3, 6), (0, 0)]
    assert url in retries[-1][2]


async def test_server_rejecting_stream_options_is_asked_again_without_them(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.fail(400, "Unrecognized request argument supplied: stream_options")
    fake.reply_text("first")
    fake.reply_text("second")
    retries = RetryLog()

    first = await provider.complete(ask(), on_retry=retries)
    second = await provider.complete(ask())

    assert (first.text, second.text) == ("first", "second")
    assert "stream_options" in fake.requests[0].body
    assert "stream_options" not in fake.requests[1].body
    assert "stream_options" not in fake.requests[2].body
    assert retries.calls == []


async def test_model_requiring_max_completion_tokens_is_asked_again_with_it(
    fake: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake.fail(
        400,
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead.",
    )
    fake.reply_text("ok")

    await provider.complete(ask())

    assert fake.requests[1].body["max_completion_tokens"] == 4096
    assert "max_tokens" not in fake.requests[1].body


async def test_fake_serves_non_streaming_json_to_the_sdk(fake: FakeOpenAI) -> None:
    fake.reply_tool_calls(FunctionCall("read_file", {"path": "a.txt"}, id="call_X"), text="Sure.")
    client = openai.AsyncOpenAI(api_key=KEY, base_url=fake.base_url, max_retries=0)
    try:
        completion = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        await client.close()

    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Sure."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert (call.id, call.function.name) == ("call_X", "read_file")
    assert json.loads(call.function.arguments) == {"path": "a.txt"}
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 13
