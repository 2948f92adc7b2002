"""web_fetch stays bounded: memory per fetch, hostile nesting, and breakers per user and host.

Memory is measured in a fresh Python process fetching from a local site: the peak
(``VmHWM``, reset once the fetcher is warm) and the resident size after, against the
resident size once warm.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bot.testing.web import FakeSite
from bot.testing.web_pages import article, dense, nested
from bot.tools.breakers import Breakers
from plugins.web.fetch import breaker_key, html_to_markdown
from plugins.web.markup import MAX_DEPTH, reduce_html
from roost import ToolContext

LOCAL = ["127.0.0.1/32"]
ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024

_CHILD = """
import asyncio, json, sys
from plugins.web.fetch import WebFetcher

def status(field):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

def rss():
    return status("VmRSS")

async def main(warm, url):
    fetcher = WebFetcher(allow_private=["127.0.0.1/32"])
    for _ in range(2):  # imports, parser tables, the TLS context: all paid before
        await fetcher.fetch(warm)
    # The peak of this process's memory from here on (VmHWM, reset to the current RSS):
    # ru_maxrss would also carry the parent's peak over the fork and exec.
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    base = rss()
    page = await fetcher.fetch(url)
    peak = status("VmHWM")
    chars = len(page.text)
    del page
    print(json.dumps({"base": base, "peak": peak, "after": rss(), "chars": chars}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest_asyncio.fixture
async def site() -> AsyncIterator[FakeSite]:
    async with FakeSite() as fake:
        yield fake


async def measure(site: FakeSite, path: str) -> dict[str, int]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, site.url("/warm"), site.url(path), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode()[-2000:]
    figures: dict[str, int] = json.loads(out.decode().strip().splitlines()[-1])
    return figures


@pytest.mark.slow
@pytest.mark.parametrize("page", [article, dense], ids=["article", "dense"])
async def test_one_fetch_of_a_large_page_adds_at_most_64_mib_and_gives_it_back(
        site: FakeSite, page: Any) -> None:
    site.page("/warm", "<html><head><title>Warm</title></head><body><article><h1>Warm</h1>"
              + "<p>Warming up the parsers with a paragraph of text.</p>" * 40
              + "</article></body></html>")
    body = page(3_900_000)
    site.page("/big", body)
    figures = await measure(site, "/big")
    assert figures["chars"] > 10_000  # the page was read, not refused
    added = figures["peak"] - figures["base"]
    assert added <= 64 * MiB, f"peak +{added / MiB:.0f} MiB"
    kept = figures["after"] - figures["base"]
    assert kept <= 10 * MiB, f"+{kept / MiB:.0f} MiB kept after the fetch"


async def test_deeply_nested_html_is_one_clean_error_not_retried(roost_app: Any,
                                                                 site: FakeSite) -> None:
    site.page("/deep", nested(100_000))
    url = site.url("/deep")
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "web_fetch", "arguments": {"url": url}}]},
                    {"reply": "unreadable"}]}],
        plugins={"plugins.web": {"allow_private": LOCAL}})
    assert await chat.ask("read it") == ["unreadable"]
    answer = chat.requests[1].messages[-1]
    assert answer.is_error and "UNREADABLE" in answer.content
    assert f"more than {MAX_DEPTH} levels deep" in answer.content
    assert "RecursionError" not in answer.content
    assert [r.path for r in site.requests] == ["/deep"]  # asked once: not retried


def test_nesting_up_to_the_cap_is_converted_without_running_out_of_recursion() -> None:
    levels = MAX_DEPTH - 3  # html, body and p are levels too
    page = "<html><body>" + "<div>" * levels + "<p>at the bottom</p>" + "</div>" * levels \
        + "</body></html>"
    assert not reduce_html(page).truncated
    text, _, cut = html_to_markdown(page, "http://127.0.0.1/")  # markdownify recurses
    assert text == "at the bottom" and not cut


def test_reduced_markup_drops_what_has_no_text_and_closes_what_pages_leave_open() -> None:
    reduced = reduce_html(
        '<html><head><title>T</title><style>p{}</style></head><body>'
        '<nav><a href="/x" onclick="evil()">a</a></nav><p>one<p>two<ul><li>a<li>b</ul>'
        '<table><tr><td>1<td>2<tr><td>3</table><svg><g><title>s</title></g></svg>'
        '<br/><div/>x &amp; &lt;y&gt;<script>var a = "</div>";</script></body></html>')
    assert reduced.markup == (
        '<html><body><nav><a href="/x">a</a></nav><p>one</p><p>two</p>'
        "<ul><li>a</li><li>b</li></ul><table><tr><td>1</td><td>2</td></tr><tr><td>3</td></tr>"
        "</table><br><div></div>x &amp; &lt;y&gt;</body></html>")


def test_reduced_markup_stops_at_its_limits_with_every_element_closed() -> None:
    reduced = reduce_html("<div><p>x" * 50, max_elements=10)
    assert reduced.truncated
    assert reduced.markup.count("<p>") == reduced.markup.count("</p>") == 5
    assert reduced.markup.count("<div>") == reduced.markup.count("</div>") == 5
    # One text as long as the page (an unclosed comment ends as text) is cut too.
    for page in ("<p>x</p><!--" + "y" * 10_000, "<p>" + "&amp;" * 10_000):
        reduced = reduce_html(page, max_markup=1_000)
        assert reduced.truncated and len(reduced.markup) <= 1_000 + len("</p>")


def context(user: str) -> ToolContext:
    return ToolContext(user_id=user, channel="console", chat_id=user, session_key=user,
                       run_id="r", workspace=Path("."), deadline=0.0)


def test_breaker_keys_are_per_user_and_host() -> None:
    keys = {breaker_key(context(user), {"url": url}) for user, url in [
        ("alice", "https://a.example/x"), ("alice", "https://A.example/y?q"),
        ("bob", "https://a.example/x"), ("alice", "https://b.example/"),
        ("alice", "https://a.example:8443/")]}
    assert len(keys) == 4
    assert breaker_key(context("alice"), {"url": "http://[::1"}) \
        == breaker_key(context("alice"), {"url": 5})  # hostile arguments never raise


def test_keyed_breakers_are_bounded_and_forget_idle_ones_first() -> None:
    breakers = Breakers(max_keyed=3)
    failing = breakers.get("web_fetch", "alice a.example")
    failing.record_failure(failing.try_admit() or pytest.fail("closed breaker refused"))
    for key in ("bob b", "carol c", "dave d"):
        breakers.get("web_fetch", key)
    assert breakers.get("web_fetch", "alice a.example") is failing  # it remembers a failure
    assert len(breakers.snapshot()) == 1
    assert breakers.snapshot()["web_fetch"]["keys"] == 3


async def test_one_users_failures_never_pause_web_fetch_for_another(
        roost_app: Any, site: FakeSite) -> None:
    async with FakeSite() as other:
        site.page("/page", "<title>Up</title><p>the page is up</p>")
        site.fail_first("/page", 503, times=6)
        other.page("/elsewhere", "<title>Other</title><p>another site</p>")
        url, elsewhere = site.url("/page"), other.url("/elsewhere")
        fetch = [{"steps": [{"tool_calls": [{"name": "web_fetch", "arguments": {"url": u}}]},
                            {"reply": "ok"}]} for u in (url, url, url, elsewhere, url)]
        # Without a key per user and host, bob's call below is refused with CIRCUIT_OPEN.
        chat = await roost_app(fetch, plugins={"plugins.web": {"allow_private": LOCAL}})
        await chat.ask("read", sender="alice")  # 3 attempts, 503 each
        await chat.ask("read", sender="alice")  # 2 more: alice's breaker for the site opens
        assert len(site.requests) == 5
        await chat.ask("read", sender="bob")  # bob's first try: the site answers 503 once more
        assert "the page is up" in chat.tool_results("web_fetch")[-1]
        await chat.ask("read", sender="alice")  # alice, another site: not paused
        assert "another site" in chat.tool_results("web_fetch")[-1]
        await chat.ask("read", sender="alice")  # alice, the failing site: still paused
        assert "CIRCUIT_OPEN" in chat.tool_results("web_fetch")[-1]
        assert len(site.requests) == 7
