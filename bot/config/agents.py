"""The ``[agents.<name>]`` tables and ``[[bindings]]`` of ``roost.toml``.

An agent is a model, a persona and a set of tools and quality checks; a
binding sends the messages of a channel, a chat (or group) or a chat type to
one agent. Everything an agent leaves unset comes from the top-level settings,
so ``[agents.support]`` with only ``model = "..."`` is a complete agent::

    [agents.support]
    provider = "anthropic"
    model = "claude-sonnet-5-5"
    type = "predefined"              # agent-level persona files + each user's USER.md
    bootstrap_dir = "agents/support" # SOUL.md, IDENTITY.md, AGENTS.md, TOOLS.md, USER.md
    tools = { profile = "messaging", deny = ["cron"] }
    patterns = { dir = "patterns/support", top_k = 3 }

    [agents.support.judge]
    strategy = "mean"
    criteria = "Polite, correct, and no promises about refunds."
    judges = [{ type = "llm", model = "claude-haiku-5" }]

    [[bindings]]
    agent = "support"
    channel = "slack"

The resolver (:mod:`bot.agents.router`) turns these into running agents and applies
the fallbacks; this module only validates shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.config.budgets import BudgetConfig
from bot.contracts.judge import DEFAULT_MAX_RETRIES, DEFAULT_THRESHOLD, MAX_RETRIES_RANGE, Strategy
from bot.contracts.messages import ChatType, InboundMessage

DEFAULT_TOP_K = 3
"""Patterns an agent's pattern library offers per run, unless configured."""
DEFAULT_MIN_SCORE = 0.1
"""The lowest match score a pattern needs to be offered, unless configured."""

FULL = "full"

PROFILES: Mapping[str, frozenset[str] | None] = {
    FULL: None,
    "coding": frozenset({
        "read_file", "write_file", "list_files", "edit_file", "send_file",
        "sql",
        "get_error_detail", "get_tool_result",
    }),
    "messaging": frozenset({
        "read_file", "list_files", "send_file",
        "memory_search", "memory_get",
        "get_error_detail", "get_tool_result",
        "cron",
    }),
    "minimal": frozenset({"get_error_detail", "get_tool_result"}),
}
"""Tool names each profile offers before ``allow``/``deny`` apply.

- ``full``: every registered tool (``None`` stands for "no restriction");
- ``coding``: the file tools (``send_file`` included), ``sql`` and the error-channel tools;
- ``messaging``: no file writes — reading files and sending them to the chat,
  memory, the error-channel tools and ``cron``;
- ``minimal``: only the error-channel tools (``get_error_detail``,
  ``get_tool_result``), so the model can still follow up on failures.
"""


AGENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
"""Agent names appear in session keys (``agent:channel:...``), so no colons."""

DEFAULT_AGENT = "default"
"""The agent that serves every chat no binding claims; it exists even when unconfigured."""

AgentType = Literal["open", "predefined"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolPolicyConfig(_Strict):
    """``tools = {profile, allow, deny, approve}``: see :mod:`bot.agents.tool_policy`."""

    profile: str = "full"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    approve: tuple[str, ...] | None = None
    """Tools (and groups) whose calls wait for a person's approval; unset: ``["exec"]``."""

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"unknown tool profile {value!r} (known: {', '.join(PROFILES)})")
        return value


class PatternConfig(_Strict):
    """``patterns = {dir, top_k, min_score}``: a directory of pattern YAML files."""

    dir: Path
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=20)
    min_score: float = Field(DEFAULT_MIN_SCORE, ge=0, le=1)
    check_interval: float = Field(2.0, ge=0)
    """Seconds between checks of the directory for changes (hot reload)."""


class JudgeEntry(_Strict):
    """One judge. ``type = "llm"`` is the built-in LLM judge; any other type names a
    judge a plugin offers through ``roost_judges``."""

    type: str = "llm"
    name: str | None = None
    """Shown in traces and correction messages; defaults to the type (``llm``, ``llm-2``...)."""
    criteria: str | None = None
    """The LLM judge's criteria; defaults to the agent's ``judge.criteria``."""
    provider: str | None = None
    """The LLM judge's provider; defaults to the agent's."""
    model: str | None = None
    """The LLM judge's model; defaults to the agent's."""
    weight: float | None = Field(None, ge=0)
    """Weight under the ``weighted`` strategy; defaults to the judge's own (1.0)."""


class JudgeConfig(_Strict):
    """``[agents.<name>.judge]``: self-correction of final replies."""

    strategy: Strategy = "mean"
    threshold: float = Field(DEFAULT_THRESHOLD, ge=0, le=1)
    max_retries: int = Field(DEFAULT_MAX_RETRIES, ge=MAX_RETRIES_RANGE[0],
                             le=MAX_RETRIES_RANGE[1])
    """Attempts in all, the first reply included (1 judges without ever retrying)."""
    criteria: str = ("The reply answers the user's request correctly and completely, "
                     "is honest about what it does not know, and is safe to send.")
    judges: tuple[JudgeEntry, ...] = (JudgeEntry(),)


class AgentConfig(_Strict):
    """``[agents.<name>]``. Unset fields fall back to the top-level settings."""

    provider: str | None = None
    model: str | None = None
    context_window: int | None = None
    """Tokens; ``<= 0`` falls back to 200,000 (the resolver's rule)."""
    max_iterations: int | None = None
    """LLM calls per run; ``<= 0`` falls back to 20."""
    max_tokens: int | None = Field(None, ge=1)
    script: Path | None = None
    """A script of its own for the ``scripted`` provider (demos, tests)."""
    type: AgentType = "open"
    bootstrap_dir: Path | None = None
    """Persona and project files: seeded into each user's workspace (``open``), or
    read from here for everyone with only USER.md per user (``predefined``)."""
    tools: ToolPolicyConfig = ToolPolicyConfig()
    patterns: PatternConfig | None = None
    vision: bool | None = None
    """Whether this agent's model takes images and PDFs; unset follows ``vision``."""
    judge: JudgeConfig | None = None
    budgets: BudgetConfig | None = None
    """``[agents.<name>.budgets]``: overrides of ``[budgets]`` for this agent's runs."""
    approval_timeout: float | None = Field(None, gt=0)
    """Seconds this agent's tool calls wait for approval; unset follows ``approval_timeout``."""
    skills: tuple[Path, ...] = ()
    """Directories of Agent Skills (folders with a SKILL.md) this agent has besides the
    global ``skills/`` (see docs/skills.md)."""
    user_skills: bool = False
    """Whether each user's own ``skills/`` folder in their workspace adds skills to this
    agent's runs for that user."""
    skills_only: tuple[str, ...] | None = None
    """The skills this agent may use, by name; unset: every enabled one."""
    skills_disabled: tuple[str, ...] = ()
    """Skills this agent never uses, by name."""
    edit_policy: Literal["correct", "ignore"] | None = None
    """What an edit of an answered message does for this agent; unset follows
    ``edit_policy``."""

    @field_validator("context_window")
    @classmethod
    def _usable_window(cls, value: int | None) -> int | None:
        if value is not None and 0 < value < 1_000:
            raise ValueError("context_window must be at least 1000 tokens (or <= 0 for the "
                             "200,000 default)")
        return value

    @model_validator(mode="after")
    def _predefined_needs_files(self) -> AgentConfig:
        if self.type == "predefined" and self.bootstrap_dir is None:
            raise ValueError("a predefined agent needs bootstrap_dir (its persona files)")
        return self


class Binding(_Strict):
    """``[[bindings]]``: which agent serves the messages that match every set field.

    ``chat_id`` is the chat (a direct chat, a Telegram group, a Slack or
    Discord channel) and the most specific condition; then ``group_id``, the
    Slack workspace (team id) or Discord server (guild id) a chat is in; then
    ``channel``; then ``chat_type``. Among equally specific matches the first
    listed wins.
    """

    agent: str
    channel: str | None = None
    chat_id: str | None = None
    group_id: str | None = None
    chat_type: ChatType | None = None

    @model_validator(mode="after")
    def _has_a_condition(self) -> Binding:
        if not self._conditions():
            raise ValueError(f"binding to {self.agent!r} needs channel, chat_id, group_id "
                             "or chat_type")
        return self

    def _conditions(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in (("channel", self.channel), ("chat_id", self.chat_id),
                                    ("group_id", self.group_id),
                                    ("chat_type", self.chat_type)) if v is not None]

    @property
    def specificity(self) -> int:
        """Higher is more specific: chat id 8, group id 4, channel 2, chat type 1."""
        return ((8 if self.chat_id is not None else 0) + (4 if self.group_id is not None else 0)
                + (2 if self.channel is not None else 0)
                + (1 if self.chat_type is not None else 0))

    def matches(self, message: InboundMessage) -> bool:
        """Whether every condition of this binding holds for ``message``."""
        return ((self.channel is None or self.channel == message.channel)
                and (self.chat_id is None or self.chat_id == message.chat_id)
                and (self.group_id is None or self.group_id == message.group_id)
                and (self.chat_type is None or self.chat_type == message.chat_type))

    def describe(self) -> str:
        """``channel=slack chat_type=group`` (for ``/agents``)."""
        return " ".join(f"{k}={v}" for k, v in self._conditions())


def check_bindings(agents: dict[str, AgentConfig], bindings: list[Binding]) -> None:
    """Raise ``ValueError`` for a bad agent name or a binding to an unknown agent."""
    for name in agents:
        if not AGENT_NAME.fullmatch(name):
            raise ValueError(f"agent name {name!r} must be 1-32 letters, digits, '-' or '_'")
    known = set(agents) | {DEFAULT_AGENT}
    for binding in bindings:
        if binding.agent not in known:
            raise ValueError(f"binding to unknown agent {binding.agent!r} "
                             f"(configured: {', '.join(sorted(known))})")
