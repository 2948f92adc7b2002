"""Prompt caching, through the real ``anthropic`` SDK against the fake's cache accounting.

Roost marks at most 4 breakpoints (last tool, system prompt, the previous
request's final message, this request's final message) and keeps everything
before them byte-identical between requests of one chat; the fake
(:mod:`bot.testing.anthropic_cache`) reads and writes prefixes as the real API
documents it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from bot.config.budgets import ModelPrice
from bot.contracts.llm import ChatMessage, LLMRequest, ToolCall, ToolSpec
from bot.engine.compaction import SUMMARY_SYSTEM
from bot.storage.usage import day_of
from bot.testing.anthropic import FakeAnthropic, ToolUse
from bot.testing.anthropic_cache import CacheUsage, min_cacheable_tokens
from bot.testing.openai import FakeOpenAI
from plugins.anthropic_provider import AnthropicProvider
from tests.conftest import AppFactory
from tests.provider_helpers import ANTHROPIC_KEY as KEY
from tests.provider_helpers import anthropic_for, openai_for
from tests.test_budgets import Blocker

LONG_SYSTEM = "You are Roost, a careful assistant. " * 200
"""About 1,800 tokens by the fake's estimate: over Sonnet's 1024-token minimum."""
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = (ToolSpec("read_file", "Read a file.", SCHEMA),
         ToolSpec("write_file", "Write a file.", SCHEMA))


class Clock:
    """A clock the test moves by hand: cache entries expire without sleeping."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def fake(clock: Clock) -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=KEY, clock=clock) as server:
        yield server


@pytest.fixture
async def provider(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    llm = anthropic_for(fake)
    yield llm
    await llm.aclose()


def request(*messages: ChatMessage, system: str = LONG_SYSTEM, note: str = "",
            model: str = "claude-sonnet-test") -> LLMRequest:
    return LLMRequest(model=model, system=system, messages=messages, tools=TOOLS, note=note)


def marks(body: dict[str, Any]) -> int:
    """The ``cache_control`` blocks of a request body, wherever they are."""
    count = 0

    def walk(value: Any) -> None:
        nonlocal count
        if isinstance(value, dict):
            count += "cache_control" in value
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk({k: body.get(k) for k in ("tools", "system", "messages")})
    return count


# -- the provider ------------------------------------------------------------------


async def test_the_next_request_reads_everything_the_previous_one_sent_from_the_cache(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_text("Hello Ann.")
    fake.reply_text("Fine, thanks.")
    first = (ChatMessage("user", "hi, I'm Ann"),)
    one = await provider.complete(request(*first))
    two = await provider.complete(request(*first, ChatMessage("assistant", "Hello Ann."),
                                          ChatMessage("user", "how are you?")))

    written, read = fake.cache_usage
    assert (written.read, written.uncached) == (0, 0)  # all of it written...
    assert written.written > min_cacheable_tokens("claude-sonnet-test")
    assert read.read == written.written  # ...and all of it read by the next request
    assert read.written > 0  # the new turn is written for the one after
    # Usage: input_tokens is every input token, the cached parts inside it.
    assert (one.usage.cache_write_tokens, one.usage.cache_read_tokens) == (written.written, 0)
    assert one.usage.input_tokens == written.total
    assert (two.usage.cache_read_tokens, two.usage.cache_write_tokens) == (read.read,
                                                                           read.written)
    assert two.usage.input_tokens == read.total


async def test_a_tool_loop_reads_the_previous_iteration_from_the_cache(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_tool_calls(ToolUse("read_file", {"path": "a.txt"}, id="toolu_1"))
    fake.reply_tool_calls(ToolUse("read_file", {"path": "b.txt"}, id="toolu_2"))
    fake.reply_text("Both read.")
    convo = [ChatMessage("user", "read a.txt and b.txt")]
    await provider.complete(request(*convo))
    for i, name in ((1, "a.txt"), (2, "b.txt")):
        convo += [ChatMessage("assistant", "", tool_calls=(
                      ToolCall(f"toolu_{i}", "read_file", {"path": name}),)),
                  ChatMessage("tool", f"contents of {name}", tool_call_id=f"toolu_{i}",
                              tool_name="read_file")]
        await provider.complete(request(*convo, note="<TOOL_EXECUTION_SUMMARY>...</"
                                        "TOOL_EXECUTION_SUMMARY>"))

    usages = fake.cache_usage
    for before, after in itertools.pairwise(usages):
        assert after.read == before.read + before.written  # nothing re-written
        assert after.uncached < 30  # only the note is paid in full


async def test_a_changing_note_after_the_breakpoints_keeps_the_cached_prefix(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    """The time moves every turn; it travels in the note, after the last breakpoint."""
    fake.reply_always("ok")
    first = (ChatMessage("user", "what time is it?"),)
    await provider.complete(request(*first, note="Current time: 2026-11-23 21:28 UTC (Monday)."))
    await provider.complete(request(*first, ChatMessage("assistant", "21:28."),
                                    ChatMessage("user", "and now?"),
                                    note="Current time: 2026-11-23 21:35 UTC (Monday)."))

    one, two = fake.cache_usage
    assert two.read == one.written
    last = fake.last_request.body["messages"][-1]["content"]
    assert last[-1] == {"type": "text", "text": "Current time: 2026-11-23 21:35 UTC (Monday)."}
    assert "cache_control" in last[-2]  # the breakpoint comes before the note


async def test_requests_never_carry_more_than_four_breakpoints(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_always("ok")
    convo: list[ChatMessage] = []
    for turn in range(6):
        convo.append(ChatMessage("user", f"question {turn}"))
        await provider.complete(request(*convo, note="now"))
        convo.append(ChatMessage("assistant", f"answer {turn}"))
    assert [marks(r.body) for r in fake.requests] == [3, 4, 4, 4, 4, 4]
    assert all(r.body["system"][-1]["cache_control"] == {"type": "ephemeral"}
               for r in fake.requests)


async def test_a_prompt_below_the_minimum_is_not_cached_and_not_refused(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_always("ok")
    response = await provider.complete(request(ChatMessage("user", "hi"), system="be brief"))
    assert response.usage.cache_write_tokens == response.usage.cache_read_tokens == 0
    assert response.usage.input_tokens > 0
    assert fake.cache.entries == {}
    assert marks(fake.last_request.body) == 3  # marked all the same


async def test_haiku_class_models_need_twice_the_prefix_to_cache(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.reply_always("ok")
    system = "You are Roost, a careful assistant. " * 150  # ~1,350 tokens by the estimate
    sonnet = await provider.complete(request(ChatMessage("user", "hi"), system=system))
    haiku = await provider.complete(request(ChatMessage("user", "hi"), system=system,
                                            model="claude-haiku-test"))
    assert sonnet.usage.cache_write_tokens > 0
    assert haiku.usage.cache_write_tokens == 0


async def test_an_entry_lives_five_minutes_from_its_last_read_then_is_written_again(
    fake: FakeAnthropic, provider: AnthropicProvider, clock: Clock
) -> None:
    fake.reply_always("ok")
    same = request(ChatMessage("user", "hi"))

    def last() -> CacheUsage:
        return fake.cache_usage[-1]

    await provider.complete(same)
    assert last().written > 0
    clock.advance(240)
    await provider.complete(same)
    assert (last().read, last().written) == (fake.cache_usage[0].written, 0)
    clock.advance(240)  # 480 s after the write, 240 s after the read that refreshed it
    await provider.complete(same)
    assert last().read > 0
    clock.advance(301)
    await provider.complete(same)
    assert (last().read, last().written) == (0, fake.cache_usage[0].written)


async def test_without_prompt_caching_nothing_is_marked_or_cached(fake: FakeAnthropic) -> None:
    fake.reply_always("ok")
    llm = anthropic_for(fake)
    llm.prompt_cache = False
    try:
        response = await llm.complete(request(ChatMessage("user", "hi")))
    finally:
        await llm.aclose()
    assert marks(fake.last_request.body) == 0
    assert response.usage.cache_write_tokens == 0
    assert response.usage.input_tokens == fake.cache_usage[0].uncached > 1000


# -- the fake, as the real API -------------------------------------------------------


def _client(fake: FakeAnthropic) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)


async def test_the_fake_refuses_five_breakpoints_with_the_apis_400(fake: FakeAnthropic) -> None:
    fake.reply_always("ok")
    cached: Any = {"type": "ephemeral"}
    client = _client(fake)
    try:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="claude-sonnet-test", max_tokens=10,
                system=[{"type": "text", "text": "a", "cache_control": cached},
                        {"type": "text", "text": "b", "cache_control": cached}],
                messages=[{"role": "user", "content": [
                    {"type": "text", "text": t, "cache_control": cached}
                    for t in ("c", "d", "e")]}])
    finally:
        await client.close()
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error",
                  "message": "A maximum of 4 blocks with cache_control may be provided. "
                             "Found 5."},
        "request_id": caught.value.body["request_id"],  # type: ignore[index]
    }
    assert fake.cache.entries == {}


async def test_the_fake_reports_cache_usage_in_plain_and_streamed_answers(
    fake: FakeAnthropic,
) -> None:
    fake.reply_always("ok")
    cached: Any = {"type": "ephemeral"}
    body: Any = {"model": "claude-sonnet-test", "max_tokens": 10,
                 "system": [{"type": "text", "text": LONG_SYSTEM, "cache_control": cached}],
                 "messages": [{"role": "user", "content": "hi"}]}
    client = _client(fake)
    try:
        plain = await client.messages.create(**body)
        async with client.messages.stream(**body) as stream:
            streamed = await stream.get_final_message()
    finally:
        await client.close()
    write, read = fake.cache_usage
    assert plain.usage.cache_creation_input_tokens == write.written > 0
    assert plain.usage.cache_read_input_tokens == 0
    assert plain.usage.input_tokens == write.uncached > 0  # "hi", after the breakpoint
    assert streamed.usage.cache_read_input_tokens == read.read == write.written
    assert streamed.usage.cache_creation_input_tokens == 0
    assert streamed.usage.input_tokens == read.uncached


async def test_the_lookback_finds_a_prefix_up_to_twenty_blocks_before_a_breakpoint(
    fake: FakeAnthropic,
) -> None:
    fake.reply_always("ok")
    cached: Any = {"type": "ephemeral"}
    system: Any = [{"type": "text", "text": LONG_SYSTEM}]

    def body(blocks: int, mark_at: int) -> Any:
        content = [{"type": "text", "text": f"line {i}"} for i in range(blocks)]
        content[mark_at] = {**content[mark_at], "cache_control": cached}
        return {"model": "claude-sonnet-test", "max_tokens": 10, "system": system,
                "messages": [{"role": "user", "content": content}]}

    client = _client(fake)
    try:
        await client.messages.create(**body(5, 4))  # writes the prefix through line 4
        await client.messages.create(**body(25, 24))  # 20 blocks later: still found
        await client.messages.create(**body(5, 4))
        await client.messages.create(**body(30, 29))  # 25 blocks later (past line 24: found)
        fake.cache.clear()
        await client.messages.create(**body(5, 4))
        await client.messages.create(**body(27, 26))  # 22 blocks later: out of reach
    finally:
        await client.close()
    found = [u.read > 0 for u in fake.cache_usage]
    assert found == [False, True, True, True, False, False]


async def test_an_unknown_cache_control_type_is_refused(fake: FakeAnthropic) -> None:
    client = _client(fake)
    try:
        with pytest.raises(anthropic.BadRequestError, match="Input should be 'ephemeral'"):
            await client.messages.create(
                model="m", max_tokens=10,
                messages=[{"role": "user", "content": [
                    {"type": "text", "text": "x",
                     "cache_control": {"type": "persistent"}}]}])  # type: ignore[typeddict-item]
    finally:
        await client.close()


# -- whole runs ----------------------------------------------------------------------


async def test_a_conversation_reads_the_previous_turn_from_the_cache_from_turn_two(
    make_app: AppFactory,
) -> None:
    async with FakeAnthropic() as fake:
        fake.reply_tool_calls(ToolUse("write_file", {"path": "a.txt", "content": "hi"}))
        fake.reply_text("Saved a.txt.")
        fake.reply_text("You asked me to save a file.")
        fake.reply_text("Nothing else.")
        app, channel, _ = await make_app(
            None, provider="anthropic", anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url, model="claude-sonnet-test", admins=["test:boss"])
        for text in ("save hi in a.txt", "what did I ask?", "anything else?"):
            await channel.say(text)
            await channel.settle()
        assert channel.replies == ["Saved a.txt.", "You asked me to save a file.",
                                   "Nothing else."]

        usages = fake.cache_usage
        assert usages[0].read == 0 and usages[0].written > 1000
        for before, after in itertools.pairwise(usages):
            # Each request reads all the previous one cached: system, tools, history.
            assert after.read >= before.read + before.written
        assert all(u.uncached < 200 for u in usages)  # the note and nothing else
        systems = {str(r.body["system"]) for r in fake.requests}
        assert len(systems) == 1  # byte-identical from turn to turn
        assert all(marks(r.body) <= 4 for r in fake.requests)
        # The time is read after the conversation, not in the system prompt.
        assert "Current time:" not in str(fake.requests[0].body["system"])
        assert "Current time:" in fake.requests[-1].body["messages"][-1]["content"][-1]["text"]

        # Counted: the run records, the session, the llm spans, /status and /usage.
        session = await app.store.get("default:test:direct:u1")
        runs = await app.store.runs(session.key)
        read, written = sum(u.read for u in usages), sum(u.written for u in usages)
        assert sum(r.cache_read_tokens for r in runs) == read > 0
        assert sum(r.cache_write_tokens for r in runs) == written > 0
        assert (session.cache_read_tokens, session.cache_write_tokens) == (read, written)
        assert sum(r.input_tokens for r in runs) == sum(u.total for u in usages)
        spans = [s for r in runs for s in await app.store.spans(r.run_id) if s.kind == "llm"]
        assert sum(s.attributes["cache_read_tokens"] for s in spans) == read
        await channel.say("/status")
        await channel.settle()
        assert f"prompt cache: {read} of the input read, {written} written" in \
            channel.replies[-1]
        await channel.say("/usage", sender="boss")
        await channel.settle()
        assert f"cache read {read:,}/written {written:,}" in channel.replies[-1]


def test_cost_budgets_bill_cache_reads_at_a_tenth_and_writes_at_one_and_a_quarter() -> None:
    price = ModelPrice(input=3.0, output=15.0)
    # 1M input of which 600k read and 300k written; 100k output.
    cost = price.cost(1_000_000, 100_000, cache_read_tokens=600_000, cache_write_tokens=300_000)
    assert cost == pytest.approx(0.1 * 3.0 + 0.6 * 0.3 + 0.3 * 3.75 + 0.1 * 15.0)
    own = ModelPrice(input=3.0, output=15.0, cache_read=0.5, cache_write=4.0)
    assert own.cost(1_000_000, 0, 1_000_000, 0) == pytest.approx(0.5)
    assert price.cost(1_000_000, 0) == pytest.approx(3.0)  # no caching: as before


async def test_openai_compatible_servers_get_the_note_last_and_the_prefix_unchanged() -> None:
    """vLLM and llama.cpp cache prefixes on their own: the same discipline serves them."""
    async with FakeOpenAI() as fake:
        fake.reply_text("ok")
        fake.reply_text("ok")
        llm = openai_for(fake)
        try:
            first = (ChatMessage("user", "hi"),)
            await llm.complete(request(*first, note="Current time: 21:28"))
            await llm.complete(request(*first, ChatMessage("assistant", "ok"),
                                       ChatMessage("user", "again"), note="Current time: 21:35"))
        finally:
            await llm.aclose()
    one, two = (r.body["messages"] for r in fake.requests)
    assert one[-1] == {"role": "user", "content": "hi\n\nCurrent time: 21:28"}
    assert two[:2] == [one[0], {"role": "user", "content": "hi"}]  # system, then history
    assert two[-1] == {"role": "user", "content": "again\n\nCurrent time: 21:35"}


async def test_in_a_group_another_sender_and_chatter_keep_the_cached_prefix(
    make_app: AppFactory,
) -> None:
    async with FakeAnthropic() as fake:
        fake.reply_always("ok")
        _, channel, _ = await make_app(
            None, provider="anthropic", anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url, model="claude-sonnet-test")
        await channel.say("hello all", sender="ann", name="Ann", group="g1")
        await channel.settle()
        await channel.say("lunch anyone?", sender="cy", name="Cy", group="g1", mentioned=False)
        await channel.say("hi bot", sender="bob", name="Bob", group="g1")
        await channel.settle()
        one, two = fake.requests
        # Who spoke last and the chatter since the bot's last answer are in the note.
        assert one.body["system"] == two.body["system"]
        note = two.body["messages"][-1]["content"][-1]["text"]
        assert "Bob" in note and "lunch anyone?" in note
        assert fake.cache_usage[1].read >= fake.cache_usage[0].written > 0


async def test_a_batch_of_parallel_tool_calls_longer_than_the_lookback_still_reads_the_prefix(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    """12 calls and their results are 25 blocks, past the API's 20-block lookback: the
    breakpoint on the previous request's final message still finds its entry."""
    fake.reply_always("ok")
    question = ChatMessage("user", "read all twelve files")
    await provider.complete(request(question))
    calls = tuple(ToolCall(f"toolu_{i}", "read_file", {"path": f"{i}.txt"}) for i in range(12))
    results = [ChatMessage("tool", f"file {i}", tool_call_id=f"toolu_{i}", tool_name="read_file")
               for i in range(12)]
    await provider.complete(request(question, ChatMessage("assistant", "", tool_calls=calls),
                                    *results))
    first, second = fake.cache_usage
    assert second.read == first.written > 0


async def test_a_one_off_request_marks_nothing_for_the_cache(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    """The compaction summarizer's transcript is never sent again: writing it would
    cost 1.25x for nothing."""
    fake.reply_always("a summary")
    one_off = LLMRequest(model="claude-sonnet-test", system=SUMMARY_SYSTEM,
                         messages=(ChatMessage("user", "a long transcript " * 500),), cache=False)
    response = await provider.complete(one_off)
    assert marks(fake.last_request.body) == 0
    assert response.usage.cache_write_tokens == 0 and fake.cache.entries == {}


async def test_a_stopped_run_still_counts_its_cache_reads_and_writes(
    make_app: AppFactory,
) -> None:
    blocker = Blocker()
    async with FakeAnthropic() as fake:
        fake.reply_tool_calls(ToolUse("block", {}))
        app, channel, _ = await make_app(
            None, blocker, provider="anthropic", anthropic_api_key="sk-test",
            anthropic_base_url=fake.base_url, model="claude-sonnet-test")
        await channel.say("work")
        await asyncio.wait_for(blocker.entered.wait(), 5)
        await channel.say("/stop")
        await channel.settle()
        store = app.services.usage
        assert store is not None
        await store.flush()
        spent = await store.totals("user", "test:u1", day_of(store.clock()))
        assert spent.cache_write_tokens == fake.cache_usage[0].written > 0
        assert spent.input_tokens == fake.cache_usage[0].total
