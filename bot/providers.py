"""Provider plugins: how a provider is offered and chosen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.llm import LLMProvider

if TYPE_CHECKING:
    from bot.config import Settings


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """An LLM provider a plugin offers.

    ``missing(settings)`` returns ``None`` when the provider can run, or one
    sentence naming exactly what to set. ``create(settings)`` builds it and is
    where the provider's SDK is imported.
    """

    name: str
    create: Callable[[Settings], LLMProvider]
    missing: Callable[[Settings], str | None]
