"""Scheduled jobs offered by plugins."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.contracts.runtime import Runtime


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to run on a schedule.

    ``schedule`` is a 5-field cron expression or ``every <N>s|m|h|d``;
    ``func(app)`` is awaited at each fire time with the
    :class:`~bot.contracts.runtime.Runtime`.
    """

    name: str
    schedule: str
    func: Callable[[Runtime], Awaitable[None]]
