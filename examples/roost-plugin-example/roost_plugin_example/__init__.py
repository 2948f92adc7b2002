"""An example Roost plugin: one of each thing a plugin usually adds.

=====================================  ===============================================
hook                                   what this plugin offers
=====================================  ===============================================
``roost_plugin_config_model``          :class:`ExampleConfig`, the ``[plugins.roost-
                                       plugin-example]`` table of roost.toml
``roost_tools``                        ``word_count``: counts the words of a text
``roost_output_sanitizers``            ``redact_api_keys``: hides ``sk-...`` keys in replies
``roost_guard_patterns``               ``developer_mode``: flags "enable developer mode"
``roost_commands``                     ``/hello [name]``: a greeting from the config
``roost_prompt_sections``              ``word_count_hint``: tells the model about the tool
``roost_scheduled_jobs``               ``example-stats``: logs the session count hourly
=====================================  ===============================================

It is published under the ``roost`` entry-point group (see ``pyproject.toml``),
so ``pip install roost-plugin-example`` is all it takes for Roost to load it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from roost import (
    Command,
    CommandContext,
    GuardPattern,
    JobSpec,
    PromptContext,
    PromptSection,
    Runtime,
    Sanitizer,
    Services,
    Settings,
    Tool,
    ToolContext,
    ToolError,
    check_keys,
    hookimpl,
    str_arg,
)

PLUGIN_NAME = "roost-plugin-example"
"""The entry-point name: how Roost names this plugin and where its configuration lives."""

log = logging.getLogger("roost.plugins.example")


class ExampleConfig(BaseModel):
    """``[plugins.roost-plugin-example]`` in roost.toml; every key is optional."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is an error, not ignored

    greeting: str = "Hello"
    """What ``/hello`` says."""
    max_text_chars: int = Field(100_000, gt=0)
    """``word_count`` refuses longer texts."""


def config_of(settings: Settings) -> ExampleConfig:
    """This plugin's configuration from the settings (defaults when there is none).

    Roost validates the table at startup with :class:`ExampleConfig` and keeps
    the result in ``services.plugin_config(PLUGIN_NAME)``; reading it from the
    settings too lets hooks without ``services`` use the same values.
    """
    return ExampleConfig.model_validate(settings.plugins.get(PLUGIN_NAME, {}))


@hookimpl
def roost_plugin_config_model() -> type[BaseModel]:
    """The schema of this plugin's configuration."""
    return ExampleConfig


# -- a tool ------------------------------------------------------------------------------

def count_words(text: str) -> int:
    """Words are runs of letters, digits, apostrophes and hyphens."""
    return len(re.findall(r"[\w'-]+", text))


@hookimpl
def roost_tools(settings: Settings, services: Services | None) -> list[Tool]:
    """``word_count``, limited to ``max_text_chars`` characters."""
    configured = services.plugin_config(PLUGIN_NAME) if services is not None else None
    config = configured if isinstance(configured, ExampleConfig) else config_of(settings)

    async def word_count(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("text",))
        text = str_arg(args, "text")
        if len(text) > config.max_text_chars:
            raise ToolError(f"text is longer than {config.max_text_chars} characters",
                            code="TOO_LONG")
        return f"{count_words(text)} words, {len(text)} characters"

    return [Tool(
        "word_count",
        "Count the words and characters of a text exactly.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        word_count,
        timeout=5.0,
    )]


# -- an output sanitizer -----------------------------------------------------------------

_API_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")


def redact_api_keys(text: str) -> str:
    """Replace anything that looks like an ``sk-...`` API key."""
    return _API_KEY.sub("[redacted key]", text)


@hookimpl
def roost_output_sanitizers(settings: Settings) -> Sanitizer:
    """Runs after the built-ins have removed thinking and tool-call debris (650)."""
    return Sanitizer("redact_api_keys", redact_api_keys, 650)


# -- a guard pattern ---------------------------------------------------------------------

@hookimpl
def roost_guard_patterns(settings: Settings) -> GuardPattern:
    """One more prompt-injection pattern, beside the built-in six."""
    return GuardPattern("developer_mode",
                        r"\b(enable|activate|enter)\s+(the\s+)?developer\s+mode\b",
                        "asks the model to switch into a 'developer mode' without rules")


# -- a slash command ---------------------------------------------------------------------

async def _hello(ctx: CommandContext) -> str:
    configured = ctx.app.plugin_config(PLUGIN_NAME)
    config = configured if isinstance(configured, ExampleConfig) else config_of(
        ctx.app.settings)
    who = ctx.args.strip() or ctx.message.display_name
    return f"{config.greeting}, {who}!"


@hookimpl
def roost_commands(settings: Settings) -> Command:
    """``/hello [name]``."""
    return Command("hello", "say hello", _hello, usage="[name]")


# -- a prompt section --------------------------------------------------------------------

@hookimpl
def roost_prompt_sections(prompt: PromptContext) -> PromptSection | None:
    """Tell the model about ``word_count``, in normal runs and only when it is offered."""
    if prompt.mode != "full" or "word_count" not in prompt.tool_names:
        return None
    return PromptSection(
        "word_count_hint",
        "## Counting words\nWhen asked how long a text is, call `word_count` instead of "
        "counting yourself.",
    )


# -- a scheduled job ---------------------------------------------------------------------

async def log_stats(app: Runtime) -> None:
    """Log how many tools and commands are loaded (a stand-in for real periodic work)."""
    log.info("roost-plugin-example: %d tools, %d commands",
             len(app.snapshot.tools), len({id(c) for c in app.commands.values()}))


@hookimpl
def roost_scheduled_jobs(settings: Settings) -> JobSpec:
    """``example-stats``, hourly."""
    return JobSpec("example-stats", "every 1h", log_stats)
