"""``roost init``: a commented ``roost.toml`` and a ``.env.example`` to start from."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, SecretStr

from bot.config.moved import CREDENTIALS, EMAIL_ENV, MOVED, SERVICE_ENV
from bot.config.settings import Settings

CONFIG_NAME = "roost.toml"
ENV_EXAMPLE_NAME = ".env.example"

ROOST_TOML = '''\
# Roost's configuration, written by `roost init`. Every setting `x` here can be
# overridden by the environment variable ROOST_X (and by .env in this directory).
# Credentials do not belong here: put them in .env (see .env.example).
# `roost config show` prints the effective configuration, secrets masked.

# The LLM: "anthropic" (ANTHROPIC_API_KEY), "openai" (OPENAI_BASE_URL for Ollama,
# vLLM, llama.cpp; OPENAI_API_KEY for OpenAI) or "scripted" (the demo script).
provider = "anthropic"
# model = "claude-sonnet-5-5"

# The database and every user's workspace.
data_dir = "data"

# Who may run admin commands (/errors, /plugins, /pair approve...): channel:user_id.
# /whoami in a chat tells you yours.
# admins = ["telegram:123456789"]

# Direct chats: "pairing" (an unknown user gets a code an admin approves), "open",
# "allowlist" (dm_allowlist = ["telegram:42"]) or "disabled".
# dm_policy = "pairing"
# Groups: answer when @-mentioned ("mention"), to every message ("all") or never ("off").
# group_policy = "mention"

# /healthz, /readyz and /metrics for a supervisor or Prometheus; `roost status` asks here.
# http_port = 8080
# http_host = "127.0.0.1"

# Logs go to stderr: DEBUG, INFO, WARNING... as "text" or "json" (one object per line).
# log_level = "INFO"
# log_format = "text"

# Time zone of scheduled jobs (IANA name).
# timezone = "UTC"

# Spend limits in tokens (0 = unlimited); admins are exempt.
# [budgets]
# user_daily_tokens = 200000
# user_requests_per_minute = 10

# A second agent with its own model and tools, bound to one chat:
# [agents.support]
# model = "claude-haiku-5"
# tools = { profile = "messaging" }
# [[bindings]]
# agent = "support"
# chat_id = "-100123456"

# A built-in plugin's settings are in its own table (`roost config show` lists them
# all with their defaults), e.g. the web tools' and the sandboxed exec's:
# [plugins."plugins.web"]
# searxng_url = "http://searx.lan:8080"    # web_search (or BRAVE_API_KEY in .env)
# [plugins."plugins.exec_tool"]
# timeout = 30
# and the email channel's (or EMAIL_* in .env; docs/platforms/email.md):
# [plugins."plugins.mail"]
# imap_url = "imaps://imap.example.com"
# smtp_url = "smtps://smtp.example.com"
# address = "roost@example.com"

# Matrix (MATRIX_HOMESERVER, MATRIX_USER_ID, MATRIX_ACCESS_TOKEN in .env):
# [plugins."plugins.matrix"]
# sync_timeout = 30
# encryption = true               # end-to-end encrypted rooms, keys in data/matrix/

# WhatsApp (its credentials go in .env; the webhook is /whatsapp/webhook on http_port):
# [plugins."plugins.whatsapp"]
# template_name = "roost_reply"   # sent for a reply due outside the 24-hour window

# Tools of an MCP server:
# [mcp.servers.github]
# command = "npx"
# args = ["-y", "@modelcontextprotocol/server-github"]
# env = { GITHUB_PERSONAL_ACCESS_TOKEN = "${GITHUB_TOKEN}" }
'''

_HINTS = {
    "anthropic_api_key": "The LLM: one of these (or OPENAI_BASE_URL for a local model).",
    "telegram_bot_token": "Chat platforms: Roost serves every one whose credentials are set.\n"
                          "# Telegram (the webhook secret only with telegram_webhook_url).",
    "discord_bot_token": "Discord.",
    "slack_bot_token": "Slack: the bot token plus SLACK_SIGNING_SECRET (Events API over HTTP)\n"
                       "# or SLACK_APP_TOKEN (Socket Mode).",
    "brave_api_key": "Web search backends (optional).",
    "transcribe_api_key": "Voice notes: the key of the transcription server (optional).",
}


PLUGIN_CHANNELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("WhatsApp (Cloud API): the channel plugins.whatsapp; its webhook is /whatsapp/webhook\n"
     "# on ROOST_HTTP_PORT.",
     ("WHATSAPP_PHONE_NUMBER_ID", "WHATSAPP_ACCESS_TOKEN", "WHATSAPP_APP_SECRET",
      "WHATSAPP_VERIFY_TOKEN")),
    ("Email: a mailbox of its own (pip install 'roost[email]'); the username only\n"
     "# when it is not the address.", tuple(EMAIL_ENV)),
    ("Matrix (pip install 'roost[matrix]'): the homeserver's URL, the bot's Matrix ID and\n"
     "# its access token, or a password used once (the device it logs in is kept).",
     ("MATRIX_HOMESERVER", "MATRIX_USER_ID", "MATRIX_ACCESS_TOKEN", "MATRIX_PASSWORD")),
)
"""Channels offered by built-in plugins: a comment and the variables ``.env.example`` lists."""


def env_name(name: str) -> str:
    """The environment variable of setting ``name``: the SDK's own name when it has one.

    A plugin credential's (:data:`~bot.config.moved.CREDENTIALS`): its variable that
    works without a deprecation line."""
    if name in MOVED:
        return next(env for env, place in SERVICE_ENV.items() if place == MOVED[name])
    field = Settings.model_fields[name]
    if isinstance(field.validation_alias, AliasChoices):
        return str(field.validation_alias.choices[0])
    return f"ROOST_{name.upper()}"


def credential_names() -> list[str]:
    """The settings that hold secrets, in their declaration order, then plugins' credentials."""
    return [name for name, field in Settings.model_fields.items()
            if SecretStr in _types(field.annotation)] + list(CREDENTIALS)


def _types(annotation: object) -> tuple[object, ...]:
    return (annotation, *getattr(annotation, "__args__", ()))


def env_example() -> str:
    """``.env.example``: one ``NAME=`` line per credential, grouped with a comment."""
    lines = ["# Credentials for Roost. Copy to .env (read from this directory; the real",
             "# environment wins) and fill in what you use; empty lines mean unset.",
             "# Keep .env out of version control."]
    # The LLM first, then the platforms, then the optional rest in declaration order.
    first = ["anthropic_api_key", "openai_api_key", "telegram_bot_token",
             "telegram_webhook_secret", "discord_bot_token", "slack_bot_token",
             "slack_signing_secret", "slack_app_token"]
    names = credential_names()
    for name in [n for n in first if n in names] + [n for n in names if n not in first]:
        hint = _HINTS.get(name)
        if hint:
            lines += ["", f"# {hint}"]
        lines.append(f"{env_name(name)}=")
    for hint, variables in PLUGIN_CHANNELS:
        lines += ["", f"# {hint}", *(f"{variable}=" for variable in variables)]
    return "\n".join(lines) + "\n"


def existing(directory: Path) -> list[Path]:
    """The files ``roost init`` would write that are already in ``directory``."""
    return [p for p in (directory / CONFIG_NAME, directory / ENV_EXAMPLE_NAME) if p.exists()]


def write(directory: Path) -> list[Path]:
    """Write ``roost.toml`` and ``.env.example`` into ``directory``; the paths written."""
    config, example = directory / CONFIG_NAME, directory / ENV_EXAMPLE_NAME
    config.write_text(ROOST_TOML, encoding="utf-8")
    example.write_text(env_example(), encoding="utf-8")
    return [config, example]
