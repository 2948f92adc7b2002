"""Provider plugins: how a provider is offered and chosen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.contracts.llm import LLMProvider, LLMRequest, LLMResponse, OnRetry, OnText
from bot.contracts.settings import SettingsModel


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """An LLM provider a plugin offers.

    ``missing(settings)`` returns ``None`` when the provider can run, or one
    sentence naming exactly what to set. ``create(settings)`` builds it and is
    where the provider's SDK is imported.
    """

    name: str
    create: Callable[[SettingsModel], LLMProvider]
    missing: Callable[[SettingsModel], str | None]


class LazyProvider:
    """A provider whose SDK is imported off the event loop, on first need.

    SDKs such as ``anthropic`` take a second or more to import; doing that in
    ``roost run``'s start path delays every channel. ``warm_up()`` (started in
    the background once the service is ready) imports it in a worker thread;
    a request that arrives earlier simply waits for the same import.
    """

    def __init__(self, name: str, factory: Callable[[], LLMProvider]) -> None:
        self.name = name
        self._factory = factory
        self._provider: LLMProvider | None = None
        self._lock = asyncio.Lock()

    async def warm_up(self) -> LLMProvider:
        """Build the real provider (once), importing its SDK in a thread."""
        if self._provider is None:
            async with self._lock:
                if self._provider is None:
                    self._provider = await asyncio.to_thread(self._factory)
        return self._provider

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        """Delegate to the real provider, building it first if needed."""
        provider = await self.warm_up()
        return await provider.complete(request, on_text=on_text, on_retry=on_retry)

    async def aclose(self) -> None:
        """Close the real provider if it was ever built."""
        if self._provider is not None:
            await self._provider.aclose()

    def __getattr__(self, attribute: str) -> Any:
        # Provider-specific knobs (tests set ``retry``) reach the real provider.
        if self._provider is None:
            raise AttributeError(f"{attribute!r}: the {self.name} provider is not loaded yet")
        return getattr(self._provider, attribute)
