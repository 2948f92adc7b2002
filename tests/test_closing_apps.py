"""The test apps' fixture fails within a bound, naming what waits, when an app never closes
(instead of pytest-timeout's 180 s with no word of the cause)."""

from __future__ import annotations

import asyncio

import pytest

from bot.testing import app as appmod
from bot.testing.app import closing_apps


class Stuck:
    async def close(self):
        await asyncio.Event().wait()

async def test_a_hanging_close_fails_naming_it(monkeypatch):
    monkeypatch.setattr(appmod, "CLOSE_BOUND", 0.2)
    with pytest.raises(AssertionError, match="did not finish"):
        async with closing_apps() as apps:
            apps.append(Stuck())
