"""Resilient tool execution (spec: tool-error-handling §7): classification, backoff,
circuit breakers, timeouts, cascades, failure reporting, trace decisions and metrics.

Retries and breakers run on a fake clock and sleep; only the per-tool and per-turn
timeouts use real (tiny) timeouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.llm import ToolCall
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolResult, ToolRetry
from bot.observability.tracing import RunTrace, Span
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker, Ticket
from bot.tools.breakers import TOOL_BREAKER, Breakers
from bot.tools.classify import classify, error_code
from bot.tools.executor import DEFAULT_RETRY, ToolExecutor, retry_policy
from bot.tools.metrics import ToolMetricsRegistry
from bot.tools.outcomes import RawError, ToolOutcome, turn_timeout_notice

SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
NO_JITTER = ToolRetry(jitter=0.0)
Step = BaseException | str | ToolResult


class FakeTime:
    """A clock that only moves when slept on (or advanced by a test)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FixedRandom(random.Random):
    """``uniform(a, b)`` always returns the point ``at`` of the way from a to b."""

    def __init__(self, at: float) -> None:
        super().__init__(0)
        self.at = at

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.at


class Scripted:
    """A tool body that plays ``steps`` in order (the last one repeats)."""

    def __init__(self, *steps: Step, cost: float = 0.0, time: FakeTime | None = None) -> None:
        self.steps = list(steps)
        self.runs = 0
        self.cost = cost
        self.time = time

    async def __call__(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolResult | str:
        step = self.steps[min(self.runs, len(self.steps) - 1)]
        self.runs += 1
        if self.time is not None:
            self.time.now += self.cost
        if isinstance(step, BaseException):
            raise step
        return step


class Blocking:
    """A tool body that waits on an event that is never set, noting cancellations."""

    def __init__(self, then: Sequence[str] = ()) -> None:
        self.runs = 0
        self.cancelled = 0
        self.then = list(then)
        self.started = asyncio.Event()

    async def __call__(self, ctx: ToolContext, args: Mapping[str, Any]) -> str:
        self.runs += 1
        if self.runs > 1 and self.then:
            return self.then.pop(0)
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "never"


def tool(name: str, body: Callable[[ToolContext, Mapping[str, Any]], Awaitable[ToolResult | str]],
         **manifest: Any) -> Tool:
    return Tool(name, f"the {name} tool", SCHEMA, body, **manifest)


def text(value: str) -> Scripted:
    return Scripted(value)


_ids = iter(range(1_000_000))


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(f"call-{next(_ids)}", name, args)


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture
def context(tmp_path: Path) -> ToolContext:
    return ToolContext("u1", "test", "c1", "default:test:direct:u1", "run-1", tmp_path,
                       deadline=1e12)


def executor(tools: Sequence[Tool], fake: FakeTime, *, breakers: Breakers | None = None,
             metrics: ToolMetricsRegistry | None = None, tool_timeout: float = 30.0,
             turn_timeout: float = 300.0, rng: random.Random | None = None) -> ToolExecutor:
    return ToolExecutor({t.name: t for t in tools},
                        Settings(tool_timeout=tool_timeout, turn_timeout=turn_timeout),
                        breakers=breakers, metrics=metrics, clock=fake.clock, sleep=fake.sleep,
                        rng=rng or FixedRandom(0.5))


class Recorder:
    """Collects callback invocations and the trace of a batch."""

    def __init__(self, failure_text: str | None = None) -> None:
        self.trace = RunTrace("run-1", "default:test:direct:u1")
        self.calls: list[str] = []
        self.results: list[ToolOutcome] = []
        self.failures: list[tuple[ToolCall, RawError]] = []
        self.failure_text = failure_text

    async def on_call(self, c: ToolCall) -> None:
        self.calls.append(c.id)

    async def on_result(self, outcome: ToolOutcome) -> None:
        self.results.append(outcome)

    async def on_failure(self, c: ToolCall, raw: RawError) -> str:
        self.failures.append((c, raw))
        return f"Tool '{c.name}' failed: {raw.message[:50]} [Error ID: err_{len(self.failures)}]"

    def tool_spans(self) -> list[Span]:
        return [s for s in self.trace.spans if s.kind == "tool"]

    def decisions(self, index: int = 0) -> list[dict[str, Any]]:
        decisions: list[dict[str, Any]] = self.tool_spans()[index].attributes["decisions"]
        return decisions


async def run(ex: ToolExecutor, context: ToolContext, *calls: ToolCall,
              rec: Recorder | None = None, handler: bool = True) -> list[ToolOutcome]:
    rec = rec or Recorder()
    return await ex.run_batch(calls, context, trace=rec.trace, on_call=rec.on_call,
                              on_result=rec.on_result,
                              on_failure=rec.on_failure if handler else None)


# --------------------------------------------------------------------------- 7.1 classification

class HTTPError(Exception):
    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class ClientError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__("request failed")
        self.response = _Response(status)


class SchemaValidationError(Exception):
    pass


@pytest.mark.parametrize("error", [
    TimeoutError(),
    TimeoutError("read timed out"),
    ConnectionResetError("connection reset by peer"),
    ConnectionRefusedError(),
    OSError("network is unreachable"),
    ToolError("upstream took too long", code="TIMEOUT"),
    ToolError("Connection timeout after 30s"),
    RuntimeError("Connection timeout after 30s"),
])
def test_network_timeouts_and_connection_errors_are_transient(error: BaseException) -> None:
    assert classify(error) == "transient"


@pytest.mark.parametrize("error", [
    ToolError("Invalid airport code: XYZ", code="INVALID_INPUT"),
    ToolError("'path' must be a string", code="INVALID_ARGUMENT"),
    HTTPError("bad request", 400),
    ToolError("HTTP 400 from the API"),
    SchemaValidationError("field 'x' missing"),
    ToolError("response does not match the schema", code="SCHEMA"),
])
def test_invalid_input_and_schema_failures_are_permanent(error: BaseException) -> None:
    assert classify(error) == "permanent"


@pytest.mark.parametrize("error", [
    HTTPError("slow down", 429),
    ClientError(503),
    ToolError("rate limit exceeded", code="RATE_LIMITED"),
    ToolError("upstream said: HTTP 503 Service Unavailable"),
    RuntimeError("429 Too Many Requests"),
    ToolError("quota", code="QUOTA", retryable=True),
])
def test_rate_limits_and_unavailable_services_are_transient(error: BaseException) -> None:
    assert classify(error) == "transient"


@pytest.mark.parametrize("error", [
    HTTPError("who are you", 401),
    ClientError(403),
    ToolError("token rejected", code="UNAUTHORIZED"),
    PermissionError("permission denied"),
    RuntimeError("status: 401 unauthorized"),
])
def test_auth_failures_are_permanent(error: BaseException) -> None:
    assert classify(error) == "permanent"


@pytest.mark.parametrize("error", [
    HTTPError("gone", 404),
    FileNotFoundError("no such file"),
    ToolError("'a.txt' does not exist", code="NOT_FOUND"),
    NotImplementedError(),
    ToolError("no PDF support", code="UNSUPPORTED"),
    ToolError("'x' is a binary file", code="BINARY_FILE"),  # a tool's own report, not retryable
    "the tool said no",  # the text of an is_error result
])
def test_not_found_unsupported_and_tool_reports_are_permanent(error: BaseException | str) -> None:
    assert classify(error) == "permanent"


def test_unknown_errors_default_to_transient() -> None:
    assert classify(RuntimeError("boom")) == "transient"
    assert classify(KeyError("k")) == "transient"
    assert error_code(RuntimeError("boom")) == "RuntimeError"


def test_error_codes_come_from_the_tool_the_status_the_type_or_the_message() -> None:
    assert error_code(ToolError("x", code="path_escape")) == "PATH_ESCAPE"
    assert error_code(HTTPError("x", 502)) == "502"
    assert error_code(ClientError(404)) == "404"
    assert error_code(TimeoutError()) == "TIMEOUT"
    assert error_code(ConnectionResetError()) == "NETWORK"
    assert error_code(ToolError("got HTTP/1.1 503 from upstream")) == "503"
    assert error_code(ToolError("nothing telling")) == "TOOL_ERROR"
    assert error_code("read 429 bytes") == "TOOL_ERROR"  # a bare number is not a status


def test_tool_manifest_overrides_the_classification() -> None:
    strict = tool("strict", text("x"), permanent_codes=frozenset({"503", "timeout"}))
    lenient = tool("lenient", text("x"), transient_codes=frozenset({"NOT_FOUND", "ValueError"}))
    assert classify(HTTPError("down", 503)) == "transient"
    assert classify(HTTPError("down", 503), strict) == "permanent"
    assert classify(TimeoutError(), strict) == "permanent"
    assert classify(ToolError("not yet", code="NOT_FOUND"), lenient) == "transient"
    assert classify(ValueError("eventually consistent"), lenient) == "transient"


async def test_manifest_permanent_code_stops_retries(fake: FakeTime, context: ToolContext) -> None:
    body = Scripted(HTTPError("maintenance", 503))
    ex = executor([tool("api", body, permanent_codes=frozenset({"503"}))], fake)
    [outcome] = await run(ex, context, call("api"))
    assert body.runs == 1 and fake.sleeps == []
    assert outcome.is_error and outcome.classification == "permanent"


async def test_unknown_tool_fails_permanently_with_the_list_of_tools(
    fake: FakeTime, context: ToolContext
) -> None:
    rec = Recorder()
    ex = executor([tool("search", text("x"))], fake)
    [outcome] = await run(ex, context, call("no_such_tool"), rec=rec)
    assert outcome.is_error and outcome.classification == "permanent"
    assert outcome.content == "Unknown tool 'no_such_tool'. Available tools: search."
    assert outcome.error is not None and outcome.error.code == "UNKNOWN_TOOL"
    assert outcome.attempts == 0 and fake.sleeps == []
    assert rec.failures == []  # the model's own mistake: its message is the fix
    assert rec.decisions()[0]["decision"] == "fail"


async def test_invalid_arguments_keep_their_message_and_never_reach_the_tool(
    fake: FakeTime, context: ToolContext
) -> None:
    body = text("x")
    required = Tool("read", "reads", {"type": "object", "required": ["path"],
                                      "properties": {"path": {"type": "string"}}}, body)
    ex = executor([required], fake)
    missing, wrong = await run(ex, context, call("read"), call("read", path=7))
    assert missing.content == "Tool 'read' was called with invalid arguments: missing 'path'"
    assert "'path' must be string" in wrong.content
    assert missing.classification == wrong.classification == "permanent"
    assert body.runs == 0
    assert ex.metrics.get("read").permanent_error_count == 2


# --------------------------------------------------------------------------- 7.2 retry policy

def test_default_policies_match_the_spec() -> None:
    spec = ToolRetry(max_attempts=5, initial_delay=0.1, multiplier=2.0, max_delay=0.8,
                     max_total=2.0, jitter=0.1)
    assert spec == DEFAULT_RETRY
    # 5 consecutive failures open it, 30 s open, 2 successful trials close it.
    spec_breaker = BreakerPolicy(threshold=5, success_threshold=2, base_delay=30.0,
                                 max_delay=30.0, jitter=0.0)
    assert spec_breaker == TOOL_BREAKER


def next_delay(attempt: int, retry: ToolRetry, rng: random.Random) -> float:
    """The wait before retry ``attempt`` under the tool's declared policy."""
    return retry_policy(retry).delay(attempt, rng=rng)


def backoff_delays(retry: ToolRetry, rng: random.Random) -> list[float]:
    """The waits between all of the policy's attempts."""
    return [next_delay(n, retry, rng) for n in range(1, retry.max_attempts)]


def test_backoff_doubles_from_100ms_and_caps_at_800ms() -> None:
    assert backoff_delays(NO_JITTER, random.Random(1)) == pytest.approx([0.1, 0.2, 0.4, 0.8])
    longer = ToolRetry(max_attempts=7, jitter=0.0)
    assert backoff_delays(longer, random.Random(1)) == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 0.8, 0.8])
    assert next_delay(3, NO_JITTER, random.Random(1)) == pytest.approx(0.4)


def test_jitter_stays_within_ten_percent_and_varies() -> None:
    assert next_delay(1, DEFAULT_RETRY, FixedRandom(0.0)) == pytest.approx(0.09)
    assert next_delay(1, DEFAULT_RETRY, FixedRandom(1.0)) == pytest.approx(0.11)
    assert next_delay(4, DEFAULT_RETRY, FixedRandom(1.0)) == pytest.approx(0.88)
    rng = random.Random(42)
    samples = [next_delay(2, DEFAULT_RETRY, rng) for _ in range(500)]
    assert all(0.18 <= s <= 0.22 for s in samples)
    assert len(set(samples)) > 400
    assert min(samples) < 0.185 and max(samples) > 0.215


async def test_transient_failures_are_retried_with_backoff_up_to_five_attempts(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(ConnectionResetError("connection reset"))
    loose = Breakers(dataclasses.replace(TOOL_BREAKER, threshold=100), clock=fake.clock)
    rec = Recorder()
    ex = executor([tool("flaky", body)], fake, breakers=loose)
    [outcome] = await run(ex, context, call("flaky"), rec=rec)
    assert body.runs == 5 and outcome.attempts == 5
    assert fake.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert outcome.is_error and outcome.classification == "transient"
    assert [d["decision"] for d in rec.decisions()] == ["retry"] * 4 + ["fail"]
    assert rec.decisions()[-1]["reason"] == "max attempts"


async def test_retries_stop_at_the_total_time_budget(fake: FakeTime, context: ToolContext) -> None:
    body = Scripted(TimeoutError("upstream timed out"), cost=0.5, time=fake)
    rec = Recorder()
    ex = executor([tool("slow", body)], fake)
    [outcome] = await run(ex, context, call("slow"), rec=rec)
    # 0.5 run, 0.1 wait, 0.5 run, 0.2 wait, 0.5 run = 1.8s; another 0.4s wait would pass 2s.
    assert body.runs == 3 and fake.sleeps == pytest.approx([0.1, 0.2])
    assert outcome.is_error and outcome.attempts == 3
    assert rec.decisions()[-1]["reason"] == "max total time"


async def test_tool_specific_retry_policy_overrides_the_defaults(
    fake: FakeTime, context: ToolContext
) -> None:
    policy = ToolRetry(max_attempts=3, initial_delay=0.05, multiplier=3.0, max_delay=2.0,
                       max_total=5.0, jitter=0.0)
    body = Scripted(HTTPError("busy", 503))
    ex = executor([tool("custom", body, retry=policy)], fake)
    [outcome] = await run(ex, context, call("custom"))
    assert body.runs == 3 and fake.sleeps == pytest.approx([0.05, 0.15])
    assert outcome.attempts == 3


async def test_retry_succeeds_after_transient_errors_invisibly_to_the_model(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(ConnectionResetError(), HTTPError("busy", 503), "42 flights")
    rec = Recorder()
    ex = executor([tool("flight_search", body)], fake)
    [outcome] = await run(ex, context, call("flight_search"), rec=rec)
    assert outcome.content == "42 flights" and not outcome.is_error
    assert outcome.attempts == 3 and outcome.error is None
    assert rec.failures == [] and len(rec.calls) == 1 and rec.results == [outcome]
    span = rec.tool_spans()[0]
    assert span.attributes["retries"] == 2 and not span.error
    assert [d["decision"] for d in rec.decisions()] == ["retry", "retry"]


async def test_permanent_errors_escalate_at_once_without_retries(
    fake: FakeTime, context: ToolContext
) -> None:
    error = ToolError("Invalid airport code: XYZ", code="INVALID_INPUT",
                      details={"field": "origin"})
    body = Scripted(error)
    rec = Recorder()
    ex = executor([tool("flight_search", body)], fake)
    [outcome] = await run(ex, context, call("flight_search", q="XYZ"), rec=rec)
    assert body.runs == 1 and fake.sleeps == []
    assert outcome.is_error and outcome.classification == "permanent"
    assert outcome.content.startswith("Tool 'flight_search' failed: Invalid airport code")
    assert outcome.content.endswith("[Error ID: err_1]")
    [(failed_call, raw)] = rec.failures
    assert failed_call.name == "flight_search"
    assert raw.exception is error and raw.code == "INVALID_INPUT"
    assert raw.details == {"field": "origin"} and raw.attempts == 1
    assert raw.as_dict()["classification"] == "permanent"


# --------------------------------------------------------------------------- 7.3 circuit breaker

def state(breaker: CircuitBreaker) -> str:
    """The breaker's state (a call, so mypy does not narrow it between checks)."""
    return breaker.state


def tool_breaker(fake: FakeTime) -> CircuitBreaker:
    return CircuitBreaker(TOOL_BREAKER, name="tool 'api'", clock=fake.clock)


def admitted(breaker: CircuitBreaker) -> Ticket:
    ticket = breaker.try_admit()
    assert ticket is not None
    return ticket


def fail(breaker: CircuitBreaker, times: int = 1) -> list[bool]:
    """Admit and fail ``times`` calls; whether each failure opened the breaker."""
    return [breaker.record_failure(admitted(breaker), "down") for _ in range(times)]


def test_breaker_opens_after_five_consecutive_failures(fake: FakeTime) -> None:
    breaker = tool_breaker(fake)
    assert fail(breaker, 4) == [False] * 4
    assert state(breaker) == "closed" and breaker.try_admit() is not None
    assert fail(breaker) == [True]
    assert state(breaker) == "open" and breaker.try_admit() is None and breaker.opens == 1


def test_a_success_resets_the_consecutive_failure_count(fake: FakeTime) -> None:
    breaker = tool_breaker(fake)
    fail(breaker, 4)
    breaker.record_success(admitted(breaker))
    fail(breaker, 4)
    assert state(breaker) == "closed"


def test_open_breaker_half_opens_after_30s_with_a_single_trial(fake: FakeTime) -> None:
    breaker = tool_breaker(fake)
    fail(breaker, 5)
    fake.now += 29.9
    assert state(breaker) == "open" and breaker.try_admit() is None
    fake.now += 0.1
    assert state(breaker) == "half_open"
    trial = breaker.try_admit()
    assert trial is not None and trial.probe
    assert breaker.try_admit() is None  # one trial at a time


def test_half_open_breaker_closes_after_two_successes(fake: FakeTime) -> None:
    breaker = tool_breaker(fake)
    fail(breaker, 5)
    fake.now += 30
    breaker.record_success(admitted(breaker))
    assert state(breaker) == "half_open"
    breaker.record_success(admitted(breaker))
    assert state(breaker) == "closed" and breaker.failures == 0


def test_a_failed_trial_reopens_the_breaker_and_restarts_the_timeout(fake: FakeTime) -> None:
    breaker = tool_breaker(fake)
    fail(breaker, 5)
    fake.now += 30
    assert fail(breaker) == [True]
    assert state(breaker) == "open" and breaker.opens == 2
    fake.now += 29
    assert state(breaker) == "open"
    fake.now += 1
    assert state(breaker) == "half_open"


def test_a_trial_given_back_without_a_verdict_frees_the_slot(fake: FakeTime) -> None:
    breaker = tool_breaker(fake)
    fail(breaker, 5)
    fake.now += 30
    breaker.record_abandoned(admitted(breaker))
    assert state(breaker) == "half_open" and breaker.try_admit() is not None


async def test_open_breaker_fails_fast_without_running_the_tool(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(HTTPError("down", 503))
    once = ToolRetry(max_attempts=1)
    rec = Recorder()
    ex = executor([tool("api", body, retry=once)], fake)
    for _ in range(5):
        await run(ex, context, call("api"), rec=rec)
    assert ex.breakers.get("api").state == "open"
    assert rec.decisions(4)[-1]["decision"] == "open"
    [outcome] = await run(ex, context, call("api"), rec=rec)
    assert body.runs == 5  # not run again
    assert outcome.is_error and outcome.attempts == 0
    assert outcome.error is not None and outcome.error.code == "CIRCUIT_OPEN"
    assert rec.decisions(5)[0]["decision"] == "open"
    assert rec.decisions(5)[0]["circuit_breaker_state"] == "open"


async def test_breaker_half_opens_and_closes_through_the_executor(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(*([HTTPError("down", 503)] * 5), "up", "still up")
    ex = executor([tool("api", body, retry=ToolRetry(max_attempts=1))], fake)
    for _ in range(5):
        await run(ex, context, call("api"))
    fake.now += 30
    [trial] = await run(ex, context, call("api"))
    assert trial.content == "up" and ex.breakers.get("api").state == "half_open"
    [second] = await run(ex, context, call("api"))
    assert second.content == "still up" and ex.breakers.get("api").state == "closed"


async def test_permanent_errors_do_not_count_toward_the_breaker(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(ToolError("bad input", code="INVALID_INPUT"))
    ex = executor([tool("api", body)], fake)
    for _ in range(10):
        await run(ex, context, call("api"))
    breaker = ex.breakers.get("api")
    assert body.runs == 10
    assert state(breaker) == "closed" and breaker.failures == 0


async def test_breaker_counts_persist_across_retries_and_calls(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(HTTPError("busy", 429))
    rec = Recorder()
    ex = executor([tool("api", body, retry=ToolRetry(max_attempts=3))], fake)
    [first] = await run(ex, context, call("api"), rec=rec)
    assert first.attempts == 3 and ex.breakers.get("api").failures == 3
    [second] = await run(ex, context, call("api"), rec=rec)
    # The fifth consecutive failure (the second call's second attempt) opens it.
    assert second.attempts == 2 and body.runs == 5
    assert [d["decision"] for d in rec.decisions(1)] == ["retry", "open"]
    assert rec.decisions(1)[-1]["circuit_breaker_state"] == "open"


async def test_breaker_state_is_shared_across_sessions_using_one_registry(
    fake: FakeTime, context: ToolContext, tmp_path: Path
) -> None:
    breakers = Breakers(clock=fake.clock)
    body = Scripted(*([HTTPError("down", 503)] * 5), "back")
    tools = [tool("api", body)]
    session_a = executor(tools, fake, breakers=breakers)
    session_b = executor(tools, fake, breakers=breakers)
    other = ToolContext("u2", "test", "c2", "default:test:direct:u2", "run-2", tmp_path, 1e12)
    [failed] = await run(session_a, context, call("api"))
    assert failed.attempts == 5 and breakers.get("api").state == "open"
    [fast] = await run(session_b, other, call("api"))
    assert fast.error is not None and fast.error.code == "CIRCUIT_OPEN" and body.runs == 5
    fake.now += 30
    [trial] = await run(session_b, other, call("api"))
    assert trial.content == "back" and breakers.get("api").state == "half_open"


# --------------------------------------------------------------------------- 7.4 timeouts

async def test_per_tool_timeout_cancels_the_tool_and_is_retried_as_transient(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Blocking(then=["done on the second try"])
    rec = Recorder()
    ex = executor([tool("slow", body, timeout=0.05)], fake)
    [outcome] = await run(ex, context, call("slow"), rec=rec)
    assert body.cancelled == 1
    assert outcome.content == "done on the second try" and outcome.attempts == 2
    [decision] = rec.decisions()
    assert decision["decision"] == "retry" and decision["classification"] == "transient"
    assert decision["code"] == "TIMEOUT" and decision["timed_out"] is True


async def test_timeouts_are_reported_and_recorded_in_the_trace(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Blocking()
    rec = Recorder()
    ex = executor([tool("slow", body, retry=ToolRetry(max_attempts=2))], fake,
                  tool_timeout=0.05)
    [outcome] = await run(ex, context, call("slow"), rec=rec, handler=False)
    assert body.runs == 2 and body.cancelled == 2
    assert outcome.content == "Tool 'slow' timed out after 0.05s. (gave up after 2 attempts)"
    assert outcome.classification == "transient"
    assert outcome.error is not None and outcome.error.timed_out
    assert isinstance(outcome.error.exception, TimeoutError)
    span = rec.tool_spans()[0]
    assert span.error and span.attributes["timed_out"] is True
    assert [(d["decision"], d["code"]) for d in rec.decisions()] == [
        ("retry", "TIMEOUT"), ("fail", "TIMEOUT")]
    assert ex.metrics.get("slow").timeout_count == 2


async def test_per_turn_timeout_keeps_finished_results_and_skips_the_rest(
    fake: FakeTime, context: ToolContext
) -> None:
    slow = Blocking()
    rec = Recorder()
    ex = executor([tool("flights", text("3 flights")), tool("hotels", slow)], fake,
                  turn_timeout=0.1)
    done, skipped = await run(ex, context, call("flights"), call("hotels"), rec=rec)
    assert done.content == "3 flights" and not done.is_error and not done.skipped
    assert skipped.skipped and skipped.skip_reason == "turn_timeout" and skipped.is_error
    assert "time limit" in skipped.content and "0.1s" in skipped.content
    assert slow.cancelled == 1
    assert {o.call.name for o in rec.results} == {"flights", "hotels"}
    assert rec.decisions(1)[-1]["decision"] == "skip"
    assert rec.tool_spans()[1].attributes["skip_reason"] == "turn_timeout"
    assert turn_timeout_notice([done, skipped]) == (
        "Finished flights, but hotels ran out of time and was skipped.")
    assert turn_timeout_notice([done]) == ""


async def test_cancelling_the_run_cancels_running_tools(
    fake: FakeTime, context: ToolContext
) -> None:
    slow = Blocking()
    rec = Recorder()
    ex = executor([tool("slow", slow)], fake)
    task = asyncio.create_task(run(ex, context, call("slow"), rec=rec))
    await slow.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.cancelled == 1
    rec.trace.finish("cancelled")
    assert rec.tool_spans()[0].attributes["interrupted"] is True


# --------------------------------------------------------------------------- 7.5 cascades

async def test_dependent_tools_are_skipped_when_a_requirement_fails(
    fake: FakeTime, context: ToolContext
) -> None:
    a = Scripted(ToolError("no such city", code="NOT_FOUND"))
    b, c, d = text("b"), text("c"), text("d")
    rec = Recorder()
    ex = executor([tool("geocode", a), tool("weather", b, requires=("geocode",)),
                   tool("outfit", c, requires=("weather",)), tool("news", d)], fake)
    outcomes = await run(ex, context, call("outfit"), call("weather"), call("geocode"),
                         call("news"), rec=rec)
    outfit, weather, geocode, news = outcomes
    assert geocode.is_error and not geocode.skipped
    assert weather.skipped and weather.skip_reason == "dependency" and weather.is_error
    assert "needs the result of 'geocode'" in weather.content
    assert outfit.skipped and "needs the result of 'weather'" in outfit.content
    assert b.runs == c.runs == 0
    assert news.content == "d" and not news.is_error
    assert len(rec.results) == 4 and len(rec.failures) == 1
    skip = next(s for s in rec.tool_spans() if s.name == "weather").attributes["decisions"][0]
    assert skip["decision"] == "skip" and skip["failed_requirements"] == ["geocode"]


async def test_optional_dependants_are_skipped_quietly_and_required_ones_escalate(
    fake: FakeTime, context: ToolContext
) -> None:
    ex = executor([tool("base", Scripted(ToolError("denied", code="FORBIDDEN"))),
                   tool("extra", text("x"), requires=("base",), optional=True),
                   tool("core", text("y"), requires=("base",))], fake)
    _, extra, core = await run(ex, context, call("base"), call("extra"), call("core"))
    assert extra.skipped and not extra.is_error and "optional" in extra.content
    assert core.skipped and core.is_error


async def test_dependants_get_their_default_when_a_requirement_fails(
    fake: FakeTime, context: ToolContext
) -> None:
    after = text("after")
    ex = executor([tool("rates", Scripted(ToolError("bad currency", code="INVALID_INPUT"))),
                   tool("convert", text("never"), requires=("rates",), default="1.0"),
                   tool("report", after, requires=("convert",))], fake)
    _, convert, report = await run(ex, context, call("rates"), call("convert"), call("report"))
    assert convert.content == "1.0" and not convert.is_error
    assert convert.skipped and convert.used_default
    assert report.content == "after" and after.runs == 1  # the default keeps the chain going


async def test_dependants_are_skipped_when_a_requirement_exhausts_its_retries(
    fake: FakeTime, context: ToolContext
) -> None:
    ex = executor([tool("a", Scripted(HTTPError("down", 503)), retry=ToolRetry(max_attempts=2)),
                   tool("b", text("b"), requires=("a",))], fake)
    a, b = await run(ex, context, call("a"), call("b"))
    assert a.attempts == 2 and a.classification == "transient"
    assert b.skipped


async def test_dependants_wait_for_requirements_while_independent_calls_run_concurrently(
    fake: FakeTime, context: ToolContext
) -> None:
    order: list[str] = []
    barrier = asyncio.Barrier(2)

    async def first(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        await barrier.wait()  # only passes if 'side' runs at the same time
        order.append("first")
        return "1"

    async def side(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        await barrier.wait()
        order.append("side")
        return "s"

    async def second(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        order.append("second")
        return "2"

    once = ToolRetry(max_attempts=1)
    ex = executor([tool("first", first, timeout=2.0, retry=once),
                   tool("side", side, timeout=2.0, retry=once),
                   tool("second", second, requires=("first",))], fake)
    outcomes = await run(ex, context, call("second"), call("first"), call("side"))
    assert [o.content for o in outcomes] == ["2", "1", "s"]
    assert order.index("second") > order.index("first")


async def test_requirements_outside_the_batch_and_cycles_do_not_block(
    fake: FakeTime, context: ToolContext
) -> None:
    ex = executor([tool("a", text("a"), requires=("b",)), tool("b", text("b"), requires=("a",)),
                   tool("c", text("c"), requires=("absent",))], fake)
    async with asyncio.timeout(2):
        outcomes = await run(ex, context, call("a"), call("b"), call("c"))
    assert [o.content for o in outcomes] == ["a", "b", "c"]


async def test_independent_calls_continue_despite_failures(
    fake: FakeTime, context: ToolContext
) -> None:
    ex = executor([tool("bad", Scripted(RuntimeError("kaboom"))), tool("good", text("fine"))],
                  fake)
    bad, good = await run(ex, context, call("bad"), call("good"))
    assert bad.is_error and good.content == "fine" and not good.is_error


# --------------------------------------------------------------------------- failures in general

async def test_unexpected_exceptions_are_handled_like_failed_results(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(RuntimeError("kaboom"), KeyError("missing"), ZeroDivisionError("x"))
    ex = executor([tool("buggy", body, retry=ToolRetry(max_attempts=3))], fake)
    [outcome] = await run(ex, context, call("buggy"), handler=False)
    assert body.runs == 3 and outcome.is_error and outcome.classification == "transient"
    assert outcome.content == "Tool 'buggy' failed: x (gave up after 3 attempts)"
    assert outcome.error is not None and isinstance(outcome.error.exception, ZeroDivisionError)
    assert "ZeroDivisionError" in outcome.error.traceback
    assert outcome.error.as_dict()["error_type"] == "ZeroDivisionError"


async def test_error_results_go_through_the_same_handling_as_exceptions(
    fake: FakeTime, context: ToolContext
) -> None:
    flaky = Scripted(ToolResult("HTTP 503 from upstream", is_error=True), "ok")
    refusing = Scripted(ToolResult("I will not do that", is_error=True))
    rec = Recorder()
    ex = executor([tool("flaky", flaky), tool("refusing", refusing)], fake)
    ok, refused = await run(ex, context, call("flaky"), call("refusing"), rec=rec)
    assert ok.content == "ok" and ok.attempts == 2
    assert refused.is_error and refused.classification == "permanent" and refusing.runs == 1
    [(_, raw)] = rec.failures
    assert raw.message == "I will not do that" and raw.exception is None


async def test_tool_errors_keep_their_code_in_the_default_text(
    fake: FakeTime, context: ToolContext
) -> None:
    ex = executor([tool("read", Scripted(ToolError("'..' is outside", code="PATH_ESCAPE")))],
                  fake)
    [outcome] = await run(ex, context, call("read"), handler=False)
    assert outcome.content == "Tool 'read' failed: [PATH_ESCAPE] '..' is outside"


async def test_a_failing_failure_handler_falls_back_to_the_default_text(
    fake: FakeTime, context: ToolContext
) -> None:
    async def broken(c: ToolCall, raw: RawError) -> str:
        raise RuntimeError("error store down")

    ex = executor([tool("api", Scripted(ToolError("nope", code="FORBIDDEN")))], fake)
    outcomes = await ex.run_batch([call("api")], context, trace=RunTrace("r", "s"),
                                  on_failure=broken)
    assert outcomes[0].content == "Tool 'api' failed: [FORBIDDEN] nope"


async def test_results_keep_call_order_and_each_call_is_announced_once(
    fake: FakeTime, context: ToolContext
) -> None:
    async def late(ctx: ToolContext, args: Mapping[str, Any]) -> str:
        await asyncio.sleep(0.01)
        return "late"

    rec = Recorder()
    ex = executor([tool("late", late), tool("soon", Scripted(TimeoutError(), "soon"))], fake)
    calls = [call("late"), call("soon")]
    outcomes = await run(ex, context, *calls, rec=rec)
    assert [o.content for o in outcomes] == ["late", "soon"]
    assert rec.calls == [c.id for c in calls]
    assert [o.call.name for o in rec.results] == ["soon", "late"]  # as they finish
    assert await ex.run_batch([], context, trace=rec.trace) == []


# --------------------------------------------------------------------------- trace and metrics

async def test_turn_trace_records_every_error_handling_decision(
    fake: FakeTime, context: ToolContext
) -> None:
    body = Scripted(ConnectionResetError("reset"), HTTPError("busy", 503),
                    ToolError("bad date", code="INVALID_INPUT"))
    rec = Recorder()
    ex = executor([tool("flight_search", body)], fake)
    await run(ex, context, call("flight_search"), rec=rec)
    span = rec.tool_spans()[0]
    decisions = rec.decisions()
    assert [d["decision"] for d in decisions] == ["retry", "retry", "fail"]
    assert [d["classification"] for d in decisions] == ["transient", "transient", "permanent"]
    assert [d["code"] for d in decisions] == ["NETWORK", "503", "INVALID_INPUT"]
    assert [d["retry_count"] for d in decisions] == [0, 1, 2]
    assert all(d["event_type"] == "ToolError" and d["tool_id"] == "flight_search"
               and d["circuit_breaker_state"] == "closed" and d["timestamp"]
               for d in decisions)
    assert decisions[0]["delay_ms"] == pytest.approx(100.0)
    assert decisions[2]["error"] == "bad date"
    assert span.error and span.attributes["attempts"] == 3
    assert span.attributes["classification"] == "permanent"
    assert span.attributes["error_code"] == "INVALID_INPUT"
    assert span.duration_ms > 0


async def test_metrics_count_errors_retries_opens_and_skips(
    fake: FakeTime, context: ToolContext
) -> None:
    metrics = ToolMetricsRegistry()
    breakers = Breakers(dataclasses.replace(TOOL_BREAKER, threshold=2), clock=fake.clock)
    tools = [tool("flaky", Scripted(HTTPError("busy", 429), HTTPError("busy", 429), "ok")),
             tool("broken", Scripted(ToolError("bad", code="INVALID_INPUT"))),
             tool("down", Scripted(ConnectionResetError()), retry=ToolRetry(max_attempts=1)),
             tool("after", text("x"), requires=("broken",))]
    ex = executor(tools, fake, metrics=metrics, breakers=breakers)
    loose = Breakers(dataclasses.replace(TOOL_BREAKER, threshold=100), clock=fake.clock)
    await run(executor(tools, fake, metrics=metrics, breakers=loose), context, call("flaky"))
    await run(ex, context, call("broken"), call("after"))
    for _ in range(3):
        await run(ex, context, call("down"))
    snap = metrics.snapshot()
    assert snap["flaky"]["calls"] == 1
    assert snap["flaky"]["error_count"] == snap["flaky"]["transient_error_count"] == 2
    assert snap["flaky"]["retry_count"] == 2 and snap["flaky"]["retry_successes"] == 1
    assert snap["flaky"]["retry_success_rate"] == pytest.approx(0.5)
    assert snap["broken"]["permanent_error_count"] == 1 and snap["broken"]["retry_count"] == 0
    assert snap["broken"]["retry_success_rate"] is None
    assert snap["after"]["skipped"] == 1
    assert snap["down"]["circuit_breaker_opens"] == 1 and snap["down"]["short_circuits"] == 1
    assert snap["down"]["error_count"] == 2
    status = ex.snapshot()
    assert status["down"]["breaker"]["state"] == "open"
    assert status["broken"]["breaker"]["state"] == "closed"
