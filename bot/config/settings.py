"""Configuration: ``roost.toml`` overridden by the environment, validated once.

Precedence, highest first: explicit overrides (CLI flags) → environment
(``ROOST_*`` plus the SDKs' and platforms' own variables) → ``roost.toml`` →
defaults. A bad value fails at start with a message naming the key.
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from bot.config.agents import AgentConfig, Binding, check_bindings
from bot.config.budgets import BudgetConfig
from bot.config.masking import SECRET_MASK, find_mask, mask_tree, mask_urls
from bot.config.mcp import McpConfig
from bot.config.mcp import masked as _masked_mcp
from bot.config.moved import MovedEnv, relocate
from bot.config.sources import KnownNames, ListedEnv, TomlSource, toml_data

GuardMode = Literal["off", "log", "warn", "block"]
DmPolicy = Literal["pairing", "open", "allowlist", "disabled"]
GroupPolicy = Literal["mention", "all", "off"]


class SetupError(Exception):
    """Roost cannot start as configured; the message says exactly what to set."""


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key and the fix."""


def _env(name: str, field_name: str) -> Any:
    # The SDKs read these exact names, so Roost honours them too; the field
    # name keeps roost.toml readable.
    return AliasChoices(name, f"ROOST_{field_name.upper()}", field_name)


class Settings(BaseSettings):
    """Every setting the core reads. Field ``x`` is ``x`` in roost.toml, ``ROOST_X`` in the env.

    Built-in plugins' settings are in their ``[plugins.<name>]`` tables
    (:mod:`bot.config.moved` maps their old top-level names there)."""

    model_config = SettingsConfigDict(
        env_prefix="ROOST_", extra="forbid", case_sensitive=False, populate_by_name=True,
        # `.env` in the working directory (from `roost init`'s .env.example): below the
        # real environment, above roost.toml.
        env_file=".env", env_file_encoding="utf-8",
    )

    data_dir: Path = Path("./data")
    """Where the SQLite database (``roost.db``), the workspaces and local state live."""
    database_url: str = ""
    """``ROOST_DATABASE_URL``: ``sqlite:///path`` (relative; ``sqlite:////abs`` absolute)
    or ``postgresql://user:password@host:5432/db``. Empty: SQLite at ``data_dir/roost.db``.
    On PostgreSQL Roost creates no ``roost.db``."""
    database_pool_size: int = Field(10, ge=1)
    """PostgreSQL: at most this many connections per process."""
    database_connect_attempts: int = Field(6, ge=1)
    """PostgreSQL: how many times the first connection is tried while refused (waiting
    0.2 s, doubling, between tries) before the command gives up."""
    lease_seconds: float = Field(30.0, gt=0)
    """PostgreSQL replicas: how long a replica's claim on a session's work outlives it."""
    log_level: str = "INFO"
    """``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``; ``roost.<layer>`` loggers can be set apart."""
    log_format: Literal["text", "json"] = "text"
    """``json``: every log line one JSON object (ts, level, logger, message), for shippers."""
    plugins_dir: Path | None = None
    """Where ``roost plugins install`` puts plugins (``pip --target``), put on ``sys.path``
    at start: a directory on the data volume in a container (``/data/plugins``)."""
    bot_name: str = "Roost"
    """The name the bot answers to and introduces itself with."""
    console: bool = False
    """Also start the console channel under ``roost run`` (local debugging)."""

    provider: str = "anthropic"
    """The LLM provider: ``anthropic``, ``openai``, ``scripted`` or a plugin's."""
    model: str = "claude-sonnet-5-5"
    """The model name passed to the provider."""
    max_tokens: int = Field(4096, ge=1)
    """The most output tokens one model call may produce."""
    script: Path | None = None
    """The script file of the ``scripted`` provider (default: the demo script)."""

    max_iterations: int = Field(20, ge=1)
    """Model calls per run before the run stops."""
    run_timeout: float = Field(600.0, gt=0)
    """Seconds a whole run may take."""
    tool_timeout: float = Field(30.0, gt=0)
    """Per-tool timeout (a tool's own ``timeout`` wins)."""
    turn_timeout: float = Field(300.0, gt=0)
    """All tool calls of one model answer; unfinished ones are cancelled and skipped."""
    approval_timeout: float = Field(300.0, gt=0)
    """Seconds a tool call needing approval waits for a decision; then it is denied
    (per agent: ``[agents.<name>] approval_timeout``)."""
    approvers: Literal["requester", "admins", "anyone"] = "requester"
    """Who may approve a tool call in a group: ``requester`` (the person who asked, or an
    admin), ``admins`` (admins only) or ``anyone`` in the chat. In a DM: the person."""
    error_retention_days: int = Field(30, ge=1)
    """Stored errors, large tool results and answered inbox entries older than this are deleted."""
    trace_retention_days: int = Field(30, ge=1)
    """Runs' trace records (``runs`` and their ``spans``) older than this are deleted."""
    large_result_chars: int = Field(16_000, ge=1_000)
    """Tool results longer than this are stored; the model gets a preview and a reference."""
    group_max_concurrent: int = Field(3, ge=1)
    """Runs at once in one group chat (a direct chat has one)."""
    queue_cap: int = Field(10, ge=1)
    """Messages waiting per conversation; past it the oldest is dropped with a notice."""
    merge_window_ms: int = Field(800, ge=0)
    """A follow-up from the same sender within this window, before any output, restarts the run
    with both texts; 0 turns merging off."""
    edit_policy: Literal["correct", "ignore"] = "correct"
    """An edit of a message whose run already used a tool with side effects, or was
    answered: ``correct`` gives the model the new text as a correction of the earlier
    message; ``ignore`` drops it (per agent: ``[agents.<name>] edit_policy``). Edits
    before that always replace the text."""
    shutdown_grace_seconds: float = Field(8.0, ge=0)
    """On SIGTERM, how long runs in flight may finish before they are cancelled
    (they then run again after the next start); under Docker's 10 s."""
    inbox_max_attempts: int = Field(3, ge=1)
    """A message whose run was interrupted (the process died) this many times is
    given up with a notice instead of being run again."""
    catch_up_chats: int = Field(50, ge=0)
    """After a start, how many recently active chats a channel that cannot
    redeliver (Discord) reads back for messages missed while Roost was down."""
    catch_up_hours: float = Field(24.0, ge=0)
    """How far back a chat counts as recently active for the catch-up."""
    discord_catchup_limit: int = Field(100, ge=1)
    """At most this many missed messages are read back per Discord chat in one catch-up."""
    discord_shard_count: int = Field(1, ge=1, le=10_000)
    """Discord gateway shards (``ROOST_DISCORD_SHARD_COUNT``): guild ``g`` is received by
    shard ``(g >> 22) % count``, DMs by shard 0. With one process (SQLite) it runs them
    all (1: the one unsharded session, as before). On PostgreSQL each replica takes
    shards through advisory-lock leases (about ``count / replicas`` each; with 1, one
    replica receives) and another takes a dead replica's over within ``lease_seconds``;
    every replica sends."""
    discord_max_upload_mb: float = Field(10, gt=0)
    """The largest file Roost uploads to Discord (10 MB without server boosts; 25 or more
    with them); a larger one is refused with MediaTooLarge before anything is posted."""
    session_cache_size: int = Field(1000, ge=1)
    """Conversations whose history is kept in memory between runs."""

    # Media: files people send (bot/media) and voice transcription.
    media_max_file_mb: float = Field(20, gt=0)
    """A received file larger than this is refused with a reply naming it and the limit."""
    media_max_files: int = Field(10, ge=0)
    """Files accepted per message; the rest are refused with a reply."""
    media_max_total_mb: float = Field(50, gt=0)
    """All files of one message together; files past it are refused."""
    vision: bool = True
    """Whether the model takes images and PDFs; ``false`` sends a text note instead
    (per agent: ``[agents.<name>] vision``)."""
    max_history_messages: int = Field(200, ge=2)
    """Messages of history read for one run."""

    admins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``channel:user_id`` entries allowed to run admin commands
    (``ROOST_ADMINS=telegram:42,slack:U123``)."""

    # Input guard and limits.
    guard_mode: GuardMode = "warn"
    """The input guard: ``off``, ``log``, ``warn`` (logged only) or ``block`` (refused with a
    reply)."""
    guard_modes: dict[str, GuardMode] = Field(default_factory=dict)
    """Per-channel overrides of ``guard_mode``, e.g. ``{telegram = "block"}``."""
    max_message_chars: int = Field(32_768, ge=1)
    """Longer messages are shortened (the model is told so), never rejected."""

    # Context window, history pipeline and compaction.
    context_window: int = Field(200_000, ge=1_000)
    """Tokens one request may hold, output reserve included."""
    output_reserve: int = Field(8_192, ge=256)
    """Tokens of the window kept free for the answer."""
    history_turns: int = Field(40, ge=1)
    """User turns (with their assistant and tool messages) sent to the model."""
    prune_soft_ratio: float = Field(0.3, gt=0, le=1)
    """Share of the window from which old tool results are trimmed."""
    prune_hard_ratio: float = Field(0.5, gt=0, le=1)
    """Share of the window from which old tool results are cleared."""
    compact_ratio: float = Field(0.75, gt=0, le=1)
    """Share of the window that triggers mid-loop and post-run compaction."""
    compact_min_messages: int = Field(50, ge=5)
    """Messages a conversation needs before it is compacted."""
    compact_keep_messages: int = Field(4, ge=1)
    """Most recent messages compaction keeps verbatim."""
    compaction: bool = True
    """Summarize old history when the window fills (mid-run and after a run)."""
    memory_flush: bool = True
    """Before compacting, let the agent save durable notes to ``memory/YYYY-MM-DD.md``."""

    # Traces.
    trace_verbose: bool = False
    """Also store each LLM call's input (truncated at 50,000 chars)."""

    # Health, readiness and metrics (bot/app/http.py), served by `roost run`.
    http_host: str = "127.0.0.1"
    """Address the HTTP server binds (0.0.0.0 in a container); `roost status` asks it."""
    http_port: int | None = Field(None, ge=0, le=65535)
    """Port of /healthz, /readyz and /metrics; unset or 0 turns the server off."""

    http_header_timeout: float = Field(10.0, gt=0)
    """Seconds a client has to send a request's headers (after connecting or its last answer)."""
    http_body_timeout: float = Field(30.0, gt=0)
    """Seconds a client has to send a request's body."""
    http_max_connections: int = Field(0, ge=0)
    """Connections at once per listener; 0: a quarter of the open-file limit (32 to 4,096)."""
    http_max_per_address: int = Field(64, ge=0)
    """Connections at once from one address per listener; 0: no cap (behind a proxy)."""
    http_max_body: int = Field(1 << 20, ge=1)
    """Largest request body a webhook route takes (GET routes take none); larger: 413."""
    ui_trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Control UI (``/ui``): addresses or networks of the reverse proxies whose
    ``X-Forwarded-Proto`` and ``X-Forwarded-For`` are believed (comma-separated in the env)."""

    @field_validator("http_port", mode="before")
    @classmethod
    def _empty_port_is_off(cls, value: Any) -> Any:
        # `ROOST_HTTP_PORT=` (an env file's blank line) means off, not a bad integer.
        return None if isinstance(value, str) and not value.strip() else value

    anthropic_api_key: SecretStr | None = Field(
        None, validation_alias=_env("ANTHROPIC_API_KEY", "anthropic_api_key")
    )
    """``ANTHROPIC_API_KEY``: the Anthropic API key."""
    anthropic_base_url: str | None = Field(
        None, validation_alias=_env("ANTHROPIC_BASE_URL", "anthropic_base_url")
    )
    """``ANTHROPIC_BASE_URL``: another Anthropic-compatible endpoint."""
    openai_api_key: SecretStr | None = Field(
        None, validation_alias=_env("OPENAI_API_KEY", "openai_api_key")
    )
    """``OPENAI_API_KEY``: the key of an OpenAI-compatible server."""
    openai_base_url: str | None = Field(
        None, validation_alias=_env("OPENAI_BASE_URL", "openai_base_url")
    )
    """``OPENAI_BASE_URL``: an OpenAI-compatible server (Ollama, vLLM, llama.cpp)."""
    telegram_bot_token: SecretStr | None = Field(
        None, validation_alias=_env("TELEGRAM_BOT_TOKEN", "telegram_bot_token")
    )
    """``TELEGRAM_BOT_TOKEN``: from @BotFather; starts the Telegram channel."""
    discord_bot_token: SecretStr | None = Field(
        None, validation_alias=_env("DISCORD_BOT_TOKEN", "discord_bot_token")
    )
    """``DISCORD_BOT_TOKEN``: starts the Discord channel."""
    slack_bot_token: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_BOT_TOKEN", "slack_bot_token")
    )
    """``SLACK_BOT_TOKEN``: the ``xoxb-`` token; starts Slack with a signing secret or an app
    token."""
    slack_signing_secret: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_SIGNING_SECRET", "slack_signing_secret")
    )
    """``SLACK_SIGNING_SECRET``: Events API over HTTP; requests with a bad signature get 401."""
    slack_app_token: SecretStr | None = Field(
        None, validation_alias=_env("SLACK_APP_TOKEN", "slack_app_token")
    )
    """``SLACK_APP_TOKEN``: the ``xapp-`` token for Socket Mode."""

    # Chat policies.
    dm_policy: DmPolicy = "pairing"
    """``pairing``: an unknown user who DMs the bot gets a code an admin approves
    (``/pair approve CODE``); ``open``: anyone; ``allowlist``: ``dm_allowlist`` only;
    ``disabled``: admins only."""
    dm_policies: dict[str, DmPolicy] = Field(default_factory=dict)
    """Per-channel DM policy, e.g. ``{telegram = "allowlist"}``."""
    dm_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``channel:user_id`` entries allowed to DM under the ``allowlist`` and ``pairing``
    policies (they skip pairing)."""
    pairing_code_ttl: float = Field(3600.0, gt=0)
    """Seconds a pairing code stays valid; a user who writes after that gets a new one."""
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    """``[budgets]``: token budgets and a request rate (bot/config/budgets.py)."""
    group_policy: GroupPolicy = "mention"
    """In groups: ``mention`` (answer when mentioned, replied to or given a command), ``all`` or
    ``off``."""
    group_policies: dict[str, GroupPolicy] = Field(default_factory=dict)
    """Per channel (``telegram``) or per group (``telegram:-100123``)."""
    group_context_messages: int = Field(50, ge=0)
    """Un-addressed group messages kept and handed to the next run as context."""
    group_context_tokens: int = Field(2_000, ge=0)
    """Tokens those messages may take in the next run: the newest whole ones that fit."""
    stream_replies: bool = True
    """Stream replies by editing one message at most once a second."""
    stream_channels: dict[str, bool] = Field(default_factory=dict)
    """Per-channel override of ``stream_replies``, e.g. ``{slack = false}``."""
    ack_reaction: str = Field("", max_length=64)
    """The bot's reaction on a person's message once Roost has stored it (``"👀"``);
    empty: no receipts at all."""
    done_reaction: str = Field("✅", max_length=64)
    """Replaces ``ack_reaction`` when the run answered (empty: the ack is removed)."""
    error_reaction: str = Field("⚠️", max_length=64)
    """Replaces ``ack_reaction`` when the run failed or was refused (empty: removed)."""

    # Platform endpoints (proxies, self-hosted Bot API servers, tests).
    telegram_api_base: str | None = Field(
        None, validation_alias=_env("TELEGRAM_API_BASE", "telegram_api_base"))
    """``TELEGRAM_API_BASE``: a self-hosted Bot API server."""
    telegram_webhook_url: str | None = None
    """Public HTTPS URL for webhook mode; long polling when unset."""
    telegram_webhook_secret: SecretStr | None = None
    """Checked on every webhook request (``X-Telegram-Bot-Api-Secret-Token``)."""
    telegram_automatic_forwards: Literal["channel", "ignore"] = "channel"
    """Posts a linked channel forwards into a group automatically (``is_automatic_forward``):
    answered as the channel speaking in the group, under the group policy, or ignored."""
    telegram_webhook_port: int = 8443
    """Where the webhook listens; the HTTP port's value shares that server."""
    telegram_connect_attempts: int = Field(5, ge=1)
    """How many times the token check (``getMe``) at start is tried while the Bot API cannot
    be reached (waiting 0.5 s, doubling, between tries; at most as often as a reply)."""
    telegram_rate_limits: bool = True
    """Keep Telegram's documented send limits before it enforces them (about 1 message/s
    per chat, 20/min per group, 30/s in all); off only where nothing enforces them (a
    fake Bot API in benchmarks). 429 windows are honoured either way."""
    discord_api_base: str | None = Field(
        None, validation_alias=_env("DISCORD_API_BASE", "discord_api_base"))
    """``DISCORD_API_BASE``: redirects Discord's REST API (proxies)."""
    discord_gateway_url: str | None = Field(
        None, validation_alias=_env("DISCORD_GATEWAY_URL", "discord_gateway_url"))
    """``DISCORD_GATEWAY_URL``: redirects Discord's gateway (proxies)."""
    slack_api_base: str | None = Field(
        None, validation_alias=_env("SLACK_API_BASE", "slack_api_base"))
    """``SLACK_API_BASE``: redirects Slack's Web API."""
    slack_port: int = 3000
    """Where the Events API listens (``/slack/events``); the HTTP port shares its server."""

    # Scheduler, cron jobs, memory, heartbeat.
    timezone: str = "UTC"
    """IANA time zone for schedules (a job may name its own)."""
    misfire_grace_seconds: int = Field(300, ge=0)
    """A run missed while the service was down fires once if this late at most."""

    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """``[plugins.<name>]``: each plugin's own settings, validated by its config model."""
    plugins_chat_install: bool = False
    """Let admins install plugins from chat (``/plugin install``); off by default."""
    plugins_install_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Distributions ``/plugin install`` may install (comma-separated in the env)."""

    mcp: McpConfig = Field(default_factory=McpConfig)
    """``[mcp.servers.<name>]``: MCP servers whose tools Roost offers (bot/config/mcp.py)."""

    # Agents (bot/config/agents.py) and which chats they serve.
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    """``[agents.<name>]``: agents with their own provider, model, persona, tools and judges."""
    bindings: list[Binding] = Field(default_factory=list)
    """``[[bindings]]``: which chats each agent serves (most specific match wins)."""
    agent_cache_ttl: float = Field(300.0, ge=0)
    """Seconds a resolved agent is reused before its configuration is resolved again."""
    config_file: Path | None = None
    """The roost.toml this was read from (set by ``load_settings``; ``/agent reload``)."""

    @model_validator(mode="before")
    @classmethod
    def _moved_names(cls, data: Any) -> Any:
        # Old top-level names of plugin settings (keywords, `.env`): into their tables.
        return relocate(data, replace=True) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _bindings_name_agents(self) -> Settings:
        check_bindings(self.agents, self.bindings)
        return self

    @field_validator("admins", "dm_allowlist", "plugins_install_allowlist",
                     "ui_trusted_proxies", mode="before")
    @classmethod
    def _split_admins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("ui_trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return value

    @field_validator("admins", "dm_allowlist")
    @classmethod
    def _check_admins(cls, value: list[str]) -> list[str]:
        for entry in value:
            channel, sep, user = entry.partition(":")
            if not sep or not channel or not user:
                raise ValueError(f"{entry!r} is not 'channel:user_id'")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, ListedEnv(settings_cls, env_settings), MovedEnv(settings_cls),
                KnownNames(settings_cls, dotenv_settings),
                TomlSource(settings_cls))

    @property
    def db_path(self) -> Path:
        """The SQLite database file (when ``database_url`` is empty)."""
        return self.data_dir / "roost.db"

    @property
    def database(self) -> Path | str:
        """The database to open: ``database_url`` when set, else :attr:`db_path`."""
        return self.database_url or self.db_path

    @property
    def workspaces_dir(self) -> Path:
        """Root of every user's workspace."""
        return self.data_dir / "workspaces"

    def dm_policy_for(self, channel: str) -> DmPolicy:
        """The DM policy in force on ``channel``."""
        return self.dm_policies.get(channel, self.dm_policy)

    def group_policy_for(self, channel: str, chat_id: str) -> GroupPolicy:
        """The group policy for one group: per group, else per channel, else the default."""
        return self.group_policies.get(f"{channel}:{chat_id}",
                                       self.group_policies.get(channel, self.group_policy))

    def streams(self, channel: str) -> bool:
        """Whether replies on ``channel`` are streamed by editing a message."""
        return self.stream_channels.get(channel, self.stream_replies)

    def is_admin(self, channel: str, user_id: str) -> bool:
        """Whether ``user_id`` on ``channel`` is listed in ``admins``."""
        return f"{channel}:{user_id}" in self.admins

    def budgets_for(self, agent: str) -> BudgetConfig:
        """``[budgets]`` with agent ``agent``'s ``[agents.<name>.budgets]`` overrides."""
        config = self.agents.get(agent)
        return self.budgets.merged(config.budgets if config is not None else None)

    def masked(self) -> dict[str, Any]:
        """The effective settings as plain data, every secret replaced by a mask."""
        data = self.model_dump(mode="json")
        for name, value in self:
            if isinstance(value, SecretStr):
                data[name] = SECRET_MASK
        data["plugins"] = {k: mask_tree(v) for k, v in self.plugins.items()}
        data["mcp"] = _masked_mcp(self.mcp)
        # Credentials inside URLs (user:password@, ?token=) whatever the field.
        return {k: mask_urls(v) for k, v in data.items()}


def load_settings(config_path: Path | None = None, **overrides: Any) -> Settings:
    """Read ``roost.toml`` (or ``config_path``), apply the env and ``overrides``.

    Raises :class:`ConfigError` naming the offending key.
    """
    explicit = config_path is not None
    path = config_path or Path("roost.toml")
    data: dict[str, Any] = {}
    if path.is_dir():
        # What a compose bind mount of a missing file makes.
        raise ConfigError(f"{path} is a directory, not a file (a bind mount of a file that "
                          "did not exist creates one): remove it and create the file "
                          "(`roost init` writes one)")
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    elif explicit:
        raise ConfigError(f"config file {path} does not exist")
    if path.exists():
        overrides.setdefault("config_file", path)
    pasted = find_mask(data)
    if pasted:
        raise ConfigError(f"{path}: {pasted} holds {SECRET_MASK!r}, the mask `roost config show` "
                          "prints, not a real value: put the real value back (or remove it)")
    token = toml_data.set(data)
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    finally:
        toml_data.reset(token)
    for name, value in settings:
        if isinstance(value, SecretStr) and SECRET_MASK in value.get_secret_value():
            raise ConfigError(f"{name} holds {SECRET_MASK!r}, the mask `roost config show` "
                              "prints, not a real value: set the real one (environment or .env)")
    return settings


def _describe(exc: ValidationError, path: Path) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        env = f"ROOST_{key.upper()}" if "." not in key else ""
        where = f" (in {path} or {env})" if env else f" (in {path})"
        lines.append(f"invalid config: {key}: {msg}{where}")
    return "\n".join(lines)
