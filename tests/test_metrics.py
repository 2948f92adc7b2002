"""Prometheus metrics: scraped over HTTP from /metrics while runs happen.

Counters move after runs (runs, tokens, tool calls, deliveries, scheduler
fires), the gauges show what is happening during a run (active runs, queued
messages, breaker states), and each app keeps its own registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.app.http import HealthServer, gauges
from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import OutboundMessage
from bot.contracts.tools import Tool, ToolContext, ToolError
from bot.observability.metrics import Gauges, RoostMetrics
from bot.observability.tracing import RunTrace, Span
from bot.resilience.retry import RetryPolicy
from bot.testing.app import ChatChannel

SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of a scrape by (name, labels)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist (yet)."""
    return scraped.get((name, frozenset(labels.items())), 0.0)


class Tools:
    """``wait`` blocks until released; ``fail`` fails for good."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def _wait(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        self.entered.set()
        await self.release.wait()
        return "released"

    async def _fail(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        raise ToolError("no such record", code="NOT_FOUND")

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool("wait", "waits until released", SCHEMA, self._wait),
                Tool("fail", "always fails", SCHEMA, self._fail)]


def call(name: str, then: str = "done") -> dict[str, Any]:
    """A scripted turn: call tool ``name``, then reply ``then``."""
    return {"steps": [{"tool_calls": [{"name": name, "arguments": {}}]}, {"reply": then}]}


Scrape = Callable[[], Awaitable[Samples]]


@pytest.fixture(name="metrics_of")
async def metrics_of_fixture() -> AsyncIterator[Callable[[Roost], Awaitable[Scrape]]]:
    """``scrape = await metrics_of(app)``: serves the app's /metrics; ``await scrape()``."""
    servers: list[HealthServer] = []
    async with aiohttp.ClientSession() as session:
        async def serve(app: Roost) -> Scrape:
            server = HealthServer(app, "127.0.0.1", 0)
            await server.start()
            servers.append(server)

            async def scrape() -> Samples:
                async with session.get(f"{server.url}/metrics") as response:
                    assert response.status == 200
                    assert response.headers["Content-Type"].startswith("text/plain")
                    return samples(await response.text())

            return scrape

        yield serve
        for server in servers:
            await server.close()


async def test_a_run_moves_the_run_token_tool_and_delivery_counters(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    chat: ChatChannel = await roost_app([call("fail", "sorry, not found")], Tools())
    assert chat.app is not None
    scrape = await metrics_of(chat.app)
    before = await scrape()
    assert value(before, "roost_runs_total", agent="default", status="completed") == 0

    assert await chat.ask("look it up") == ["sorry, not found"]
    after = await scrape()
    assert value(after, "roost_runs_total", agent="default", status="completed") == 1
    assert value(after, "roost_run_seconds_count", agent="default") == 1
    assert value(after, "roost_tool_calls_total", tool="fail", outcome="error") == 1
    assert value(after, "roost_deliveries_total", channel="console", outcome="ok") == 1
    model = chat.app.settings.model
    assert value(after, "roost_llm_calls_total", agent="default", model=model,
                 outcome="ok") == 2  # the tool call, then the reply
    assert value(after, "roost_llm_seconds_count", model=model) == 2
    tokens_in = value(after, "roost_llm_tokens_total", agent="default", model=model,
                      direction="input")
    tokens_out = value(after, "roost_llm_tokens_total", agent="default", model=model,
                       direction="output")
    # The scripted model reports usage as a provider does; the run's record agrees.
    [record] = await chat.app.store.runs(chat.app.dispatcher.key_for(
        chat_message(chat)))
    assert (tokens_in, tokens_out) == (record.input_tokens, record.output_tokens)
    assert tokens_in > 0 and tokens_out > 0


def chat_message(chat: ChatChannel) -> Any:
    from bot.contracts.messages import InboundMessage

    return InboundMessage(channel=chat.name, chat_id=chat.sender, chat_type="direct",
                          sender_id=chat.sender, sender_name="", text="", message_id="x")


async def test_scrapes_during_a_run_show_it_active_and_the_message_queued_behind_it(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    tools = Tools()
    chat: ChatChannel = await roost_app([call("wait", "first"), {"reply": "second"}], tools,
                                        merge_window_ms=0)
    assert chat.app is not None
    scrape = await metrics_of(chat.app)
    await chat.say("one")
    await asyncio.wait_for(tools.entered.wait(), 5)
    await chat.say("two")  # same chat: waits for the first run
    during = await scrape()
    assert value(during, "roost_active_runs") == 1
    assert value(during, "roost_queue_depth") == 1
    assert value(during, "roost_runs_total", agent="default", status="completed") == 0

    tools.release.set()
    await chat.settle()
    after = await scrape()
    assert chat.replies == ["first", "second"]
    assert (value(after, "roost_active_runs"), value(after, "roost_queue_depth")) == (0, 0)
    assert value(after, "roost_runs_total", agent="default", status="completed") == 2
    assert value(after, "roost_tool_calls_total", tool="wait", outcome="ok") == 1


class Flaky(ChatChannel):
    """Refuses the first ``refusals`` replies, as a platform having an outage would."""

    def __init__(self, refusals: int) -> None:
        super().__init__("flaky")
        self.refusals = refusals
        self.attempts = 0
        self.tried = asyncio.Condition()

    async def send(self, message: OutboundMessage) -> None:
        async with self.tried:
            self.attempts += 1
            self.tried.notify_all()
        if self.refusals:
            self.refusals -= 1
            raise ConnectionError("platform unavailable")
        await super().send(message)


@pytest.fixture(name="quick_redelivery")
def quick_redelivery_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two redeliveries, 10 ms apart, instead of 5 s, 30 s, ...
    monkeypatch.setattr("bot.dispatch.delivery.REDELIVERY", RetryPolicy.fixed(0.01, 0.01))


@pytest.mark.usefixtures("quick_redelivery")
async def test_a_reply_the_channel_refuses_counts_as_failed_then_ok_when_redelivered(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    chat = Flaky(refusals=1)
    app: Roost = (await roost_app([{"reply": "hi"}])).app
    await chat.attach(app)
    scrape = await metrics_of(app)
    await chat.say("hello")
    await chat.wait_for_message()
    scraped = await scrape()
    assert value(scraped, "roost_deliveries_total", channel="flaky", outcome="failed") == 1
    assert value(scraped, "roost_deliveries_total", channel="flaky", outcome="ok") == 1


@pytest.mark.usefixtures("quick_redelivery")
async def test_a_reply_never_taken_counts_as_given_up_after_its_retries(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    chat = Flaky(refusals=100)
    app: Roost = (await roost_app([{"reply": "hi"}])).app
    await chat.attach(app)
    scrape = await metrics_of(app)
    await chat.say("hello")
    async with asyncio.timeout(10), chat.tried:
        # The first try and two redeliveries. Each failure is counted as send raises,
        # in the same step as the notification, before this test runs again.
        await chat.tried.wait_for(lambda: chat.attempts == 3)
    scraped = await scrape()
    assert value(scraped, "roost_deliveries_total", channel="flaky", outcome="given_up") == 1
    assert value(scraped, "roost_deliveries_total", channel="flaky", outcome="failed") == 2
    assert value(scraped, "roost_deliveries_total", channel="flaky", outcome="ok") == 0


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_a_cron_job_firing_counts_as_a_scheduler_fire_and_a_run(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    clock = Clock()
    chat: ChatChannel = await roost_app([{"reply": "stretch!"}], clock=clock,
                                        memory_flush=False)
    assert chat.app is not None
    scheduler = chat.app.services.scheduler
    assert scheduler is not None
    scrape = await metrics_of(chat.app)
    await scheduler.add(owner_id="user", channel="console", chat_id="user",
                        chat_type="direct", thread_id=None, schedule="every 1h",
                        message="remind me to stretch")
    clock.now += timedelta(hours=1)
    assert len(await scheduler.run_due()) == 1
    await scheduler.wait_idle()
    scraped = await scrape()
    assert value(scraped, "roost_scheduler_fires_total", kind="cron") == 1
    assert value(scraped, "roost_runs_total", agent="default", status="completed") == 1


async def test_breaker_states_are_read_at_scrape_time(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    chat: ChatChannel = await roost_app([{"reply": "hi"}])
    assert chat.app is not None
    scrape = await metrics_of(chat.app)
    breaker = chat.app.engine.breakers.get("web_fetch")
    assert value(await scrape(), "roost_breaker_state", breaker="tool:web_fetch") == 0
    for _ in range(breaker.policy.threshold):
        ticket = breaker.try_admit()
        assert ticket is not None
        breaker.record_failure(ticket, "timeout")
    assert value(await scrape(), "roost_breaker_state", breaker="tool:web_fetch") == 2
    assert gauges(chat.app).breakers["tool:web_fetch"] == "open"


async def test_each_app_counts_only_its_own_runs(
        roost_app: Any, metrics_of: Callable[[Roost], Awaitable[Scrape]]) -> None:
    first: ChatChannel = await roost_app([{"reply": "one"}])
    second: ChatChannel = await roost_app([{"reply": "two"}])
    assert first.app is not None and second.app is not None
    await first.ask("hi")
    one, two = await metrics_of(first.app), await metrics_of(second.app)
    assert value(await one(), "roost_runs_total", agent="default", status="completed") == 1
    assert value(await two(), "roost_runs_total", agent="default", status="completed") == 0


# -- spans to metrics, without an app ---------------------------------------------------


def run_spans(status: str, *tools: tuple[str, dict[str, Any]]) -> list[Span]:
    trace = RunTrace("r1", "console:direct:u1")
    trace.root.attributes["agent"] = "helper"
    llm = trace.start("llm", "llm", provider="anthropic", model="claude-x")
    llm.end(input_tokens=120, output_tokens=30)
    for name, outcome in tools:
        trace.start("tool", name).end(**outcome)
    return trace.finish(status)


class Offered:
    """The tools offered: one, ``search``."""

    def tool_names(self) -> list[str]:
        return ["search"]


def test_tool_outcomes_and_made_up_tool_names_are_counted_in_few_series() -> None:
    metrics = RoostMetrics(tools=Offered())
    metrics.export(run_spans(
        "completed",
        ("search", {"is_error": False}),
        ("search", {"is_error": True, "error_code": "CIRCUIT_OPEN"}),
        ("search", {"is_error": True, "timed_out": True}),
        ("search", {"is_error": True, "skipped": True}),
        ("invented_tool_7", {"is_error": True, "error_code": "UNKNOWN_TOOL"}),
        ("invented_tool_8", {"is_error": True}),
    ))
    scraped = samples(metrics.render().decode())
    for outcome in ("ok", "breaker_open", "timeout", "skipped"):
        assert value(scraped, "roost_tool_calls_total", tool="search", outcome=outcome) == 1
    assert value(scraped, "roost_tool_calls_total", tool="unknown", outcome="error") == 2
    assert value(scraped, "roost_llm_tokens_total", agent="helper", model="claude-x",
                 direction="input") == 120
    assert value(scraped, "roost_runs_total", agent="helper", status="completed") == 1


def test_a_tool_cut_off_by_cancellation_counts_as_cancelled() -> None:
    metrics = RoostMetrics()
    trace = RunTrace("r2", "k")
    trace.start("tool", "slow")  # never ended: the run was cancelled meanwhile
    metrics.export(trace.finish("cancelled", "stop"))
    scraped = samples(metrics.render().decode())
    assert value(scraped, "roost_tool_calls_total", tool="slow", outcome="cancelled") == 1
    assert value(scraped, "roost_runs_total", agent="unknown", status="cancelled") == 1


def test_spans_go_on_to_the_previous_exporter_after_being_counted() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.exported: list[Sequence[Span]] = []

        def export(self, spans: Sequence[Span]) -> None:
            self.exported.append(spans)

    metrics, otel = RoostMetrics(), Recorder()
    metrics.then = otel
    spans = run_spans("failed")
    metrics.export(spans)
    assert otel.exported == [spans]


def test_gauges_that_fail_to_read_leave_the_scrape_working() -> None:
    metrics = RoostMetrics()

    def broken() -> Gauges:
        raise RuntimeError("gone")

    metrics.set_gauges(broken)
    scraped = samples(metrics.render().decode())
    assert value(scraped, "roost_queue_depth") == 0
    metrics.set_gauges(lambda: Gauges({"provider:anthropic": "half_open"}, 4, 2))
    scraped = samples(metrics.render().decode())
    assert value(scraped, "roost_breaker_state", breaker="provider:anthropic") == 1
    assert (value(scraped, "roost_queue_depth"), value(scraped, "roost_active_runs")) == (4, 2)
