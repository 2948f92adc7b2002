"""plugins.anthropic_stream: the Messages API stream sent without the SDK's per-call work."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from bot.testing.anthropic import FakeAnthropic
from plugins.anthropic_provider import AnthropicProvider
from plugins.anthropic_stream import (
    Event,
    EventStream,
    SSEParser,
    _env_proxy,
    _routes,
    close_streams,
    open_stream,
)
from roost import Settings, client_tls
from tests.provider_helpers import ANTHROPIC_KEY as KEY


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=KEY) as server:
        yield server


def _client(fake: FakeAnthropic, cls: type[anthropic.AsyncAnthropic] = anthropic.AsyncAnthropic
            ) -> anthropic.AsyncAnthropic:
    return cls(api_key=KEY, base_url=fake.base_url, max_retries=0)


async def _events(client: anthropic.AsyncAnthropic, **overrides: Any) -> list[Any]:
    params: dict[str, Any] = {"model": "claude-test", "max_tokens": 50, "system": [],
                              "messages": [{"role": "user", "content": "hi"}], "tools": []}
    params.update(overrides)
    async with await open_stream(client, **params) as stream:
        return [event async for event in stream]


async def _close(client: anthropic.AsyncAnthropic) -> None:
    """Close what :func:`open_stream` opened for ``client``, then the client (as ``aclose``)."""
    await close_streams(client)
    await client.close()


def test_parser_joins_events_split_across_chunks_with_any_line_ending() -> None:
    parser = SSEParser()
    stream = (b"event: a\r\ndata: {\"x\":\r\ndata: 1}\r\n\r\n: a comment\n\nevent: b\rdata: 2\r\r"
              b"event: c\ndata:3\n\n")
    events = []
    for i in range(len(stream)):  # one byte at a time: every split point, CR|LF included
        events.extend(parser.feed(stream[i:i + 1]))
    events.extend(parser.close())
    assert events == [("a", b"{\"x\":\n1}"), ("b", b"2"), ("c", b"3")]


def test_parser_returns_an_event_the_stream_ended_without_a_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: message_stop\ndata: {}") == []
    assert parser.close() == [("message_stop", b"{}")]
    assert parser.close() == []


def test_event_fields_read_as_attributes_and_missing_ones_as_none() -> None:
    event = Event(type="message_delta", usage=Event(output_tokens=3))
    assert event.type == "message_delta"
    assert event.usage.output_tokens == 3
    assert event.usage.cache_read_input_tokens is None
    assert isinstance(event.usage, dict)


async def test_stream_sends_the_sdk_request_and_yields_the_events_as_dicts(
    fake: FakeAnthropic,
) -> None:
    fake.reply_text("hello")
    client = _client(fake)
    tools = [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]
    events = await _events(client, system=[{"type": "text", "text": "sys"}], tools=tools)

    assert all(isinstance(e, Event) for e in events)
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == "hello"
    sent = fake.last_request
    assert sent.path == "/v1/messages" and sent.api_key == KEY
    assert sent.body["stream"] is True and sent.body["max_tokens"] == 50
    assert sent.body["system"] == [{"type": "text", "text": "sys"}]
    assert sent.body["tools"] == tools
    await _close(client)


async def test_empty_system_and_tools_are_left_out(fake: FakeAnthropic) -> None:
    fake.reply_text("ok")
    client = _client(fake)
    await _events(client)
    assert "system" not in fake.last_request.body and "tools" not in fake.last_request.body
    await _close(client)


async def test_a_client_subclass_goes_through_the_sdk(fake: FakeAnthropic) -> None:
    class Custom(anthropic.AsyncAnthropic):
        pass

    fake.reply_text("ok")
    client = _client(fake, Custom)
    async with await open_stream(client, model="claude-test", max_tokens=5, system=[],
                                 messages=[{"role": "user", "content": "hi"}],
                                 tools=[]) as stream:
        assert not isinstance(stream, EventStream)
        types = [event.type async for event in stream]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    await _close(client)


async def test_error_status_raises_the_sdk_status_error_with_the_body(
    fake: FakeAnthropic,
) -> None:
    client = anthropic.AsyncAnthropic(api_key="wrong", base_url=fake.base_url, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await _events(client)
    assert caught.value.status_code == 401
    assert isinstance(caught.value.body, dict)
    await _close(client)


async def test_unreachable_server_raises_the_sdk_connection_error() -> None:
    async with FakeAnthropic() as gone:
        url = gone.base_url
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=url, max_retries=0)
    with pytest.raises(anthropic.APIConnectionError) as caught:
        await _events(client)
    assert caught.value.__cause__ is not None
    await _close(client)


async def test_calls_share_a_connection_and_close_streams_closes_it(fake: FakeAnthropic) -> None:
    client = _client(fake)
    for text in ("one", "two"):
        fake.reply_text(text)
        async with await open_stream(client, model="claude-test", max_tokens=5, system=[],
                                     messages=[{"role": "user", "content": "hi"}],
                                     tools=[]) as stream:
            assert isinstance(stream, EventStream)
            events = [event async for event in stream]
        assert events[-1].type == "message_stop"
    route = _routes[client]
    assert route is not None and route.session is not None
    connector = route.session.connector
    assert connector is not None and len(connector._conns) == 1  # kept alive, reused
    await close_streams(client)
    assert connector.closed and route.session is None
    await client.close()


async def test_a_closed_client_is_not_kept_alive_by_its_route(fake: FakeAnthropic) -> None:
    # The route (the value of a dict weakly keyed by the client) must not hold the
    # client: else neither is ever freed, nor the session of a client not closed.
    fake.reply_text("ok")
    client = _client(fake)
    await _events(client)
    route = _routes[client]
    assert route is not None and route.client is client
    await _close(client)
    gone = weakref.ref(client)
    del client
    gc.collect()
    assert gone() is None
    assert route not in _routes.values()


async def test_a_proxy_named_in_the_environment_carries_the_call(
    fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake answers as the proxy: the API's own host does not resolve.
    monkeypatch.setenv("HTTP_PROXY", fake.base_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    fake.reply_text("via proxy")
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url="http://api.anthropic.invalid",
                                      max_retries=0)
    events = await _events(client)
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == (
        "via proxy")
    await close_streams(client)
    await client.close()


def test_no_proxy_exempts_a_host_from_the_environments_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "anthropic.com")
    assert _env_proxy("https://api.anthropic.com/v1/messages") is None
    assert _env_proxy("https://gateway.example/v1/messages") == "http://proxy.internal:3128"


def test_the_tls_context_is_built_with_the_provider_not_in_the_first_reply() -> None:
    client_tls.cache_clear()
    provider = AnthropicProvider(Settings(anthropic_api_key=KEY,
                                          anthropic_base_url="http://127.0.0.1:9"))

    assert client_tls.cache_info().currsize == 1
    assert provider is not None and client_tls() is client_tls()
