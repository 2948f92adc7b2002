"""Pytest fixtures for testing Roost and Roost plugins against local fake servers.

Registered through the ``pytest11`` entry point, so any project with Roost and
its ``testing`` extra installed gets them:

* ``fake_telegram``: a Bot API server (``channels.telegram`` points at it);
* ``fake_discord``: a gateway websocket and REST API;
* ``fake_slack``: a Web API plus signed Events API and Socket Mode delivery;
* ``fake_anthropic`` / ``fake_openai``: Messages API and Chat Completions servers
  with scripted replies (streaming, tool calls, errors).

Each yields a started server on 127.0.0.1 and stops it afterwards.

For testing a plugin's hooks end to end there is also:

* ``roost_app``: an async factory ``await roost_app(turns, *plugins, **settings)``
  that builds a Roost app with the built-in plugins, your ``plugins`` (modules or
  objects with ``@hookimpl`` functions), a scripted model answering with ``turns``
  and a console-like :class:`bot.testing.app.ChatChannel`, which it returns.
  ``await chat.say("hi", sender="ann", group="g1")`` sends a message,
  ``await chat.settle()`` waits for the answer, ``chat.replies`` holds what Roost
  sent and ``chat.app`` is the :class:`bot.app.roost.Roost`. Apps are closed afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio

from bot.testing.anthropic import FakeAnthropic
from bot.testing.discord import fake_discord
from bot.testing.openai import FakeOpenAI
from bot.testing.slack import fake_slack
from bot.testing.telegram import fake_telegram

__all__ = ["fake_anthropic", "fake_discord", "fake_openai", "fake_slack", "fake_telegram",
           "roost_app"]


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


@pytest_asyncio.fixture(name="roost_app")
async def roost_app(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await roost_app(turns, *plugins, **settings)``: a Roost app and its chat channel.

    ``turns`` are scripted-model turns (``[{"reply": "hi"}]``); ``plugins`` are
    registered next to the built-ins; keyword arguments are ``Settings`` fields,
    plus ``entry_points=True`` (load installed plugins), ``loop=True`` (repeat the
    script) and ``clock`` (a frozen scheduler clock). Returns a
    :class:`bot.testing.app.ChatChannel`; every app is closed after the test.
    """
    from bot.testing.app import app_factory  # imports the whole app: only when used

    async with app_factory(tmp_path) as factory:
        yield factory
