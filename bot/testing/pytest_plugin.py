"""Pytest fixtures for testing Roost and Roost plugins against local fake servers.

Registered through the ``pytest11`` entry point, so any project with Roost and
its ``testing`` extra installed gets them:

* ``fake_telegram``: a Bot API server (``channels.telegram`` points at it);
* ``fake_discord``: a gateway websocket and REST API;
* ``fake_slack``: a Web API plus signed Events API and Socket Mode delivery;
* ``fake_anthropic`` / ``fake_openai``: Messages API and Chat Completions servers
  with scripted replies (streaming, tool calls, errors).

Each yields a started server on 127.0.0.1 and stops it afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from bot.testing.anthropic import FakeAnthropic
from bot.testing.discord import fake_discord
from bot.testing.openai import FakeOpenAI
from bot.testing.slack import fake_slack
from bot.testing.telegram import fake_telegram

__all__ = ["fake_anthropic", "fake_discord", "fake_openai", "fake_slack", "fake_telegram"]


@pytest_asyncio.fixture(name="fake_anthropic")
async def fake_anthropic() -> AsyncIterator[FakeAnthropic]:
    """A local Anthropic Messages API; queue replies with ``reply_text``/``reply_tool_calls``."""
    async with FakeAnthropic() as fake:
        yield fake


@pytest_asyncio.fixture(name="fake_openai")
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """A local OpenAI-compatible Chat Completions API with scripted replies."""
    async with FakeOpenAI() as fake:
        yield fake
