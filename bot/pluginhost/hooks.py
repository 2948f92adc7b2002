"""Every hook as a typed method: ``host.hooks.roost_tools(settings=..., services=...)``.

Call sites name hooks by attribute, so a misspelt hook is a type error, not a
hook that silently has no implementations. Each method returns what the
hookspec promises: the implementations' items flattened into one list, in
call order, with items of the wrong type logged with their plugin's name and
left out (``None`` left out silently).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from bot.contracts import hookspecs
from bot.contracts.channel import ChannelSpec
from bot.contracts.commands import Command
from bot.contracts.guard import GuardPattern, InputCheck
from bot.contracts.health import HealthReport
from bot.contracts.jobs import JobSpec
from bot.contracts.media import Transcriber
from bot.contracts.migrations import Migrations
from bot.contracts.prompt import PromptSection
from bot.contracts.providers import ProviderSpec
from bot.contracts.sanitize import Sanitizer
from bot.contracts.search import SearchBackend
from bot.contracts.tools import Tool

if TYPE_CHECKING:
    from pydantic import BaseModel

    from bot.contracts.events import RunEvent
    from bot.contracts.judge import Judge
    from bot.contracts.messages import InboundMessage
    from bot.contracts.prompt import PromptContext
    from bot.contracts.runtime import Runtime
    from bot.contracts.services import Services
    from bot.contracts.settings import SettingsModel
    from bot.pluginhost.manager import PluginHost

log = logging.getLogger("roost.pluginhost.hooks")

T = TypeVar("T")

Spec = Callable[..., object]
"""A hookspec function of :mod:`bot.contracts.hookspecs`; its ``__name__`` is the hook's."""


class Offers(list[T]):
    """The items one hook call offered, flattened, in call order.

    ``hook`` is the hook's name and ``named`` pairs each item with the plugin
    that offered it (for messages and for grouping tools by plugin).
    """

    def __init__(self, hook: str, named: Iterable[tuple[str, T]] = ()) -> None:
        self.hook = hook
        self.named: list[tuple[str, T]] = list(named)
        super().__init__(item for _, item in self.named)


@dataclass(frozen=True, slots=True)
class InputChecks:
    """What the ``roost_check_input`` implementations made of a message, together.

    ``text`` is the message as the last check rewrote it, ``notes`` what they
    appended for the model, ``refusal`` the first refusal (the checks after it
    were not asked).
    """

    text: str
    notes: tuple[str, ...] = ()
    refusal: str | None = None


def _instance(kind: type[T]) -> Callable[[object], TypeGuard[T]]:
    def accepts(item: object) -> TypeGuard[T]:
        return isinstance(item, kind)
    return accepts


def _transcriber(item: object) -> TypeGuard[Transcriber]:
    return isinstance(item, Transcriber)


def _search_backend(item: object) -> TypeGuard[SearchBackend]:
    return isinstance(item, SearchBackend)


def _judge(item: object) -> TypeGuard[Judge]:
    return isinstance(getattr(item, "name", None), str) and callable(getattr(item, "score", None))


def _config_model(item: object) -> TypeGuard[type[BaseModel]]:
    from pydantic import BaseModel

    return isinstance(item, type) and issubclass(item, BaseModel)


class Hooks:
    """One method per hookspec, calling the enabled implementations (or, from
    :meth:`only`, one plugin's, enabled or not).

    A failing implementation is logged with its plugin's name and skipped (see
    :class:`~bot.pluginhost.manager.PluginHost`); the others still answer.
    """

    def __init__(self, host: PluginHost, plugin: str | None = None) -> None:
        self._host = host
        self._plugin = plugin

    def only(self, plugin: str) -> Hooks:
        """The same methods, calling plugin ``plugin`` alone, disabled or not; its failures
        are logged but not recorded in ``errors`` (for describing a plugin)."""
        return Hooks(self._host, plugin)

    def implemented(self, spec: Spec) -> bool:
        """Whether any enabled plugin implements the hook of ``spec`` (a hookspec function)."""
        return bool(self._host.implementations(_name(spec)))

    async def _offers(self, spec: Spec, accepts: Callable[[object], TypeGuard[T]],
                      kind: str, **kwargs: Any) -> Offers[T]:
        hook = _name(spec)
        offered: list[tuple[str, T]] = []
        for plugin, item in await self._host.collect_named(hook, kwargs, only=self._plugin):
            if accepts(item):
                offered.append((plugin, item))
            elif item is not None:  # None in a list means "nothing", as a result does
                log.error("plugin %r returned %s from %s, not a %s; ignored",
                          plugin, type(item).__name__, hook, kind)
        return Offers(hook, offered)

    async def _call(self, spec: Spec, **kwargs: Any) -> None:
        await self._host.collect_named(_name(spec), kwargs, only=self._plugin)

    async def roost_tools(self, *, settings: SettingsModel, services: Services) -> Offers[Tool]:
        """Tools plugins offer (see :func:`bot.contracts.hookspecs.roost_tools`)."""
        return await self._offers(hookspecs.roost_tools, _instance(Tool), "Tool",
                                  settings=settings, services=services)

    async def roost_output_sanitizers(self, *, settings: SettingsModel) -> Offers[Sanitizer]:
        """Sanitizers for final replies."""
        return await self._offers(hookspecs.roost_output_sanitizers, _instance(Sanitizer),
                                  "Sanitizer", settings=settings)

    async def roost_guard_patterns(self, *, settings: SettingsModel) -> Offers[GuardPattern]:
        """Prompt-injection patterns."""
        return await self._offers(hookspecs.roost_guard_patterns, _instance(GuardPattern),
                                  "GuardPattern", settings=settings)

    async def roost_check_input(self, *, message: InboundMessage, text: str,
                                settings: SettingsModel) -> InputChecks:
        """Run the input checks in order, each seeing the text as the ones before rewrote it;
        the first refusal stops there. Results that are not an ``InputCheck`` are ignored."""
        args: dict[str, Any] = {"message": message, "text": text, "settings": settings}
        notes: list[str] = []
        refusal: list[str] = []

        def step(check: Any, args: dict[str, Any]) -> bool:
            if not isinstance(check, InputCheck):
                return False
            if check.refusal is not None:
                refusal.append(check.refusal)
                return True
            if check.text is not None:
                args["text"] = check.text  # the next check sees the rewrite
            if check.note:
                notes.append(check.note)
            return False

        await self._host.pipe(_name(hookspecs.roost_check_input), args, step, only=self._plugin)
        return InputChecks(args["text"], tuple(notes), refusal[0] if refusal else None)

    async def roost_commands(self, *, settings: SettingsModel) -> Offers[Command]:
        """Slash commands."""
        return await self._offers(hookspecs.roost_commands, _instance(Command), "Command",
                                  settings=settings)

    async def roost_channels(self, *, settings: SettingsModel) -> Offers[ChannelSpec]:
        """Channel adapters."""
        return await self._offers(hookspecs.roost_channels, _instance(ChannelSpec),
                                  "ChannelSpec", settings=settings)

    async def roost_providers(self, *, settings: SettingsModel) -> Offers[ProviderSpec]:
        """LLM providers."""
        return await self._offers(hookspecs.roost_providers, _instance(ProviderSpec),
                                  "ProviderSpec", settings=settings)

    async def roost_prompt_sections(self, *, prompt: PromptContext) -> Offers[PromptSection]:
        """System prompt sections for one run."""
        return await self._offers(hookspecs.roost_prompt_sections, _instance(PromptSection),
                                  "PromptSection", prompt=prompt)

    async def roost_judges(self, *, settings: SettingsModel) -> Offers[Judge]:
        """Judges (objects with a ``name`` and ``score()``)."""
        return await self._offers(hookspecs.roost_judges, _judge, "Judge", settings=settings)

    async def roost_scheduled_jobs(self, *, settings: SettingsModel) -> Offers[JobSpec]:
        """Scheduled jobs."""
        return await self._offers(hookspecs.roost_scheduled_jobs, _instance(JobSpec), "JobSpec",
                                  settings=settings)

    async def roost_run_event(self, *, event: RunEvent) -> None:
        """Tell the run observers about ``event``."""
        await self._call(hookspecs.roost_run_event, event=event)

    async def roost_plugin_config_model(self) -> Offers[type[BaseModel]]:
        """Configuration model classes."""
        return await self._offers(hookspecs.roost_plugin_config_model, _config_model,
                                  "pydantic model class")

    async def roost_transcriber(self, *, settings: SettingsModel) -> Offers[Transcriber]:
        """Transcribers, first offered first."""
        return await self._offers(hookspecs.roost_transcriber, _transcriber, "Transcriber",
                                  settings=settings)

    async def roost_search_backends(self, *, settings: SettingsModel) -> Offers[SearchBackend]:
        """Web search backends."""
        return await self._offers(hookspecs.roost_search_backends, _search_backend,
                                  "SearchBackend", settings=settings)

    async def roost_migrations(self) -> Offers[Migrations]:
        """Plugin table migrations."""
        return await self._offers(hookspecs.roost_migrations, _instance(Migrations),
                                  "Migrations")

    async def roost_startup(self, *, app: Runtime) -> None:
        """Tell plugins the service has started."""
        await self._call(hookspecs.roost_startup, app=app)

    async def roost_health(self, *, app: Runtime) -> Offers[HealthReport]:
        """Health reports of the parts plugins vouch for."""
        return await self._offers(hookspecs.roost_health, _instance(HealthReport),
                                  "HealthReport", app=app)

    async def roost_shutdown(self, *, app: Runtime) -> None:
        """Tell plugins the service is stopping."""
        await self._call(hookspecs.roost_shutdown, app=app)


def _name(spec: Spec) -> str:
    name = getattr(spec, "__name__", "")
    if getattr(hookspecs, name, None) is not spec:
        raise ValueError(f"{spec!r} is not a hookspec of bot.contracts.hookspecs")
    return name
