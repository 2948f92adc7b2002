"""AnthropicProvider driven through the real ``anthropic`` SDK against FakeAnthropic."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import pytest

from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, LLMRequest, ProviderError, ToolCall, ToolSpec
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from bot.testing.anthropic import FakeAnthropic, ToolUse
from plugins.anthropic_provider import AnthropicProvider
from plugins.anthropic_stream import StatusFailure
from plugins.provider_retry import RetryPolicy
from tests.provider_helpers import ANTHROPIC_KEY as KEY
from tests.provider_helpers import RetryLog, anthropic_for, request_for

ask = partial(request_for, "claude-test")


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=KEY) as server:
        yield server


@pytest.fixture
async def provider(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = anthropic_for(fake)
    yield p
    await p.aclose()


async def test_streamed_text_reaches_on_text_in_order_and_equals_final_text(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text(["Hel", "lo, ", "wor", "ld!"])
    fragments: list[str] = []

    response = await provider.complete(ask(), on_text=fragments.append)

    assert fragments == ["Hel", "lo, ", "wor", "ld!"]
    assert response.text == "Hello, world!"
    assert response.tool_calls == ()
    assert response.stop_reason == "end_turn"


async def test_tool_call_partial_json_deltas_are_joined_and_parsed(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    arguments = {"path": "notes/ä.txt", "lines": [1, 2, 3], "options": {"strip": True}}
    fake.reply_tool_calls(
        ToolUse("read_file", arguments, id="toolu_A"),
        ToolUse("list_dir", {}, id="toolu_B"),
        text="Let me look.",
    )

    response = await provider.complete(ask())

    assert response.text == "Let me look."
    assert response.tool_calls == (
        ToolCall("toolu_A", "read_file", arguments),
        ToolCall("toolu_B", "list_dir", {}),
    )
    assert response.stop_reason == "tool_use"


async def test_usage_and_stop_reason_come_from_the_stream(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply("partial answer", input_tokens=321, output_tokens=54, stop_reason="max_tokens")

    response = await provider.complete(ask())

    assert (response.usage.input_tokens, response.usage.output_tokens) == (321, 54)
    assert response.stop_reason == "max_tokens"


async def test_truncated_tool_json_becomes_invalid_arguments_instead_of_crashing(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply(ToolUse("write_file", '{"path": "a.txt", "content": "unfinis', id="toolu_T"))

    response = await provider.complete(ask())

    assert response.tool_calls == (
        ToolCall(
            "toolu_T", "write_file", {"_invalid_arguments": '{"path": "a.txt", "content": "unfinis'}
        ),
    )


def without_cache_marks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` without their ``cache_control`` breakpoints."""
    return [{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"}
                              for b in m["content"]]} for m in messages]


async def test_request_streams_with_model_system_tools_and_api_key(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text("ok")
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    request = LLMRequest(
        model="claude-test",
        system="You are Roost.",
        messages=(ChatMessage("user", "read a.txt"),),
        tools=(ToolSpec("read_file", "Read a file.", schema),),
        max_tokens=777,
    )

    await provider.complete(request)

    sent = fake.last_request
    assert sent.path == "/v1/messages"
    assert sent.api_key == KEY
    assert sent.body["stream"] is True
    assert sent.body["model"] == "claude-test"
    assert sent.body["max_tokens"] == 777
    # Cache breakpoints on the last tool, the system prompt and the final message.
    cached = {"type": "ephemeral"}
    assert sent.body["system"] == [
        {"type": "text", "text": "You are Roost.", "cache_control": cached}
    ]
    assert sent.body["tools"] == [
        {"name": "read_file", "description": "Read a file.", "input_schema": schema,
         "cache_control": cached}
    ]
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "read a.txt",
                                      "cache_control": cached}]}
    ]


async def test_empty_system_and_no_tools_are_left_out_of_the_request(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text("ok")

    await provider.complete(LLMRequest(model="m", system="", messages=(ChatMessage("user", "x"),)))

    assert "system" not in fake.last_request.body
    assert "tools" not in fake.last_request.body


async def test_history_groups_tool_results_and_merges_roles_so_they_alternate(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text("done")
    history = (
        ChatMessage("user", "[Ann]: read both files"),
        ChatMessage("user", "[Bob]: and hurry"),
        ChatMessage(
            "assistant",
            "Reading.",
            tool_calls=(
                ToolCall("toolu_1", "read_file", {"path": "a.txt"}),
                ToolCall("toolu_2", "read_file", {"path": "b.txt"}),
            ),
        ),
        ChatMessage("tool", "alpha", tool_call_id="toolu_1", tool_name="read_file"),
        ChatMessage(
            "tool", "no such file", tool_call_id="toolu_2", tool_name="read_file", is_error=True
        ),
        ChatMessage("assistant", "", tool_calls=(ToolCall("toolu_3", "list_dir", {}),)),
        ChatMessage("tool", "a.txt", tool_call_id="toolu_3", tool_name="list_dir"),
        ChatMessage("user", "[Ann]: well?"),
    )

    await provider.complete(ask(*history))

    assert without_cache_marks(fake.last_request.body["messages"]) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "[Ann]: read both files"},
                {"type": "text", "text": "[Bob]: and hurry"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": {"path": "a.txt"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "read_file",
                    "input": {"path": "b.txt"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "alpha",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "no such file",
                    "is_error": True,
                },
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_3", "name": "list_dir", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_3",
                    "content": "a.txt",
                    "is_error": False,
                },
                {"type": "text", "text": "[Ann]: well?"},
            ],
        },
    ]


async def test_tool_results_come_before_text_when_a_user_message_precedes_them(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text("ok")
    history = (
        ChatMessage("user", "go"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("toolu_1", "t", {}),)),
        ChatMessage("user", "[Bob]: me too"),
        ChatMessage("tool", "result", tool_call_id="toolu_1"),
    )

    await provider.complete(ask(*history))

    last = fake.last_request.body["messages"][-1]
    assert [block["type"] for block in last["content"]] == ["tool_result", "text"]


async def test_whitespace_only_assistant_text_is_left_out_so_the_api_accepts_the_history(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text("ok")
    history = (
        ChatMessage("user", "go"),
        ChatMessage("assistant", "\n\n", tool_calls=(ToolCall("toolu_1", "list_dir", {}),)),
        ChatMessage("tool", "a.txt", tool_call_id="toolu_1"),
        ChatMessage("assistant", " "),
        ChatMessage("user", "and now?"),
    )

    response = await provider.complete(ask(*history))

    assert response.text == "ok"
    assert fake.last_request.body["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {}}],
    }


@pytest.mark.parametrize("status", [529, 429, 500, 503])
async def test_transient_http_error_is_retried_with_on_retry_then_succeeds(
    fake: FakeAnthropic, provider: AnthropicProvider, status: int
) -> None:
    fake.fail(status, message="busy")
    fake.reply_text("recovered")
    retries = RetryLog()

    response = await provider.complete(ask(), on_retry=retries)

    assert response.text == "recovered"
    assert len(fake.requests) == 2
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 6)]
    assert str(status) in retries.calls[0][2]


async def test_overloaded_error_names_the_overload_in_the_retry_message(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.fail(529, "overloaded_error", "Overloaded")
    fake.reply_text("ok")
    retries = RetryLog()

    await provider.complete(ask(), on_retry=retries)

    assert "overloaded" in retries.calls[0][2].lower()


async def test_three_failures_below_the_breaker_threshold_raise_after_two_retries(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    # With the default threshold the third failure would open the breaker and
    # hold the call instead (tests/test_llm_outage.py).
    provider.breaker = CircuitBreaker(BreakerPolicy(threshold=10))
    provider.retry = RetryPolicy(3, 0.001)
    for _ in range(3):
        fake.fail(529, "overloaded_error", "Overloaded")
    fake.reply_text("never reached")
    retries = RetryLog()

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask(), on_retry=retries)

    assert caught.value.retryable is True
    assert caught.value.status == 529
    assert "3 attempts" in str(caught.value)
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 3), (3, 3)]
    assert len(fake.requests) == 3
    assert isinstance(caught.value.__cause__, StatusFailure)
    assert caught.value.__cause__.status == 529


async def test_max_attempts_bounds_the_number_of_requests(fake: FakeAnthropic) -> None:
    settings = Settings(anthropic_api_key=KEY, anthropic_base_url=fake.base_url)
    provider = AnthropicProvider(
        settings,
        max_attempts=5,
        retry_base_delay=0.001,
        breaker=CircuitBreaker(BreakerPolicy(threshold=10)),
    )
    for _ in range(5):
        fake.fail(500)
    retries = RetryLog()
    try:
        with pytest.raises(ProviderError):
            await provider.complete(ask(), on_retry=retries)
    finally:
        await provider.aclose()

    assert len(fake.requests) == 5
    assert [a for a, _, _ in retries.calls] == [2, 3, 4, 5]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, "rejected the request (400)"),
        (401, "ANTHROPIC_API_KEY"),
        (403, "403"),
        (404, "model name"),
    ],
)
async def test_client_error_raises_at_once_without_retry(
    fake: FakeAnthropic, provider: AnthropicProvider, status: int, expected: str
) -> None:
    fake.fail(status, message="scripted client error")
    fake.reply_text("must not be used")
    retries = RetryLog()

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask(), on_retry=retries)

    assert caught.value.retryable is False
    assert caught.value.status == status
    assert expected in str(caught.value)
    assert retries.calls == []
    assert len(fake.requests) == 1


async def test_wrong_api_key_is_reported_as_rejected_key(fake: FakeAnthropic) -> None:
    settings = Settings(anthropic_api_key="sk-ant-wrong", anthropic_base_url=fake.base_url)
    provider = AnthropicProvider(settings, retry_base_delay=0.001)
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ask())
    finally:
        await provider.aclose()

    assert caught.value.status == 401
    assert "API key" in str(caught.value)
    assert "ANTHROPIC_API_KEY" in str(caught.value)


async def test_missing_api_key_fails_with_a_hint_and_sends_nothing(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Keep the SDK's own credential discovery (env, profiles on disk) out of it.
    for name in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_PROFILE",
        "ANTHROPIC_CONFIG_DIR",
        "ANTHROPIC_FEDERATION_RULE_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    provider = AnthropicProvider(Settings(anthropic_base_url=fake.base_url))
    try:
        with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
            await provider.complete(ask())
    finally:
        await provider.aclose()

    assert fake.requests == []


async def test_overloaded_error_event_after_text_is_retried_and_the_answer_restarts(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.fail_mid_stream("overloaded_error", "Overloaded", text_before="Half an ans")
    fake.reply_text(["The whole ", "answer."])
    fragments: list[str] = []
    retries = RetryLog()

    response = await provider.complete(ask(), on_text=fragments.append, on_retry=retries)

    assert fragments == ["Half an ans", "The whole ", "answer."]
    assert response.text == "The whole answer."
    assert [(a, m) for a, m, _ in retries.calls] == [(2, 6)]
    assert "Overloaded" in retries.calls[0][2]
    assert len(fake.requests) == 2


async def test_error_event_before_any_text_is_retried(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.fail_mid_stream("overloaded_error", "Overloaded")
    fake.reply_text("second try")
    fragments: list[str] = []
    retries = RetryLog()

    response = await provider.complete(ask(), on_text=fragments.append, on_retry=retries)

    assert response.text == "second try"
    assert "".join(fragments) == "second try"
    assert len(retries.calls) == 1


async def test_invalid_request_error_event_is_not_retried(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.fail_mid_stream("invalid_request_error", "bad input")
    fake.reply_text("must not be used")

    with pytest.raises(ProviderError) as caught:
        await provider.complete(ask())

    assert caught.value.retryable is False
    assert len(fake.requests) == 1


async def test_text_without_listener_does_not_block_retry(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.drop_connection(text_before="unseen words")
    fake.reply_text("clean answer")

    response = await provider.complete(ask())

    assert response.text == "clean answer"


async def test_backoff_doubles_between_attempts(fake: FakeAnthropic) -> None:
    settings = Settings(anthropic_api_key=KEY, anthropic_base_url=fake.base_url)
    provider = AnthropicProvider(settings, max_attempts=3, retry_base_delay=0.1)
    fake.fail(500)
    fake.fail(500)
    fake.reply_text("ok")
    stamps: list[float] = []

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        stamps.append(time.monotonic())

    try:
        await provider.complete(ask(), on_retry=on_retry)
    finally:
        await provider.aclose()

    # on_retry runs just before each sleep: ~0.1 s, then ~0.2 s (+ up to 10 % jitter).
    first_wait = stamps[1] - stamps[0]
    second_wait = time.monotonic() - stamps[1]
    assert first_wait >= 0.1
    assert second_wait >= 0.2
    assert second_wait > first_wait


async def test_fake_serves_non_streaming_json_to_the_sdk(fake: FakeAnthropic) -> None:
    fake.reply_tool_calls(ToolUse("read_file", {"path": "a.txt"}, id="toolu_X"), text="Sure.")
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
    try:
        message = await client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        await client.close()

    assert message.stop_reason == "tool_use"
    assert message.content[0].type == "text"
    assert message.content[1].type == "tool_use"
    assert message.content[1].input == {"path": "a.txt"}


def test_a_configured_key_sends_requests_without_importing_the_sdk() -> None:
    # Importing anthropic 2.x costs ~45 MiB and over a second: a deployment with a
    # key never pays it (the SDK stays the fallback for credentials only it finds).
    code = ("import sys\n"
            "from bot.config.settings import Settings\n"
            "from plugins.anthropic_provider import AnthropicProvider\n"
            "AnthropicProvider(Settings(anthropic_api_key='k'))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'anthropic'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


async def test_a_bearer_token_alone_is_sent_as_authorization(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", KEY)
    fake.reply_text("hello by token")
    provider = AnthropicProvider(Settings(anthropic_api_key=None, anthropic_base_url=fake.base_url))
    try:
        response = await provider.complete(ask())
    finally:
        await provider.aclose()
    assert response.text == "hello by token"
    assert fake.requests[-1].headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in fake.requests[-1].headers


async def test_credentials_only_the_sdk_finds_go_through_the_sdk_client(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No key in Roost's settings: the SDK looks for credentials itself (here its
    # environment, read when the client is built) and its client carries the call.
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    settings = Settings(anthropic_api_key=None, anthropic_base_url=fake.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    provider = AnthropicProvider(settings, max_attempts=1)
    fake.fail(529, "overloaded_error", "Overloaded")
    fake.reply_text("hello through the SDK")
    try:
        assert isinstance(provider._target, anthropic.AsyncAnthropic)
        with pytest.raises(ProviderError) as caught:
            await provider.complete(ask())
        response = await provider.complete(ask())
    finally:
        await provider.aclose()
    assert isinstance(caught.value.__cause__, anthropic.OverloadedError)
    assert response.text == "hello through the SDK"
    assert fake.requests[-1].api_key == KEY


async def test_the_tools_and_system_prompt_follow_each_request_though_encoded_once(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    # The provider encodes an agent's tools and prompt once and reuses them; a new
    # tool set, another prompt or a request without cache marks must still be sent
    # as it is, never an earlier request's.
    first = (ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {}}),)
    second = (ToolSpec("send_file", "Send a file.", {"type": "object", "properties": {}}),)
    for _ in range(4):
        fake.reply_text("ok")
    await provider.complete(request_for("claude-test", tools=first))
    await provider.complete(request_for("claude-test", tools=first))
    await provider.complete(request_for("claude-test", tools=second))
    plain = request_for("claude-test", tools=second)
    await provider.complete(LLMRequest(model=plain.model, system="be thorough",
                                       messages=plain.messages, tools=second, cache=False))

    bodies = [r.body for r in fake.requests]
    assert bodies[0]["tools"] == bodies[1]["tools"]
    assert [t["name"] for b in bodies for t in b["tools"]] == [
        "read_file", "read_file", "send_file", "send_file"]
    assert bodies[2]["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert bodies[2]["system"] == [{"type": "text", "text": "be brief",
                                    "cache_control": {"type": "ephemeral"}}]
    assert bodies[3]["system"] == [{"type": "text", "text": "be thorough"}]
    assert "cache_control" not in bodies[3]["tools"][-1]
