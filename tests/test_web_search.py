"""web_search over the built-in backends (fake SearXNG, Brave and Tavily APIs on 127.0.0.1),
a plugin's backend through roost_search_backends, choosing one, and failures."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio

from bot.config.settings import Settings
from bot.testing.app import without_summary
from bot.testing.web import FakeBrave, FakeSearxng, FakeSite, FakeTavily, Hit
from plugins.web import roost_search_backends as builtin_backends
from plugins.web.brave import BraveBackend
from plugins.web.search import format_results, web_search_tool
from plugins.web.searxng import SearxngBackend
from plugins.web.tavily import TavilyBackend
from roost import SearchBackend, SearchResult, ToolError, hookimpl

BRAVE_KEY = "BSA-test-key-0123456789"
TAVILY_KEY = "tvly-test-key-0123456789"
HITS = [Hit("Chicken perches", "https://poultry.example/perches", "How high a perch should be."),
        Hit("Coop design", "https://coops.example/design", "Ventilation and perches.")]


def web(**table: Any) -> dict[str, Any]:
    """Settings keywords with ``table`` as the web plugin's ``[plugins."plugins.web"]``."""
    return {"plugins": {"plugins.web": table}}


@pytest_asyncio.fixture
async def searxng() -> AsyncIterator[FakeSearxng]:
    async with FakeSearxng() as fake:
        yield fake


@pytest_asyncio.fixture
async def brave() -> AsyncIterator[FakeBrave]:
    async with FakeBrave(api_key=BRAVE_KEY) as fake:
        yield fake


@pytest_asyncio.fixture
async def tavily() -> AsyncIterator[FakeTavily]:
    async with FakeTavily(api_key=TAVILY_KEY) as fake:
        yield fake


def tool_names(chat: Any) -> list[str]:
    return [t.name for t in chat.requests[0].tools]


def search_call(query: str, count: int | None = None) -> list[dict[str, Any]]:
    arguments: dict[str, Any] = {"query": query}
    if count is not None:
        arguments["count"] = count
    return [{"steps": [{"tool_calls": [{"name": "web_search", "arguments": arguments}]},
                       {"reply": "found"}]}]


async def error_of(backend: SearchBackend, query: str = "perches", count: int = 5) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await backend.search(query, count)
    return caught.value


# ----------------------------------------------------------------------- through a run


async def test_searxng_results_come_back_as_a_numbered_list(roost_app: Any,
                                                            searxng: FakeSearxng) -> None:
    searxng.results(HITS)
    chat = await roost_app(search_call("chicken perch height"),
                           **web(searxng_url=searxng.base_url))
    assert await chat.ask("how high should a perch be?") == ["found"]
    assert "web_search" in tool_names(chat)
    result = without_summary(chat.requests[1].messages[-1].content)
    assert result == (
        "Results for 'chicken perch height' (searxng):\n"
        "1. Chicken perches\n   https://poultry.example/perches\n   How high a perch should be.\n"
        "2. Coop design\n   https://coops.example/design\n   Ventilation and perches.")
    sent = searxng.requests[-1]
    assert (sent.path, sent.query["q"], sent.query["format"]) == \
        ("/search", "chicken perch height", "json")


async def test_brave_is_asked_with_its_key_and_its_markup_is_removed(
        roost_app: Any, brave: FakeBrave) -> None:
    brave.results(HITS)
    chat = await roost_app(search_call("perches", count=2),
                           **web(brave_api_key=BRAVE_KEY, brave_api_base=brave.base_url))
    assert await chat.ask("search") == ["found"]
    result = without_summary(chat.requests[1].messages[-1].content)
    assert result.startswith("Results for 'perches' (brave):\n1. Chicken perches\n")
    assert "Ventilation and perches." in result and "<strong>" not in result
    sent = brave.requests[-1]
    assert sent.headers["x-subscription-token"] == BRAVE_KEY
    assert (sent.query["q"], sent.query["count"]) == ("perches", "2")


async def test_tavily_is_asked_with_a_bearer_key_and_max_results(roost_app: Any,
                                                                 tavily: FakeTavily) -> None:
    tavily.results(HITS)
    chat = await roost_app(search_call("coops", count=1),
                           **web(tavily_api_key=TAVILY_KEY, tavily_api_base=tavily.base_url))
    assert await chat.ask("search") == ["found"]
    result = without_summary(chat.requests[1].messages[-1].content)
    assert result == ("Results for 'coops' (tavily):\n1. Chicken perches\n"
                      "   https://poultry.example/perches\n   How high a perch should be.")
    sent = tavily.requests[-1]
    assert sent.headers["authorization"] == f"Bearer {TAVILY_KEY}"
    assert sent.json()["query"] == "coops" and sent.json()["max_results"] == 1


async def test_without_a_backend_web_search_is_not_offered(roost_app: Any) -> None:
    chat = await roost_app([{"reply": "hi"}])
    assert await chat.ask("hello") == ["hi"]
    assert "web_fetch" in tool_names(chat)
    assert "web_search" not in tool_names(chat)


async def test_web_search_backend_picks_one_of_several(roost_app: Any, searxng: FakeSearxng,
                                                      tavily: FakeTavily) -> None:
    chat = await roost_app(search_call("eggs"), **web(
        searxng_url=searxng.base_url, tavily_api_key=TAVILY_KEY,
        tavily_api_base=tavily.base_url, search_backend="tavily"))
    assert await chat.ask("search") == ["found"]
    assert "(tavily)" in chat.requests[1].messages[-1].content
    assert searxng.requests == [] and len(tavily.requests) == 1


async def test_a_backend_named_but_not_configured_means_no_web_search(
        roost_app: Any, searxng: FakeSearxng, caplog: pytest.LogCaptureFixture) -> None:
    chat = await roost_app([{"reply": "hi"}], **web(searxng_url=searxng.base_url,
                                                          search_backend="brave"))
    assert await chat.ask("hello") == ["hi"]
    assert "web_search" not in tool_names(chat)
    assert "search_backend is 'brave'" in caplog.text and "searxng" in caplog.text


class Catalogue:
    """A plugin's own search backend: a fixed catalogue."""

    name = "catalogue"

    def __init__(self) -> None:
        self.queries: list[tuple[str, int]] = []

    async def search(self, query: str, count: int) -> Sequence[SearchResult]:
        self.queries.append((query, count))
        return [SearchResult(f"Item {i}", f"https://shop.example/{i}", f"{query} item")
                for i in range(1, 20)]


class CataloguePlugin:
    def __init__(self) -> None:
        self.backend = Catalogue()

    @hookimpl
    def roost_search_backends(self, settings: Settings) -> SearchBackend:
        return self.backend


async def test_a_plugin_backend_serves_web_search_through_the_hook(roost_app: Any) -> None:
    plugin = CataloguePlugin()
    chat = await roost_app(search_call("feeders", count=3), ("catalogue", plugin))
    assert await chat.ask("search") == ["found"]
    assert plugin.backend.queries == [("feeders", 3)]
    result = without_summary(chat.requests[1].messages[-1].content)
    assert result.startswith("Results for 'feeders' (catalogue):\n1. Item 1\n")
    assert "3. Item 3" in result and "4. Item 4" not in result  # cut to count


async def test_a_backend_failure_reaches_the_model_as_an_error(roost_app: Any,
                                                              brave: FakeBrave) -> None:
    chat = await roost_app(search_call("perches"), **web(
        brave_api_key="BSA-wrong-key", brave_api_base=brave.base_url))
    assert await chat.ask("search") == ["found"]
    result = chat.requests[1].messages[-1]
    assert result.is_error
    assert "Code AUTH: Brave Search refused the API key" in result.content
    assert "BSA-wrong-key" not in result.content
    assert len(brave.requests) == 1  # a refused key is not retried


# ----------------------------------------------------------------------- the backends


async def test_the_built_in_backends_are_offered_only_when_configured() -> None:
    assert builtin_backends(Settings()) == []
    names = [b.name for b in builtin_backends(Settings(**web(
        searxng_url="http://searx.lan", brave_api_key="b", tavily_api_key="t")))]
    assert names == ["searxng", "brave", "tavily"]
    assert builtin_backends(Settings(**web(brave_api_key=""))) == []


async def test_searxng_without_the_json_format_says_how_to_enable_it() -> None:
    async with FakeSearxng(json_enabled=False) as fake:
        error = await error_of(SearxngBackend(fake.base_url))
    assert error.code == "HTTP_403" and not error.retryable
    assert "search.formats" in str(error)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retryable(brave: FakeBrave, status: int) -> None:
    brave.fail(status, "upstream trouble")
    error = await error_of(BraveBackend(BRAVE_KEY, base_url=brave.base_url))
    assert error.code == f"HTTP_{status}" and error.retryable
    assert "upstream trouble" in str(error)


async def test_a_rate_limit_is_retryable_and_says_when(tavily: FakeTavily) -> None:
    tavily.fail(429, "Rate limit exceeded.", headers={"Retry-After": "3"})
    error = await error_of(TavilyBackend(TAVILY_KEY, base_url=tavily.base_url))
    assert error.code == "RATE_LIMITED" and error.retryable
    assert "retry after 3 s" in str(error) and "Rate limit exceeded." in str(error)


async def test_a_plan_limit_is_permanent_with_the_services_words(tavily: FakeTavily) -> None:
    tavily.fail(432, "This request exceeds your plan's set usage limit.")
    error = await error_of(TavilyBackend(TAVILY_KEY, base_url=tavily.base_url))
    assert error.code == "HTTP_432" and not error.retryable
    assert "exceeds your plan" in str(error)


@pytest.mark.parametrize("which", ["brave", "tavily"])
async def test_a_refused_key_is_permanent_and_never_shown_or_logged(
        brave: FakeBrave, tavily: FakeTavily, which: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "secret-wrong-key-9876"
    backend: SearchBackend = BraveBackend(wrong, base_url=brave.base_url) if which == "brave" \
        else TavilyBackend(wrong, base_url=tavily.base_url)
    error = await error_of(backend)
    assert error.code == "AUTH" and not error.retryable
    assert f"{which}_api_key" in str(error)
    assert wrong not in str(error) and wrong not in repr(backend) and wrong not in caplog.text


async def test_a_search_that_gets_no_answer_times_out_as_retryable() -> None:
    async with FakeSite() as site:
        site.hang("/search")
        error = await error_of(SearxngBackend(site.base_url, timeout=0.3))
    assert error.code == "TIMEOUT" and error.retryable


async def test_an_unreachable_api_is_a_retryable_network_error() -> None:
    async with FakeSearxng() as gone:
        url = gone.base_url
    error = await error_of(SearxngBackend(url))
    assert error.code == "NETWORK" and error.retryable


async def test_an_answer_that_is_not_json_is_a_bad_response() -> None:
    async with FakeSite() as site:
        site.page("/search", "<html>maintenance</html>")
        error = await error_of(SearxngBackend(site.base_url))
    assert error.code == "BAD_RESPONSE"


# ----------------------------------------------------------------------- the tool


async def test_the_tool_checks_query_and_count(searxng: FakeSearxng) -> None:
    tool = web_search_tool(SearxngBackend(searxng.base_url), timeout=5)
    context: Any = None
    for bad in ({"query": "   "}, {"query": "x" * 401}, {"query": "a", "count": 0},
                {"query": "a", "page": 2}):
        with pytest.raises(ToolError) as caught:
            await tool.execute(context, bad)
        assert caught.value.code == "INVALID_ARGUMENT"
    result = await tool.execute(context, {"query": "  many   spaces ", "count": 50})
    assert isinstance(result, str)
    assert result.startswith("Results for 'many spaces' (searxng):")
    assert "10. many spaces — result 10" in result and "11." not in result  # capped at 10
    assert searxng.requests[-1].query["q"] == "many spaces"


def test_no_results_say_so() -> None:
    assert format_results("zzz", "brave", []) == "No results for 'zzz' (brave)."


async def test_snippets_are_one_plain_line_of_at_most_300_characters(
        searxng: FakeSearxng) -> None:
    searxng.results([Hit("<b>Bold</b> &amp; title", "https://a.example/",
                         "word\n\n  " * 200)])
    [result] = await SearxngBackend(searxng.base_url).search("q", 5)
    assert result.title == "Bold & title"
    assert len(result.snippet) == 300 and "\n" not in result.snippet
    assert result.snippet.endswith("…")


def test_search_keys_are_masked_in_the_shown_configuration() -> None:
    shown = Settings(plugins={"plugins.web": {"brave_api_key": BRAVE_KEY,
                                              "tavily_api_key": TAVILY_KEY}}).masked()
    table = shown["plugins"]["plugins.web"]
    assert table["brave_api_key"] == table["tavily_api_key"] == "********"
    assert BRAVE_KEY not in str(shown) and TAVILY_KEY not in str(shown)


async def test_group_web_gives_both_tools_to_an_agent_whose_profile_has_neither(
        roost_app: Any, searxng: FakeSearxng) -> None:
    chat = await roost_app([{"reply": "hi"}], **web(searxng_url=searxng.base_url),
                           agents={"default": {"tools": {"profile": "minimal",
                                                         "allow": ["group:web"]}}})
    assert await chat.ask("hello") == ["hi"]
    assert set(tool_names(chat)) == {"get_error_detail", "get_tool_result", "web_fetch",
                                     "web_search"}
