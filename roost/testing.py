"""Test helpers for plugin authors: a Roost app with a scripted model, and the fakes.

Installing Roost registers a pytest plugin with the fixtures ``roost_app``,
``fake_telegram``, ``fake_discord``, ``fake_slack``, ``fake_anthropic`` and
``fake_openai`` (see :mod:`bot.testing.pytest_plugin`); without pytest,
:func:`build_app` builds the same app::

    from roost.testing import build_app

:class:`AppServices` is the service's own :class:`roost.Services`, for handing
``roost_tools`` the stores it needs in a unit test; :data:`BLOCK_REFUSAL` is the
reply to a message the input guard blocks.
"""

from __future__ import annotations

from bot.app.services import AppServices
from bot.engine.gates import BLOCK_REFUSAL
from bot.testing.app import ChatChannel, EventRecorder, build_app, scripted_provider

__all__ = [
    "BLOCK_REFUSAL", "AppServices", "ChatChannel", "EventRecorder", "build_app",
    "scripted_provider",
]
