"""Narrow views of the service's parts, as plugins, commands and jobs use them.

Each view lists only the operations plugins call; the concrete stores, router,
plugin host and scheduler live in higher layers and satisfy these structurally.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import aiosqlite

from bot.contracts.health import HealthReport
from bot.contracts.judge import Judge
from bot.contracts.llm import ChatMessage, LLMProvider, Session, SessionActivity, Usage
from bot.contracts.messages import ChatType
from bot.contracts.settings import SettingsModel
from bot.contracts.tools import Tool


class AgentError(Exception):
    """An agent cannot be resolved as configured; the message says what to fix."""


class JobError(Exception):
    """A job request refused; the message is fit to show the user.

    ``code``: ``INVALID_ARGUMENT``, ``INVALID_SCHEDULE``, ``INVALID_TIMEZONE``,
    ``TIME_PASSED``, ``INTERVAL_TOO_SHORT``, ``LIMIT_REACHED``, ``NOT_FOUND``,
    ``NOT_ALLOWED``.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class SessionsView(Protocol):
    """Conversation history: read a session, reset it, pin facts, append a run."""

    @property
    def db(self) -> aiosqlite.Connection:
        """The shared database connection."""
        ...

    @property
    def lock(self) -> asyncio.Lock:
        """Held around every statement on :attr:`db`."""
        ...

    async def get(self, key: str) -> Session:
        """Session ``key``, created empty when new."""
        ...

    async def reset(self, key: str) -> Session:
        """Start session ``key`` over: an empty history under the same key."""
        ...

    async def set_facts(self, session: Session, facts: Sequence[str]) -> None:
        """Replace the facts pinned to ``session``."""
        ...

    async def append_run(self, session: Session, run_id: str,
                         messages: Sequence[ChatMessage], usage: Usage | None = None,
                         model: str = "", provider: str = "") -> Any:
        """Append one run's messages to ``session`` in one transaction."""
        ...

    async def idle_sessions(self, before: float, after: float = 0.0) -> list[SessionActivity]:
        """Sessions last used between ``after`` and ``before`` (Unix seconds)."""
        ...

    async def message_counts(self, session_ids: Sequence[int]) -> dict[int, int]:
        """Stored messages per session id."""
        ...

    async def prune_runs(self, before: float) -> tuple[int, int]:
        """Delete the trace records of runs that ended before ``before``: (runs, spans)."""
        ...


class InboxView(Protocol):
    """The durable inbox, journal and outbox, as retention prunes it."""

    async def prune(self, days: float) -> int:
        """Delete finished entries and delivered replies older than ``days``."""
        ...


ERROR_ID_RE = re.compile(r"err_\d{8}_\d{6}_[0-9a-f]{6}")
"""What a stored error's ID looks like."""
RESULT_ID_RE = re.compile(r"res_\d{8}_\d{6}_[0-9a-f]{6}")
"""What a stored large result's ID looks like."""
ERROR_ID_EXAMPLE = "err_20241121_230334_abc123"
RESULT_ID_EXAMPLE = "res_20241121_230334_abc123"


class StoredErrorView(Protocol):
    """One stored tool error."""

    @property
    def id(self) -> str: ...
    @property
    def timestamp(self) -> float: ...
    @property
    def session_id(self) -> str: ...
    @property
    def tool_name(self) -> str: ...
    @property
    def raw_error(self) -> dict[str, Any]: ...
    @property
    def short_summary(self) -> str: ...

    def iso_timestamp(self) -> str:
        """The timestamp as RFC 3339 UTC."""
        ...


class ErrorsView(Protocol):
    """Full tool errors, stored by ID."""

    async def get(self, error_id: str, *, session_id: str | None = None
                  ) -> StoredErrorView | None:
        """Error ``error_id`` (in ``session_id``, when given), or ``None``."""
        ...

    async def list(self, session_id: str | None = None, tool_name: str | None = None, *,
                   limit: int | None = 50) -> Sequence[StoredErrorView]:
        """The latest errors, newest first."""
        ...

    async def delete_older_than(self, days: float) -> int:
        """Delete entries more than ``days`` days old; how many were deleted."""
        ...


class ResultsView(Protocol):
    """Large tool results, read in slices."""

    async def get_slice(self, result_id: str, offset: int = 0, length: int = 8_000, *,
                        session_id: str | None = None) -> tuple[str, int] | None:
        """``length`` characters from ``offset`` and the total length, or ``None``."""
        ...

    async def delete_older_than(self, days: float) -> int:
        """Delete entries more than ``days`` days old; how many were deleted."""
        ...


class JobRecordView(Protocol):
    """One scheduled job."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def schedule(self) -> str: ...
    @property
    def timezone(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def owner_id(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def chat_id(self) -> str: ...
    @property
    def chat_type(self) -> ChatType: ...
    @property
    def thread_id(self) -> str | None: ...
    @property
    def approved_tools(self) -> tuple[str, ...]:
        """Tools needing approval an admin pre-approved for the job's runs."""
        ...
    @property
    def label(self) -> str:
        """The ID plus the name in quotes, when it has one."""
        ...


class JobListing(Protocol):
    """A job as listed, with when it runs next (``None``: not scheduled here)."""

    @property
    def job(self) -> JobRecordView: ...
    @property
    def next_fire(self) -> datetime | None: ...


class SchedulerView(Protocol):
    """Cron jobs users create, list and remove (the ``cron`` tool and ``/cron``)."""

    async def add(self, *, owner_id: str, channel: str, chat_id: str, chat_type: ChatType,
                  thread_id: str | None, schedule: str, message: str, name: str = "",
                  timezone: str | None = None, max_jobs: int = 20,
                  min_interval: int = 60) -> JobListing:
        """Create a cron job; raises :class:`JobError` with a message for the user
        (also when ``owner_id`` has ``max_jobs`` already, or the schedule recurs more
        often than every ``min_interval`` seconds)."""
        ...

    async def jobs(self, *, channel: str | None = None,
                   owner_id: str | None = None) -> Sequence[JobListing]:
        """Cron jobs (of ``owner_id`` on ``channel`` when given), oldest first."""
        ...

    async def all_jobs(self) -> Sequence[JobListing]:
        """Every job, system jobs included."""
        ...

    async def remove(self, job_id: str, *, channel: str, owner_id: str,
                     admin: bool = False) -> JobRecordView:
        """Delete a cron job (the owner's own, any when ``admin``); the deleted job."""
        ...

    async def approve(self, job_id: str, tools: Sequence[str]) -> JobRecordView:
        """Pre-approve ``tools`` for a cron job's runs (replacing the earlier ones; an
        admin's call); raises :class:`JobError` for a missing or system job."""
        ...


class StatsView(Protocol):
    """Counters that describe themselves in one line."""

    def describe(self) -> str: ...


class JudgeSettingsView(Protocol):
    """How an agent's replies are judged: the strategy and the passing score."""

    @property
    def strategy(self) -> str: ...
    @property
    def threshold(self) -> float: ...


class PatternView(Protocol):
    """One pattern of an agent's library."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...


class PatternLibraryView(Protocol):
    """An agent's pattern library: the patterns loaded from its directory."""

    @property
    def directory(self) -> Path: ...
    @property
    def top_k(self) -> int: ...
    @property
    def min_score(self) -> float: ...
    @property
    def patterns(self) -> Sequence[PatternView]: ...
    @property
    def errors(self) -> Mapping[str, str]:
        """File name -> why it was skipped, as of the last load."""
        ...
    @property
    def last_scores(self) -> Mapping[str, float]:
        """Each pattern's score at its last match."""
        ...

    def reload_if_changed(self, *, force: bool = False) -> bool:
        """Rebuild if the directory changed (or ``force``); True if a new index is live."""
        ...


class AgentView(Protocol):
    """One resolved agent."""

    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> SettingsModel:
        """The settings this agent runs with (the service's, with its overrides)."""
        ...
    @property
    def provider(self) -> LLMProvider | None:
        """Its own provider, or ``None`` for the default one."""
        ...
    @property
    def type(self) -> str:
        """``open`` or ``predefined``."""
        ...
    @property
    def judge(self) -> JudgeSettingsView | None:
        """How its replies are judged, or ``None``."""
        ...
    @property
    def judges(self) -> Sequence[Judge]:
        """The judges its replies are scored by."""
        ...
    @property
    def patterns(self) -> PatternLibraryView | None:
        """Its pattern library, or ``None`` (``/patterns``)."""
        ...

    def tools(self, registered: Mapping[str, Tool], groups: Mapping[str, str]
              ) -> Mapping[str, Tool]:
        """The tools this agent may use, of ``registered`` (grouped by ``groups``)."""
        ...


class AgentsView(Protocol):
    """The configured agents."""

    async def get(self, name: str) -> AgentView:
        """Agent ``name``, resolved; raises :class:`AgentError` when it cannot be."""
        ...

    async def reread(self) -> str:
        """Re-read the agents and bindings from the config file the service started
        from; what was done, in a phrase. Raises :class:`AgentError` (nothing changed)
        when the file has errors."""
        ...

    def peek(self, name: str) -> AgentView | None:
        """Agent ``name`` if it is resolved already."""
        ...

    def invalidate(self, name: str | None = None) -> bool:
        """Forget agent ``name`` (every agent when ``None``) so it is resolved again."""
        ...

    def permits_anywhere(self, name: str, tools: Mapping[str, Tool],
                         groups: Mapping[str, str]) -> bool:
        """Whether some configured agent's tool policy lets tool ``name`` (one of
        ``tools``, grouped by ``groups``) run."""
        ...

    def stats_for(self, name: str) -> StatsView:
        """Agent ``name``'s judge statistics."""
        ...


class PluginInfoView(Protocol):
    """Where a loaded plugin came from."""

    @property
    def name(self) -> str: ...
    @property
    def distribution(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def builtin(self) -> bool: ...


class PluginsView(Protocol):
    """The loaded plugins: their info, errors, disabled set and per-plugin hook calls."""

    @property
    def info(self) -> Mapping[str, PluginInfoView]: ...
    @property
    def errors(self) -> dict[str, str]:
        """Load and run errors by plugin name (a plugin may record its own)."""
        ...
    @property
    def disabled(self) -> set[str]: ...

    def is_loaded(self, name: str) -> bool:
        """True when a plugin named ``name`` is registered."""
        ...

    def hooks_of(self, name: str) -> list[str]:
        """The hooks plugin ``name`` implements."""
        ...

    async def health(self, app: Any) -> list[HealthReport]:
        """Every plugin's health report."""
        ...

    async def status_lines(self, context: Any) -> list[str]:
        """The lines plugins add to ``/status`` for ``context`` (a ``CommandContext``)."""
        ...


class OfferView(Protocol):
    """What the enabled plugins offer now."""

    @property
    def tools(self) -> Mapping[str, Tool]: ...
    @property
    def tool_groups(self) -> Mapping[str, str]: ...
    def guard_scan(self, text: str) -> list[str]:
        """Names of the input guard's patterns that match ``text`` (whatever the guard's
        mode: for text from files, such as a skill, that no mode applies to)."""
        ...


class SnapshotSource(Protocol):
    """Counters that can be read as one mapping per name."""

    def snapshot(self) -> Mapping[str, Mapping[str, Any]]: ...


class PairingRequestView(Protocol):
    """A pending pairing code: who asked, from which chat, until when it is valid."""

    @property
    def code(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def chat_id(self) -> str: ...
    @property
    def display_name(self) -> str: ...
    @property
    def expires_at(self) -> float: ...
    @property
    def refused(self) -> int: ...
    @property
    def user(self) -> str: ...


class PairedUserView(Protocol):
    """A user an admin approved."""

    @property
    def channel(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def display_name(self) -> str: ...
    @property
    def approved_by(self) -> str: ...
    @property
    def approved_at(self) -> float: ...
    @property
    def user(self) -> str: ...


class AccessView(Protocol):
    """DM pairing: codes waiting for an admin and the users approved."""

    @property
    def clock(self) -> Callable[[], float]:
        """Wall-clock seconds."""
        ...

    async def approve(self, code: str, approved_by: str) -> PairingRequestView | None: ...
    async def revoke(self, channel: str, user_id: str) -> bool: ...
    async def pending(self) -> Sequence[PairingRequestView]: ...
    async def paired(self) -> Sequence[PairedUserView]: ...
    async def find_paired(self, user: str, channel: str) -> Sequence[PairedUserView]: ...


class SpentView(Protocol):
    """One subject's token counters for one period."""

    @property
    def subject(self) -> str: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def runs(self) -> int: ...
    @property
    def cost(self) -> float: ...
    @property
    def cache_read_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...
    @property
    def tokens(self) -> int: ...


UsageScope = Literal["user", "group", "agent", "model", "job"]
"""Whose tokens a usage counter holds."""


class UsageView(Protocol):
    """Tokens spent per user, group and agent, by UTC day and month."""

    @property
    def clock(self) -> Callable[[], float]:
        """Wall-clock seconds."""
        ...

    async def top(self, scope: UsageScope, period: str,
                  limit: int = 10) -> Sequence[SpentView]: ...

    async def drop_expired(self) -> int:
        """Delete expired budget reservations and old warnings; how many reservations."""
        ...
