"""Building the plugin manager and calling hooks safely from async code.

pluggy calls implementations synchronously and stops at the first exception;
Roost needs async implementations awaited and a failing plugin skipped, so
hooks are called through ``host.hooks.roost_X(...)`` (:class:`Hooks`: every hook as
a typed method, so a misspelt hook is a type error, not a hook that silently has no
implementations) instead of ``pm.hook.roost_X()``. Each typed method returns what the
hookspec promises: the implementations' items flattened into one list, in call order,
with items of the wrong type logged with their plugin's name and left out (``None``
left out silently).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Set
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

import pluggy

from bot.config.settings import SetupError
from bot.contracts import hookspecs
from bot.contracts.channel import ChannelSpec
from bot.contracts.commands import Command, CommandContext
from bot.contracts.guard import GuardPattern, InputCheck
from bot.contracts.health import HealthReport
from bot.contracts.jobs import JobSpec
from bot.contracts.llm import Sanitizer
from bot.contracts.media import Transcriber
from bot.contracts.migrations import Migrations
from bot.contracts.prompt import PromptSection
from bot.contracts.providers import ProviderSpec
from bot.contracts.runtime import Runtime
from bot.contracts.search import SearchBackend
from bot.contracts.tools import Tool
from bot.pluginhost.discovery import HookManager

if TYPE_CHECKING:
    from pydantic import BaseModel

    from bot.contracts.events import RunEvent
    from bot.contracts.judge import Judge
    from bot.contracts.messages import InboundMessage, ReplyReaction
    from bot.contracts.prompt import PromptContext
    from bot.contracts.services import Services
    from bot.contracts.settings import SettingsModel

log = logging.getLogger("roost.pluginhost.manager")

BUILTIN_PLUGINS: tuple[str, ...] = (
    "plugins.core_commands",
    "plugins.pairing_commands",
    "plugins.file_tools",
    "plugins.sql_tool",
    "plugins.error_tools",
    "plugins.prompt_sections",
    "plugins.guard_patterns",
    "plugins.providers",
    "channels.builtin",
    "plugins.sanitizers",
    "plugins.memory",
    "plugins.heartbeat",
    "plugins.cron",
    "bot.pluginhost.commands",
    "plugins.agent_commands",
    "plugins.media_tools",
    "plugins.transcribe",
    "plugins.web",
    "plugins.mcp",
    "plugins.exec_tool",
    "plugins.feedback",
    "plugins.whatsapp",
    "plugins.skills",
    "plugins.mail",
    "plugins.matrix",
)
"""Modules of the built-in plugins, registered like external ones."""

ESSENTIAL_PLUGINS: frozenset[str] = frozenset(
    {"plugins.core_commands", "plugins.providers", "channels.builtin",
     "bot.pluginhost.commands"})
"""Built-ins that cannot be disabled: without them Roost cannot run or be re-enabled."""

RESTART_HOOKS: frozenset[str] = frozenset({"roost_channels", "roost_providers"})
"""Hooks used only at startup: enabling or disabling a plugin with them needs a restart."""

ENTRY_POINT_GROUP = "roost"


@dataclass(slots=True)
class PluginInfo:
    """Where a registered plugin came from."""

    name: str
    distribution: str = ""
    version: str = ""
    builtin: bool = False


@dataclass
class PluginHost:
    """The plugin manager plus what Roost knows about each plugin.

    ``errors`` maps a plugin name to its latest failure (import, validation or
    a hook that raised); ``disabled`` names plugins whose hooks are skipped.
    ``config`` holds each plugin's validated configuration object (see the
    ``roost_plugin_config_model`` hook); ``bad_config`` names plugins disabled
    because their configuration did not validate. ``trace`` logs every hook
    call with its implementations and their durations (``ROOST_TRACE_PLUGINS=1``).
    """

    pm: pluggy.PluginManager
    info: dict[str, PluginInfo] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    disabled: set[str] = field(default_factory=set)
    config: dict[str, Any] = field(default_factory=dict)
    bad_config: set[str] = field(default_factory=set)
    trace: bool = False

    def apply_saved(self, saved: Set[str], *, replace: bool = False) -> None:
        """Disable the plugins an admin disabled (``saved``); essential ones stay enabled.

        ``replace``: enable every other plugin again, except those whose configuration
        did not validate (``bad_config``).
        """
        kept = set(saved) - ESSENTIAL_PLUGINS
        if replace:
            self.disabled = kept | self.bad_config
        else:
            self.disabled |= kept

    def register(self, plugin: object, name: str, info: PluginInfo | None = None) -> None:
        """Register ``plugin`` under ``name`` (tests and embedders use this too)."""
        self.pm.register(plugin, name=name)
        self.info[name] = info or PluginInfo(name=name)

    @cached_property
    def hooks(self) -> Hooks:
        """Every hook as a typed method over the enabled plugins (``host.hooks.roost_tools``)."""
        return Hooks(self)

    def implementations(self, hook: str) -> list[pluggy.HookImpl]:
        """Enabled implementations of ``hook`` in pluggy's call order."""
        caller: pluggy.HookCaller = getattr(self.pm.hook, hook)
        return [i for i in reversed(caller.get_hookimpls()) if i.plugin_name not in self.disabled]

    async def call(self, hook: str, **kwargs: Any) -> list[Any]:
        """Call every enabled implementation of ``hook``; its non-``None`` results in call order.

        For tests and tools that go through hooks by name; the service calls
        hooks through :attr:`hooks`.
        """
        async with aclosing(self.each(hook, kwargs)) as results:
            return [result async for _, result in results]

    async def collect(self, hook: str, **kwargs: Any) -> list[Any]:
        """Like :meth:`call`, results that are lists flattened into one list."""
        return [item for _, item in await self.collect_named(hook, kwargs)]

    async def collect_named(self, hook: str, kwargs: Mapping[str, Any],
                            only: str | None = None) -> list[tuple[str, Any]]:
        """Each item ``hook``'s implementations return (lists flattened) with its plugin's name.

        ``only`` calls that plugin's implementation alone, enabled or not; its
        failure is logged but not recorded in ``errors``.
        """
        items: list[tuple[str, Any]] = []
        async with aclosing(self.each(hook, kwargs, only)) as results:
            async for plugin, result in results:
                if isinstance(result, list | tuple):
                    items.extend((plugin, item) for item in result)
                else:
                    items.append((plugin, result))
        return items

    async def pipe(self, hook: str, kwargs: dict[str, Any],
                   step: Callable[[Any, dict[str, Any]], bool], only: str | None = None) -> None:
        """Call ``hook``'s implementations in order, each seeing what the ones before changed.

        After each non-``None`` result, ``step(result, kwargs)`` may change
        ``kwargs`` (in place) for the implementations after it; it returns
        True to stop there.
        """
        async with aclosing(self.each(hook, kwargs, only)) as results:
            async for _, result in results:
                if step(result, kwargs):
                    return

    async def each(self, hook: str, kwargs: Mapping[str, Any], only: str | None = None,
                   failed: Callable[[str, str, Exception], None] | None = None, *,
                   disabled_too: bool = False) -> AsyncGenerator[tuple[str, Any], None]:
        """The one place implementations are called: each non-``None`` result with its plugin.

        Calls the enabled implementations of ``hook`` in call order (``only``:
        that plugin's, enabled or not; ``disabled_too``: every plugin's) with
        the arguments each names, read from ``kwargs`` at its turn, and awaits
        async ones. One that raises is handed to ``failed`` (default: logged
        with its plugin's name and recorded in ``errors``; with ``only``:
        logged) and skipped. With ``trace`` every call is logged with its
        implementations and their durations. Iterate it inside
        :func:`contextlib.aclosing`, so a caller that stops early still ends it.
        """
        if only is None and not disabled_too:
            impls = self.implementations(hook)
        else:
            caller: pluggy.HookCaller = getattr(self.pm.hook, hook)
            impls = [i for i in reversed(caller.get_hookimpls())
                     if only is None or i.plugin_name == only]
        if failed is None:
            failed = self._failed if only is None else _logged
        timings: list[str] = []
        start = time.perf_counter()
        try:
            for impl in impls:
                began = time.perf_counter()
                try:
                    result = impl.function(*[kwargs[a] for a in impl.argnames])
                    if inspect.isawaitable(result):
                        result = await result
                except Exception as exc:
                    failed(impl.plugin_name, hook, exc)
                    if self.trace:
                        timings.append(f"{impl.plugin_name} {_ms(began)} raised")
                    continue
                if self.trace:
                    timings.append(f"{impl.plugin_name} {_ms(began)}")
                if result is not None:
                    yield impl.plugin_name, result
        finally:
            if self.trace:
                log.info("hook %s: %d implementation(s) in %s [%s]", hook, len(impls),
                         _ms(start), ", ".join(timings))

    def is_loaded(self, name: str) -> bool:
        """True when a plugin named ``name`` is registered."""
        return self.pm.get_plugin(name) is not None

    async def health(self, app: Runtime) -> list[HealthReport]:
        """Every enabled plugin's health reports (``roost_health``)."""
        return list(await self.hooks.roost_health(app=app))

    async def status_lines(self, context: CommandContext) -> list[str]:
        """The lines enabled plugins add to ``/status`` (``roost_status``)."""
        return list(await self.hooks.roost_status(context=context))

    def hooks_of(self, name: str) -> list[str]:
        """Names of the hooks plugin ``name`` implements (empty if it is not registered)."""
        plugin = self.pm.get_plugin(name)
        if plugin is None:
            return []
        return sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])

    async def validate_configs(self, configs: Mapping[str, Any]) -> None:
        """Validate each plugin's ``[plugins.<name>]`` table against its config model.

        A plugin whose configuration does not validate is disabled (not
        persisted), named in ``errors`` and ``bad_config``; the others run. A built-in
        plugin's bad table raises :class:`SetupError` naming the key instead.
        """
        from pydantic import BaseModel, ValidationError

        def raised(name: str, hook: str, exc: Exception) -> None:
            self._bad_config(name, f"{hook}: {type(exc).__name__}: {exc}")

        hook = hookspecs.roost_plugin_config_model.__name__
        async with aclosing(self.each(hook, {}, failed=raised)) as models:
            async for name, model in models:
                if not (isinstance(model, type) and issubclass(model, BaseModel)):
                    raised(name, hook, TypeError(f"returned {model!r}, not a pydantic model "
                                                 f"class"))
                    continue
                try:
                    self.config[name] = model.model_validate(configs.get(name, {}))
                except ValidationError as exc:
                    problems = "; ".join(
                        f"{'.'.join(str(p) for p in e['loc']) or '(table)'}: {e['msg']}"
                        for e in exc.errors())
                    info = self.info.get(name)
                    if info is not None and info.builtin:
                        # Roost's own settings: a bad value stops the start, as a core one does.
                        raise SetupError(f'invalid config: [plugins."{name}"] {problems}'
                                         ) from None
                    self._bad_config(name, f"invalid configuration in [plugins.{name}]: "
                                           f"{problems}")
                except Exception as exc:
                    raised(name, hook, exc)

    def _bad_config(self, name: str, message: str) -> None:
        self.errors[name] = message
        self.bad_config.add(name)
        self.disabled.add(name)
        log.error("plugin %r is disabled: %s", name, message)

    def _failed(self, plugin: str, hook: str, exc: BaseException) -> None:
        self.errors[plugin] = f"{hook}: {type(exc).__name__}: {exc}"
        log.error("plugin %r raised in %s; skipped for this call", plugin, hook, exc_info=exc)


def _logged(plugin: str, hook: str, exc: BaseException) -> None:
    log.error("plugin %r raised in %s", plugin, hook, exc_info=exc)


def _ms(since: float) -> str:
    return f"{(time.perf_counter() - since) * 1000:.2f} ms"


def normalize_dist(name: str) -> str:
    """A distribution name compared the way pip does (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).strip().lower()


def load_filter(env: Mapping[str, str]) -> set[str] | None:
    """The distributions ``ROOST_LOAD_PLUGINS`` allows (``None`` when it is unset)."""
    value = env.get("ROOST_LOAD_PLUGINS")
    if value is None:
        return None
    return {normalize_dist(part) for part in value.split(",") if part.strip()}


def _entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def get_plugin_manager(
    *, load_entry_points: bool = True, env: Mapping[str, str] | None = None,
    disabled: Set[str] = frozenset(),
) -> PluginHost:
    """Build the plugin host: specs, built-ins, then the ``roost`` entry points.

    Nothing happens at import time; every call builds a fresh manager, which
    keeps tests independent. ``ROOST_DISABLE_PLUGIN_AUTOLOAD=1`` skips external
    plugins; ``ROOST_LOAD_PLUGINS=dist-a,dist-b`` loads only the external
    plugins of those distributions (an empty value loads none).
    ``ROOST_TRACE_PLUGINS=1`` logs every hook call. A plugin that fails to
    import or to validate is recorded in ``errors`` and left out; the others load.
    ``disabled`` names plugins an admin disabled (essential ones stay enabled).
    """
    env = os.environ if env is None else env
    pm = HookManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    host = PluginHost(pm, disabled=set(disabled) - ESSENTIAL_PLUGINS,
                      trace=env.get("ROOST_TRACE_PLUGINS", "") in ("1", "true"))
    allowed = load_filter(env)
    version = _roost_version()
    for modname in BUILTIN_PLUGINS:
        module = importlib.import_module(modname)
        host.register(module, modname, PluginInfo(modname, "roost", version, True))
    if load_entry_points and env.get("ROOST_DISABLE_PLUGIN_AUTOLOAD", "") not in ("1", "true"):
        for ep in _entry_points():
            dist = ep.dist.name if ep.dist else ""
            if allowed is not None and normalize_dist(dist) not in allowed:
                log.info("plugin %r from %r not loaded: not in ROOST_LOAD_PLUGINS",
                         ep.name, dist)
                continue
            try:
                plugin = ep.load()
                host.register(plugin, ep.name, PluginInfo(ep.name, dist, _version(dist)))
            except Exception as exc:
                host.errors[ep.name] = f"load failed: {type(exc).__name__}: {exc}"
                log.error("plugin %r from %r failed to load", ep.name, dist, exc_info=exc)
    _check(host)
    return host


def _check(host: PluginHost) -> None:
    """Unregister plugins that implement hooks no spec defines.

    ``pm.register`` already validated implementations of known hooks (a bad
    one raised inside the entry-point loop above); this catches typos such as
    ``roost_tool`` that would otherwise be silently ignored.
    """
    while True:
        try:
            host.pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = host.pm.get_name(exc.plugin) or repr(exc.plugin)
            host.errors[name] = f"invalid: {exc}"
            log.error("plugin %r was not loaded: %s", name, exc)
            host.pm.unregister(exc.plugin)


@functools.cache
def _roost_version() -> str:
    """The installed Roost's version, read once per process (a lookup parses the
    distribution's whole METADATA, the README included)."""
    return _version("roost")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist) if dist else ""
    except importlib.metadata.PackageNotFoundError:
        return ""


# -- the typed hook calls -----------------------------------------------------------

hooks_log = logging.getLogger("roost.pluginhost.hooks")
"""The typed hook calls' log: what a plugin returned that its hook does not take."""

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
    :class:`PluginHost`); the others still answer.
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
                hooks_log.error("plugin %r returned %s from %s, not a %s; ignored",
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

    async def roost_reaction(self, *, reaction: ReplyReaction, app: Runtime) -> None:
        """Tell plugins about a reaction on one of Roost's replies."""
        await self._call(hookspecs.roost_reaction, reaction=reaction, app=app)

    async def roost_status(self, *, context: CommandContext) -> Offers[str]:
        """Lines plugins add to ``/status``."""
        return await self._offers(hookspecs.roost_status, _instance(str), "str",
                                  context=context)


def _name(spec: Spec) -> str:
    name = getattr(spec, "__name__", "")
    if getattr(hookspecs, name, None) is not spec:
        raise ValueError(f"{spec!r} is not a hookspec of bot.contracts.hookspecs")
    return name
