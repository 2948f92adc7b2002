"""The real providers wired to the fake servers, and the helpers their tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, LLMRequest, ToolSpec
from bot.testing.anthropic import FakeAnthropic
from bot.testing.openai import FakeOpenAI
from plugins.anthropic_provider import AnthropicProvider
from plugins.openai_provider import OpenAIProvider

__all__ = [
    "ANTHROPIC_KEY",
    "OPENAI_KEY",
    "RetryLog",
    "Served",
    "anthropic_for",
    "openai_for",
    "request_for",
    "serve",
]

ANTHROPIC_KEY = "sk-ant-test"
"""The key the Anthropic fake expects and :func:`anthropic_for` sends."""

OPENAI_KEY = "sk-test"
"""The key the OpenAI fake expects and :func:`openai_for` sends."""


class RetryLog:
    """Records on_retry calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str]] = []

    async def __call__(self, attempt: int, max_attempts: int, error: str) -> None:
        self.calls.append((attempt, max_attempts, error))


def request_for(model: str, *messages: ChatMessage, tools: tuple[ToolSpec, ...] = ()) -> LLMRequest:
    """A request to ``model`` with a short system prompt; the history defaults to "hi"."""
    history = messages or (ChatMessage("user", "hi"),)
    return LLMRequest(model=model, system="be brief", messages=history, tools=tools)


def anthropic_for(fake: FakeAnthropic, *, retry_base_delay: float = 0.001) -> AnthropicProvider:
    """An AnthropicProvider talking to ``fake`` with :data:`ANTHROPIC_KEY`.

    Retries wait about a millisecond by default so retry tests stay fast.
    """
    settings = Settings(anthropic_api_key=ANTHROPIC_KEY, anthropic_base_url=fake.base_url)
    return AnthropicProvider(settings, retry_base_delay=retry_base_delay)


def openai_for(fake: FakeOpenAI, *, retry_base_delay: float = 0.001) -> OpenAIProvider:
    """An OpenAIProvider talking to ``fake`` with :data:`OPENAI_KEY`; fast retries as above."""
    settings = Settings(openai_api_key=OPENAI_KEY, openai_base_url=fake.base_url)
    return OpenAIProvider(settings, retry_base_delay=retry_base_delay)


@dataclass(frozen=True, slots=True)
class Served:
    """A started fake server and a provider pointed at it."""

    fake: FakeAnthropic | FakeOpenAI
    provider: AnthropicProvider | OpenAIProvider


@asynccontextmanager
async def serve(kind: Literal["anthropic", "openai"]) -> AsyncIterator[Served]:
    """Start the ``kind`` fake and a provider for it; close both on exit."""
    async with AsyncExitStack() as stack:
        served: Served
        if kind == "anthropic":
            claude = await stack.enter_async_context(FakeAnthropic(api_key=ANTHROPIC_KEY))
            served = Served(claude, anthropic_for(claude))
        else:
            gpt = await stack.enter_async_context(FakeOpenAI(api_key=OPENAI_KEY))
            served = Served(gpt, openai_for(gpt))
        stack.push_async_callback(served.provider.aclose)
        yield served
