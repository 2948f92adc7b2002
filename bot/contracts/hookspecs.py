"""Every hook a Roost plugin can implement.

A plugin is a module or object with functions named after these specs and
marked with :data:`hookimpl`::

    from bot.contracts.hookspecs import hookimpl
    from bot.contracts.tools import Tool

    @hookimpl
    def roost_tools(settings):
        return [Tool("echo", "Repeat the input.", {...}, execute=echo)]

Publish it under the ``roost`` entry-point group of your package and Roost
finds it on start. Built-in plugins (``plugins/``) use exactly these hooks.

Rules that hold for every hook:

* An implementation may take any subset of the documented arguments, by name.
* An implementation may be ``async def``; Roost awaits it.
* Every hook is called on all implementations (no first-result hooks), in
  pluggy's order (``tryfirst``/``trylast`` respected). Hooks that return
  things collect them; a hook may return one item, a list of them, or ``None``.
* An implementation that raises is logged with the plugin's name and skipped
  for that call; the others still run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from pydantic import BaseModel

    from bot.config.settings import Settings
    from bot.contracts.channel import ChannelSpec
    from bot.contracts.commands import Command
    from bot.contracts.events import RunEvent
    from bot.contracts.guard import GuardPattern, InputCheck
    from bot.contracts.health import HealthReport
    from bot.contracts.jobs import JobSpec
    from bot.contracts.judge import Judge
    from bot.contracts.media import Transcriber
    from bot.contracts.messages import InboundMessage
    from bot.contracts.migrations import Migrations
    from bot.contracts.prompt import PromptContext, PromptSection
    from bot.contracts.providers import ProviderSpec
    from bot.contracts.runtime import Runtime
    from bot.contracts.sanitize import Sanitizer
    from bot.contracts.search import SearchBackend
    from bot.contracts.services import Services
    from bot.contracts.tools import Tool

PROJECT_NAME = "roost"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def roost_tools(settings: Settings, services: Services) -> list[Tool] | Tool | None:
    """Offer tools the model can call.

    Called once at startup (and again when plugins are enabled or disabled, or
    when a plugin whose tools changed calls ``Runtime.refresh_tools``).
    Return :class:`bot.contracts.tools.Tool` objects. Tool names must be unique across
    plugins; a later duplicate is refused with a log line naming it.
    ``services`` (:class:`bot.contracts.services.Services`) gives access to shared
    stores; offer a tool only when what it depends on is configured.
    """


@hookspec
def roost_output_sanitizers(settings: Settings) -> list[Sanitizer] | Sanitizer | None:
    """Offer transforms applied to every final reply before it is delivered.

    Return :class:`bot.contracts.sanitize.Sanitizer` objects; they run by ascending
    ``order`` (built-ins use 100..700), then the result is trimmed. Sanitizing
    happens before the ``NO_REPLY`` check, so a sanitizer can make a reply
    silent.
    """


@hookspec
def roost_guard_patterns(settings: Settings) -> list[GuardPattern] | GuardPattern | None:
    """Offer regular expressions that flag prompt-injection attempts.

    Return :class:`bot.engine.guard.GuardPattern` objects. They are compiled once at
    startup and matched against every user message by the input guard.
    """


@hookspec
def roost_check_input(
    message: InboundMessage, text: str, settings: Settings
) -> InputCheck | None:
    """Inspect (and optionally rewrite or refuse) a user message before a run.

    Called for every message that starts a run, in plugin order; each sees the
    text as rewritten by the ones before. Return :class:`bot.engine.guard.InputCheck`
    to change the text, add a note for the model, or refuse the run; return
    ``None`` to let it pass unchanged.
    """


@hookspec
def roost_commands(settings: Settings) -> list[Command] | Command | None:
    """Offer slash commands (``/name args``) that work on every channel.

    Return :class:`bot.contracts.commands.Command` objects. Commands bypass the model and
    the run queue. Mark ``admin_only=True`` for commands only ``ROOST_ADMINS``
    may use; Roost refuses everybody else before your handler runs.
    """


@hookspec
def roost_channels(settings: Settings) -> list[ChannelSpec] | ChannelSpec | None:
    """Offer channel adapters (a chat platform, a console, a webhook...).

    Return :class:`bot.contracts.channel.ChannelSpec` objects. ``roost run`` starts every
    channel whose ``configured(settings)`` is true. Import your platform SDK in
    ``create`` only, so an unconfigured channel costs no memory or start time.
    """


@hookspec
def roost_providers(settings: Settings) -> list[ProviderSpec] | ProviderSpec | None:
    """Offer LLM providers, chosen by name with the ``provider`` setting.

    Return :class:`bot.contracts.providers.ProviderSpec` objects. ``missing(settings)``
    must name exactly what to set when the provider cannot run, because
    ``roost run`` prints it and exits 2.
    """


@hookspec
def roost_prompt_sections(prompt: PromptContext) -> list[PromptSection] | PromptSection | None:
    """Contribute sections to the system prompt of a run.

    Called once per run. ``prompt.mode`` is ``"full"`` for normal runs and
    ``"minimal"`` for background runs (memory flush, cron); return fewer
    sections there. Sections are joined by ascending ``order``.
    """


@hookspec
def roost_judges(settings: Settings) -> list[Judge] | Judge | None:
    """Offer judges that agents can use to score their replies (self-correction).

    Return objects with ``name`` (str), ``weight`` (float, for the
    ``weighted`` strategy) and ``async score(request_text, reply,
    criteria=None)`` returning a :class:`bot.agents.judge.Verdict` with a score in
    ``[0, 1]`` and reasons. An agent uses one by naming it as a judge's
    ``type`` in ``[agents.<name>.judge]`` (``judges = [{type = "<name>"}]``).
    ``criteria`` is the agent's criteria text. Judges run concurrently with
    the agent's other judges and are cancelled with the run (``/stop``). An
    exception is logged and counted and the reply goes out unjudged, so
    return a low score for a bad reply instead of raising.
    """


@hookspec
def roost_scheduled_jobs(settings: Settings) -> list[JobSpec] | JobSpec | None:
    """Offer jobs the scheduler runs on a schedule.

    Return :class:`bot.contracts.jobs.JobSpec` objects; names must be unique. Jobs run in
    the service's event loop and must not block it.
    """


@hookspec
def roost_run_event(event: RunEvent) -> None:
    """Observe a run: called for every :class:`bot.contracts.events.RunEvent`.

    Observers see ``run.started``, ``activity``, ``chunk``, ``tool.call``,
    ``tool.result``, ``block.reply``, ``run.retrying`` and exactly one of
    ``run.completed``, ``run.failed`` or ``run.cancelled``. Return value is
    ignored. Keep it quick: ``chunk`` events arrive for every streamed
    fragment, and the run waits for observers.
    """


@hookspec
def roost_plugin_config_model() -> type[BaseModel] | None:
    """Declare the schema of this plugin's ``[plugins.<name>]`` table in roost.toml.

    Return a pydantic model class (not an instance). At startup Roost
    validates ``settings.plugins[<plugin name>]`` (an empty table when absent)
    against it; the validated object is then available as
    ``services.plugin_config("<name>")`` (in ``roost_tools``) and
    ``app.plugin_config("<name>")``. Invalid configuration disables just this
    plugin, with a log line and an entry in ``roost plugins list`` naming the
    bad keys; the service still starts. ``<name>`` is the entry-point name
    (the module path for built-ins).
    """


@hookspec
def roost_transcriber(settings: Settings) -> Transcriber | None:
    """Offer speech to text for voice notes and audio files.

    Return a :class:`bot.contracts.media.Transcriber` when it is configured
    (its endpoint or model is set), else ``None``. Roost uses the first one
    offered; without any, a voice note gets a one-line reply saying voice is not
    set up (and the file is still stored in the user's ``inbox/``).
    """


@hookspec
def roost_search_backends(settings: Settings) -> list[SearchBackend] | SearchBackend | None:
    """Offer web search engines for the ``web_search`` tool.

    Return :class:`bot.contracts.search.SearchBackend` objects, only those that
    are configured (their URL or key is set). Called when tools are collected
    (at startup and when plugins are enabled or disabled), just before
    ``roost_tools``. ``web_search`` uses the backend named by the
    ``web_search_backend`` setting, else the first offered; with none,
    ``web_search`` is not offered at all.
    """


@hookspec
def roost_migrations() -> list[Migrations] | Migrations | None:
    """Declare the tables this plugin keeps in Roost's database.

    Return :class:`bot.contracts.migrations.Migrations`: a schema name and its
    ordered steps. At startup, right after the database opens and before
    anything else runs, Roost applies the steps not yet recorded under that
    name, each in one transaction with its record; for every registered
    plugin, disabled ones included. A plugin whose steps fail is disabled
    (the others run). Keep your data in your own tables: Roost's tables are
    its own and change without notice.
    """


@hookspec
def roost_startup(app: Runtime) -> None:
    """Called once when the service has started, before channels connect.

    ``app`` is the :class:`bot.contracts.runtime.Runtime`: keep it to deliver
    messages, queue scheduled turns or start background work later.
    """


@hookspec
def roost_health(app: Runtime) -> list[HealthReport] | HealthReport | None:
    """Report the health of parts this plugin vouches for (a sandbox, a connection).

    Called on every ``/readyz`` request and ``/status`` command: return the latest
    known state at once (run checks in the background, never here). A
    :class:`bot.contracts.health.HealthReport` that is not ``ready`` makes ``/readyz``
    answer 503 with its line.
    """


@hookspec
def roost_shutdown(app: Runtime) -> None:
    """Called once on shutdown, after runs are cancelled and channels stopped."""

