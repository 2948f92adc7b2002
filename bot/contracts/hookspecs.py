"""Every hook a Roost plugin can implement, with its contract.

A plugin is a module or object with functions named after these specs and marked with
``hookimpl`` (``from roost import hookimpl``). Publish it under the ``roost`` entry-point
group of your package and Roost finds it on start; the built-in plugins use exactly these
hooks. Rules that hold for every hook are in the plugin guide (``docs/plugins.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from bot.contracts.settings import SettingsModel

if TYPE_CHECKING:
    from pydantic import BaseModel

    from bot.contracts.channel import ChannelSpec
    from bot.contracts.commands import Command, CommandContext
    from bot.contracts.events import RunEvent
    from bot.contracts.guard import GuardPattern, InputCheck
    from bot.contracts.health import HealthReport
    from bot.contracts.jobs import JobSpec
    from bot.contracts.judge import Judge
    from bot.contracts.llm import Sanitizer
    from bot.contracts.media import Transcriber
    from bot.contracts.messages import InboundMessage, ReplyReaction
    from bot.contracts.migrations import Migrations
    from bot.contracts.prompt import PromptContext, PromptSection
    from bot.contracts.providers import ProviderSpec
    from bot.contracts.runtime import Runtime
    from bot.contracts.search import SearchBackend
    from bot.contracts.services import Services
    from bot.contracts.tools import Tool

PROJECT_NAME = "roost"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def roost_tools(settings: SettingsModel, services: Services) -> list[Tool] | Tool | None:
    """Offer tools the model can call.

    * **Called:** once at startup, and again whenever a plugin is enabled or disabled, or a
      plugin whose tools changed calls `app.refresh_tools()` (keep it quick: return what you
      have, never wait for a remote server here).
    * **Arguments:** `settings`; `services` gives access to shared stores (sessions, errors,
      stored results, the scheduler) and to validated plugin configuration.
    * **Returns:** `Tool` objects. Tool names must be unique across plugins. `execute(context,
      args)` is async and returns text (or a `ToolResult`); raise `ToolError` for failures the
      model should read. Offer a tool only when what it depends on is configured. A tool that
      should be off unless an admin turns it on (the built-in `exec` runs shell commands) carries
      `meta={"opt_in": True}`: no tool profile offers it, not even `full`; an agent gets it only
      when its `allow` names it (`tools = { allow = ["exec"] }`) or its plugin's group.
      A `ToolResult(text, only_tools=frozenset({...}))` narrows the tools the rest of the run
      may call, never widening them (`load_skill` does so for a skill's `allowed-tools`).
      A tool's transient failures open its circuit breaker for every caller; a tool whose
      failures belong to one caller or target passes `breaker_key=lambda context, args: ...`
      (web_fetch: the user and the URL's host), and each key gets a breaker of its own.
      Guidance the model needs only with a tool goes on the tool, `Tool(..., prompt=guide)`:
      `async def guide(prompt)` returns `PromptSection`s (as `roost_prompt_sections` does) and
      is called once per run the tool is offered to, and only then.
    * **The context:** `ToolContext` says who runs the tool and where (`user_id`, `channel`,
      `chat_id`, `chat_type`, `thread_id`), the user's `workspace` and the `deadline`; its
      `send(OutboundMessage)` delivers a message to the chat at once, not after the run (the
      built-in `send_file` uploads a workspace file this way; it is `None` where no channel can be
      reached, and raises `MediaTooLarge` for a file over the platform's limit).

    ```python
    from roost import Tool, ToolError, check_keys, hookimpl, str_arg

    @hookimpl
    def roost_tools(settings, services):
        async def word_count(context, args):
            check_keys(args, required=("text",))
            text = str_arg(args, "text")
            if len(text) > 100_000:
                raise ToolError("text too long", code="TOO_LONG")
            return f"{len(text.split())} words"

        return Tool("word_count", "Count the words of a text exactly.",
                    {"type": "object", "properties": {"text": {"type": "string"}},
                     "required": ["text"]},
                    word_count, timeout=5.0)
    ```
    """


@hookspec
def roost_output_sanitizers(settings: SettingsModel) -> list[Sanitizer] | Sanitizer | None:
    r"""Offer transforms applied to every final reply before it is delivered.

    * **Called:** once at startup (and when plugins are enabled or disabled).
    * **Arguments:** `settings`.
    * **Returns:** `Sanitizer(name, func, order, needs="")` objects. `func(text) -> text` is
      applied to every final reply (and to streamed drafts) by ascending `order`; the built-ins
      use 100..700, so 650 runs after thinking tags and tool-call debris are gone. With `needs`
      (e.g. `"<"`), `func` gets only text containing one of those characters. The result is
      trimmed afterwards, and sanitizing happens before the `NO_REPLY` check, so returning `""`
      makes a reply silent. Sanitizers must never raise and should run in linear time.

    ```python
    import re
    from roost import hookimpl, Sanitizer

    _KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")

    @hookimpl
    def roost_output_sanitizers(settings):
        return Sanitizer("redact_api_keys", lambda text: _KEY.sub("[redacted key]", text), 650)
    ```
    """


@hookspec
def roost_guard_patterns(settings: SettingsModel) -> list[GuardPattern] | GuardPattern | None:
    r"""Offer regular expressions that flag prompt-injection attempts.

    * **Called:** once at startup (and when plugins are enabled or disabled); the patterns are
      compiled once (case-insensitive) and a pattern that does not compile is logged and skipped.
    * **Arguments:** `settings`.
    * **Returns:** `GuardPattern(name, pattern, description)` objects, matched against every user
      message. What a match does depends on `guard_mode` (per channel: `guard_modes`): `off`, `log`,
      `warn` (default) or `block` (the user gets a refusal and the model never sees the message).

    ```python
    from roost import GuardPattern, hookimpl

    @hookimpl
    def roost_guard_patterns(settings):
        return GuardPattern("developer_mode",
                            r"\b(enable|activate|enter)\s+(the\s+)?developer\s+mode\b",
                            "asks the model to switch into a 'developer mode' without rules")
    ```
    """


@hookspec
def roost_check_input(
    message: InboundMessage, text: str, settings: SettingsModel
) -> InputCheck | None:
    """Inspect (and optionally rewrite or refuse) a user message before a run.

    * **Called:** for every message that starts a run, after the guard and length limit, in plugin
      order. Each implementation sees `text` as rewritten by the ones before it.
    * **Arguments:** `message` (the original `InboundMessage`), `text` (the current text),
      `settings`.
    * **Returns:** `None` to let the message pass unchanged, or `InputCheck(text=..., note=...,
      refusal=...)`: `text` replaces the message text, `note` is appended to what the model sees,
      `refusal` stops the run and is sent to the user instead.

    ```python
    from roost import hookimpl, InputCheck

    @hookimpl
    def roost_check_input(message, text):
        if "password" in text.lower():
            return InputCheck(refusal="Please don't send passwords here.")
        return None
    ```
    """


@hookspec
def roost_commands(settings: SettingsModel) -> list[Command] | Command | None:
    """Offer slash commands (``/name args``) that work on every channel.

    * **Called:** once at startup (and when plugins are enabled or disabled).
    * **Arguments:** `settings`.
    * **Returns:** `Command(name, description, handler, admin_only=False, aliases=(), usage="")`.
      `/name args` works on every channel and bypasses the model and the run queue. The async
      `handler(ctx)` gets a `CommandContext` (`app`, `message`, `name`, `args`, `is_admin`,
      `session_key`) and returns the reply text (or `None` for none). With `admin_only=True` Roost
      refuses everyone not in `ROOST_ADMINS` before the handler runs.

    ```python
    from roost import Command, hookimpl

    async def hello(ctx):
        return f"Hello, {ctx.args.strip() or ctx.message.display_name}!"

    @hookimpl
    def roost_commands(settings):
        return Command("hello", "say hello", hello, usage="[name]")
    ```
    """


@hookspec
def roost_channels(settings: SettingsModel) -> list[ChannelSpec] | ChannelSpec | None:
    """Offer channel adapters (a chat platform, a console, a webhook...).

    * **Called:** once at startup (a change needs a restart).
    * **Arguments:** `settings`.
    * **Returns:** `ChannelSpec(name, configured, create)` objects. `roost run` starts every channel
      whose `configured(settings)` is true; `create(settings)` builds the
      `roost.Channel` adapter. Import the platform SDK inside `create` only, so an
      unconfigured channel costs no memory or start time.

    ```python
    from roost import ChannelSpec, hookimpl

    def _create(settings):
        from my_package.matrix import MatrixChannel   # the SDK is imported here, not above
        return MatrixChannel(settings.plugins["matrix"])

    @hookimpl
    def roost_channels(settings):
        return ChannelSpec("matrix", lambda s: "matrix" in s.plugins, _create)
    ```

    An adapter tells `/readyz` whether it is connected by overriding `health()`; the default
    says ready. Report not ready until the first connection, and from the first failed poll or
    dropped connection until the next success, with a few words on what fails (they appear after
    the channel's name, so never put a credential in them):

    ```python
    from roost import Channel, ChannelHealth

    class MatrixChannel(Channel):
        def health(self) -> ChannelHealth:
            if not self.synced:
                return ChannelHealth(False, "sync failing (502)")
            return ChannelHealth(True)
    ```
    """


@hookspec
def roost_providers(settings: SettingsModel) -> list[ProviderSpec] | ProviderSpec | None:
    """Offer LLM providers, chosen by name with the ``provider`` setting.

    * **Called:** once at startup, to find the provider named by the `provider` setting (a change
      needs a restart).
    * **Arguments:** `settings`.
    * **Returns:** `ProviderSpec(name, create, missing)` objects. `missing(settings)` returns `None`
      when the provider can run, or one sentence naming exactly what to set — `roost run` prints it
      and exits 2. `create(settings)` builds the `bot.contracts.llm.LLMProvider` and is where its
      SDK is imported.
    * **A provider sends** `request.system`, `request.tools` and `request.messages`, then
      `request.note` (the time, the tool execution summary: context for this request only) after
      them, e.g. appended to the final message. Everything before the note is a byte-identical
      prefix of the chat's next request, which prompt caches rely on; report cached input in
      `Usage.cache_read_tokens` / `cache_write_tokens`, as parts of `input_tokens`. A request with
      `cache=False` is a one-off: mark nothing for the cache.

    ```python
    from roost import hookimpl, ProviderSpec

    def _create(settings):
        from my_package.llm import MyProvider
        return MyProvider(settings.model)

    @hookimpl
    def roost_providers(settings):
        return ProviderSpec("mine", _create,
                            lambda s: None if s.plugins.get("mine") else "set [plugins.mine] key")
    ```
    """


@hookspec
def roost_prompt_sections(prompt: PromptContext) -> list[PromptSection] | PromptSection | None:
    r"""Contribute sections to the system prompt of a run.

    * **Called:** once per run, while its system prompt is assembled.
    * **Arguments:** `prompt`, a `PromptContext`: `message`, `session_key`, `workspace`,
      `tool_names`, `model`, `provider`, `agent`, `agent_dir`, `mode` and `extra_context`.
      `agent_dir` is the agent's persona directory for a `predefined` agent (read SOUL.md and the
      like from there) and `None` for an `open` one (they are in `workspace`). `mode` is `"full"`
      for normal runs and `"minimal"` for background runs (memory flush, cron, heartbeat): return
      fewer sections (usually none) there.
    * **Returns:** `PromptSection(name, text, order)` objects, joined by ascending `order`
      (`bot.contracts.prompt.Order` lists the built-in positions; the default is
      `Order.PLUGIN_DEFAULT`). Empty sections are dropped. The system prompt is read from the
      provider's prompt cache while it stays byte-identical from one turn of a chat to the next:
      text that changes between turns (a clock, the latest sender, something matched to this
      message) must be `PromptSection(name, text, order, volatile=True)`, which is read after the
      conversation (in the request's `note`) instead of breaking the cached prefix.
      Text that only makes sense with one of your tools is better carried by the tool
      (`Tool(..., prompt=...)`, see `roost_tools`): it is asked for only in runs offering it.

    ```python
    from roost import hookimpl, PromptSection

    @hookimpl
    def roost_prompt_sections(prompt):
        if prompt.mode != "full" or "word_count" not in prompt.tool_names:
            return None
        return PromptSection("word_count_hint",
                             "## Counting words\nCall `word_count` instead of counting yourself.")
    ```
    """


@hookspec
def roost_judges(settings: SettingsModel) -> list[Judge] | Judge | None:
    """Offer judges that agents can use to score their replies (self-correction).

    * **Called:** at startup, and again when plugins are enabled or disabled.
    * **Arguments:** `settings`.
    * **Returns:** judge objects: a `name`, a `weight` (used by the `weighted` strategy) and
      `async score(request_text, reply, criteria=None)` returning `bot.agents.judge.Verdict(score,
      reasons)` with `score` in `[0, 1]`. An agent uses a judge by naming it as the `type` of one
      of its judges: `judges = [{type = "no_links"}]` under `[agents.<name>.judge]`, where
      `criteria` is the agent's criteria text. Judges of one reply run concurrently and are
      cancelled with the run (`/stop`). If a judge raises, the error is logged and counted, and the
      reply goes out unjudged. So score a bad reply low instead of raising. Each verdict lands in
      the run's trace.

    ```python
    import re
    from roost import hookimpl, Verdict

    class NoLinks:
        name = "no_links"
        weight = 1.0

        async def score(self, request_text, reply, criteria=None):
            if re.search(r"https?://", reply):
                return Verdict(0.0, "the reply contains a link; support replies must not")
            return Verdict(1.0, "no links")

    @hookimpl
    def roost_judges(settings):
        return NoLinks()
    ```
    """


@hookspec
def roost_scheduled_jobs(settings: SettingsModel) -> list[JobSpec] | JobSpec | None:
    """Offer jobs the scheduler runs on a schedule.

    * **Called:** at startup after `roost_startup`, and again when plugins are enabled or disabled.
    * **Arguments:** `settings`.
    * **Returns:** `JobSpec(name, schedule, func)` objects; names must be unique. `schedule` is a
      5-field cron expression (in the `timezone` setting) or `every <N>s|m|h|d`. `await func(app)`
      runs at each fire time in the service's event loop, so it must not block (use
      `asyncio.to_thread` for blocking work). Fire times survive restarts; a job missed while the
      service was down runs at startup; a failing job is logged.

    ```python
    import logging
    from roost import hookimpl, JobSpec

    async def log_stats(app):
        logging.getLogger("my_plugin").info("%d tools loaded", len(app.snapshot.tools))

    @hookimpl
    def roost_scheduled_jobs(settings):
        return JobSpec("example-stats", "every 1h", log_stats)
    ```
    """


@hookspec
def roost_run_event(event: RunEvent) -> None:
    """Observe a run: called for every :class:`bot.contracts.events.RunEvent`.

    * **Called:** for every event of every run, and the run waits for the observers — keep it quick
      (`chunk` events arrive for every streamed fragment).
    * **Arguments:** `event`, a `RunEvent` with `type`, `run_id`, `session_key`, `payload` and `ts`.
      Types: `run.started`, `activity`, `chunk`, `tool.call`, `tool.result`, `block.reply`,
      `run.retrying` and exactly one of `run.completed`, `run.failed` or `run.cancelled`; the
      `RunEvent` docstring lists each payload.
    * **Returns:** nothing (ignored).

    ```python
    from roost import hookimpl

    @hookimpl
    def roost_run_event(event):
        if event.type == "tool.call":
            print(f"{event.session_key} called {event.payload['name']}")
    ```
    """


@hookspec
def roost_plugin_config_model() -> type[BaseModel] | None:
    """Declare the schema of this plugin's ``[plugins.<name>]`` table in roost.toml.

    * **Called:** once at startup, synchronously (write a plain `def`), for each plugin.
    * **Arguments:** none.
    * **Returns:** a pydantic model class (not an instance) describing the plugin's
      `[plugins.<name>]` table in roost.toml, where `<name>` is the entry-point name (the module
      path for built-ins). Roost validates the table (an empty one when absent) and makes the result
      available as `services.plugin_config("<name>")` (in `roost_tools`) and
      `app.plugin_config("<name>")` (e.g. `ctx.app` in a command). Invalid configuration disables
      just this plugin, with a log line and an entry in `roost plugins list` naming the bad keys;
      the service still starts (a built-in plugin's bad table stops the start instead, like a
      bad core setting). `roost config show` prints the validated table, defaults included.
      Use `extra="forbid"` so typos are errors.

    ```python
    from roost import hookimpl

    from pydantic import BaseModel, ConfigDict

    class ExampleConfig(BaseModel):
        model_config = ConfigDict(extra="forbid")
        greeting: str = "Hello"

    @hookimpl
    def roost_plugin_config_model():
        return ExampleConfig
    ```

    ```toml
    # roost.toml
    [plugins.roost-plugin-example]
    greeting = "Ahoy"
    ```
    """


@hookspec
def roost_transcriber(settings: SettingsModel) -> Transcriber | None:
    """Offer speech to text for voice notes and audio files.

    * **Called:** when a message brings an audio file (a voice note, or any file whose bytes are
      audio), once per message; Roost uses the first transcriber offered.
    * **Arguments:** `settings`, to see whether your transcriber is configured.
    * **Returns:** a `Transcriber` (any object with a `name` and
      `async transcribe(data, mime_type, name) -> str`) when it can work, else `None`. The
      transcript reaches the model as `[voice 0:12] <transcript>`, and the audio file stays in
      the sender's `inbox/`. Raise `MediaError("one line for the user")` when transcribing
      fails: the user is told, and the rest of the message is still answered. Without any
      transcriber, the user is told that voice is not set up. The built-in one
      (a `base_url` in its table, or local faster-whisper from `.[voice]`) is an example.

    ```python
    from roost import MediaError, hookimpl

    class Echo:
        name = "echo"

        async def transcribe(self, data, mime_type, name):
            if not data:
                raise MediaError("the recording is empty")
            return f"({len(data)} bytes of {mime_type})"

    @hookimpl
    def roost_transcriber(settings):
        return Echo()
    ```
    """


@hookspec
def roost_search_backends(settings: SettingsModel) -> list[SearchBackend] | SearchBackend | None:
    """Offer web search engines for the ``web_search`` tool.

    * **Called:** when tools are collected (at startup and when plugins are enabled or disabled),
      just before `roost_tools`.
    * **Arguments:** `settings`.
    * **Returns:** `SearchBackend` objects for the `web_search` tool, only those that are configured
      (their URL or key set). A backend has a `name` and `async search(query, count)` returning at
      most `count` `SearchResult(title, url, snippet)`, best first; it raises `ToolError` for
      failures the model should read (`retryable=True` for timeouts, rate limits and 5xx) and never
      puts its key in a message. `web_search` uses the backend named by the `search_backend`
      setting, else the first offered (the built-ins `searxng`, `brave` and `tavily` come from
      `plugins/web`); with none offered, `web_search` is not offered at all.

    ```python
    import httpx
    from roost import SearchResult, ToolError, hookimpl

    class Kagi:
        name = "kagi"

        def __init__(self, key):
            self.key = key

        async def search(self, query, count):
            async with httpx.AsyncClient(timeout=15) as client:
                answer = await client.get("https://kagi.com/api/v0/search",
                                          params={"q": query, "limit": count},
                                          headers={"Authorization": f"Bot {self.key}"})
            if answer.status_code != 200:
                raise ToolError(f"Kagi answered {answer.status_code}",
                                retryable=answer.status_code >= 500)
            return [SearchResult(r["title"], r["url"], r.get("snippet", ""))
                    for r in answer.json()["data"] if r.get("t") == 0][:count]

    @hookimpl
    def roost_search_backends(settings):
        key = settings.plugins.get("kagi", {}).get("key")
        return Kagi(key) if key else None
    ```
    """


@hookspec
def roost_migrations() -> list[Migrations] | Migrations | None:
    """Declare the tables this plugin keeps in Roost's database.

    * **Called:** once at startup, right after the database opens, for every registered plugin
      (disabled ones too, so their tables are ready when they are enabled again).
    * **Arguments:** none.
    * **Returns:** `Migrations(name, steps)`: the tables your plugin keeps in Roost's database.
      `name` is your schema's name (pick one unique to your plugin); `steps` are SQL scripts or
      `async def step(db)` functions given the connection. Roost runs the steps not yet recorded
      for `name` in the `plugin_schema` table, in order, each in one transaction together with its
      record; a failing step rolls back, its plugin is disabled and the step is tried again at the
      next start. Append steps; never change a released one.
    * Name your tables after your plugin and use only them: Roost's own tables (`sessions`,
      `messages`, ...) are its implementation; read them through `app.store` / `services`. At run
      time the connection is `services.sessions.db` and every statement on it is made under
      `services.sessions.lock`; write several statements atomically with
      `await transaction(db, lock, body)` (`body(db)` runs inside `BEGIN IMMEDIATE` … `COMMIT`; do
      not take the lock yourself there).
    * **Both backends.** Roost runs on SQLite or, with `ROOST_DATABASE_URL=postgresql://…`, on
      PostgreSQL; the connection has the same API on both (`execute`, `executemany`,
      `execute_fetchall`, cursors with `fetchone`/`fetchall`/`rowcount`/`lastrowid`) and
      `db.dialect == "postgresql"` on PostgreSQL (no such attribute on SQLite). Write SQL once with
      `?` placeholders; on PostgreSQL they become `$1`, `$2`…, `INSERT OR IGNORE`/`INSERT OR
      REPLACE` become `ON CONFLICT` clauses and an `INSERT` returns the new id as `lastrowid`.
      A step given as plain text is SQLite DDL and is translated for PostgreSQL (`INTEGER` →
      `BIGINT`, `REAL` → `DOUBLE PRECISION`, `BLOB` → `BYTEA`, `INTEGER PRIMARY KEY` → an identity
      column); where the dialects really differ (full-text search, JSON functions, `COLLATE`), give
      the step as a mapping `{"sqlite": "...", "postgresql": "..."}`. A step with no text for the
      backend in use fails (and disables the plugin) rather than guess. Several replicas starting
      together apply each step once (PostgreSQL: under an advisory lock).

    ```python
    from roost import Migrations, hookimpl

    @hookimpl
    def roost_migrations():
        return Migrations("bookmarks", [
            "CREATE TABLE bookmarks_items (id INTEGER PRIMARY KEY, user TEXT, url TEXT);",
            "CREATE INDEX bookmarks_user ON bookmarks_items(user);",  # added in a later release
            {   # the dialects differ here: one text for each
                "sqlite": "CREATE INDEX bookmarks_url ON bookmarks_items(url COLLATE NOCASE);",
                "postgresql": "CREATE INDEX bookmarks_url ON bookmarks_items(lower(url));",
            },
        ])
    ```
    """


@hookspec
def roost_startup(app: Runtime) -> None:
    """Called once when the service has started, before channels connect.

    * **Called:** once when the service has started (plugins loaded, database open, engine built),
      before the scheduler starts and before channels connect.
    * **Arguments:** `app`, the service's
      [`Runtime`](../plugins.md#the-runtime-what-a-plugin-can-do-with-the-running-service)
      (`app.settings`, `app.services`, `app.deliver(...)`, `app.plugin_config(name)`...).
    * **Returns:** nothing. Use it to open connections or start background work with
      `app.background(coro, "what it is")`, which shutdown cancels.

    ```python
    from roost import hookimpl

    @hookimpl
    async def roost_startup(app):
        app.background(poll_feed(app), "polling the feed")
    ```
    """


@hookspec
def roost_health(app: Runtime) -> list[HealthReport] | HealthReport | None:
    """Report the health of parts this plugin vouches for (a sandbox, a connection).

    * **Called:** on every `/readyz` request and every `/status` command.
    * **Arguments:** `app`, the service's `Runtime`.
    * **Returns:** `roost.HealthReport(part, ready, detail)` for each part the plugin vouches
      for, or `None`. A report that is not `ready` makes `/readyz` answer 503 with the line
      `part: detail`; `/status` shows every report. Return the latest known state at once: run
      the checks themselves in the background (from `roost_startup`), never in this hook. The
      `exec` tool reports its sandbox's canary this way.

    ```python
    from roost import HealthReport, hookimpl

    class Feed:
        failing_since: str | None = None

    feed = Feed()

    @hookimpl
    def roost_health(app):
        if feed.failing_since is not None:
            return HealthReport("feed", False, f"unreachable since {feed.failing_since}")
        return HealthReport("feed", True, "polling")
    ```
    """


@hookspec
def roost_shutdown(app: Runtime) -> None:
    """Called once on shutdown, after runs are cancelled and channels stopped.

    * **Called:** once on shutdown, after runs are cancelled and channels stopped, before the
      provider and the database are closed.
    * **Arguments:** `app`, the `Runtime` of the service that is stopping.
    * **Returns:** nothing. Close what `roost_startup` opened.

    ```python
    from roost import hookimpl

    @hookimpl
    async def roost_shutdown(app):
        await my_client.aclose()
    ```
    """



@hookspec
def roost_reaction(reaction: ReplyReaction, app: Runtime) -> None:
    """Someone added or removed a reaction on one of Roost's replies.

    * **Called:** once per reaction added or removed, on a channel that hands reactions in
      (Telegram, Discord, Slack), on whichever replica received it; a platform that delivers
      again (after a restart) may call it twice for one reaction, so store idempotently.
    * **Arguments:** `reaction.event` is the `ReactionEvent` (`user_id`, `user_name`, `emoji`:
      the Unicode emoji, `name:id` for a Discord custom one and `:name:` for a Slack one,
      `added`: `True` when added, `False` when removed, `channel`, `chat_id`, `message_id`);
      `reaction.run_id` is the run whose reply it is and `reaction.session_key` its conversation;
      `app` is the service's `Runtime`.
    * **Not called** for the bot's own reactions, nor for reactions on messages that are not
      Roost's replies (a person's message, an approval prompt, a notice): Roost knows no run
      for those. A reply sent as several messages is known by its last one.
    * **Returns:** nothing. A failure is logged and never reaches the platform. The built-in
      `feedback` plugin records 👍/👎 this way.

    ```python
    from roost import hookimpl

    @hookimpl
    def roost_reaction(reaction, app):
        if reaction.event.added and reaction.event.emoji == "🔥":
            print(f"{reaction.event.user_name} liked run {reaction.run_id}")
    ```
    """


@hookspec
def roost_status(context: CommandContext) -> list[str] | str | None:
    """Add lines to the `/status` answer.

    * **Called:** on every `/status` command, after Roost's own lines.
    * **Arguments:** `context`, the command's `CommandContext` (`context.is_admin`,
      `context.session_key`, `context.app`).
    * **Returns:** lines of text (or `None`). Show what only admins may see only when
      `context.is_admin`.

    ```python
    from roost import hookimpl

    @hookimpl
    def roost_status(context):
        return "Feed: polling" if context.is_admin else None
    ```
    """
