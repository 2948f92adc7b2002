"""web_fetch against a local fake site: conversion, redirects, limits, errors and SSRF refusals.

The site runs on 127.0.0.1, so most tests allow ``127.0.0.1/32``; the SSRF tests
use an empty allowlist (or only that /32) and check the site was never asked.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import zlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio

from bot.config.settings import Settings
from bot.testing.app import without_summary
from bot.testing.web import FakeSite, TestCA
from plugins.web.config import web_config
from plugins.web.fetch import WebFetcher, default_max_chars, render, web_fetch_tool
from plugins.web.ssrf import AddressPolicy, system_resolver
from roost import ToolError
from tests.media_samples import pdf, png

LOCAL = ["127.0.0.1/32"]

ARTICLE = """<!doctype html>
<html><head><title>Roosting habits &amp; more</title><style>p {color: red}</style></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">About</a> | <a href="/shop">Shop</a></nav>
<article>
<h1>Where chickens sleep</h1>
<p>Chickens roost on perches at night, as high as they can, because height kept their
ancestors safe from ground predators. A good perch is round, smooth and wide enough for
the bird to cover its toes with its feathers in winter.</p>
<p>Give each bird about 20 cm of perch, and put the perches higher than the nest boxes, or
the birds will sleep in the nests and soil them. Read <a href="/perches">more on perches</a>.</p>
<ul><li>round, not square</li><li>no metal in winter</li></ul>
</article>
<footer>Copyright 2026 Poultry Weekly. All rights reserved. Cookie settings.</footer>
<script>trackVisitor("secret-tracker-id");</script>
</body></html>"""


@pytest_asyncio.fixture
async def site() -> AsyncIterator[FakeSite]:
    async with FakeSite() as fake:
        yield fake


def fetcher(allow: Sequence[str] = LOCAL, **options: Any) -> WebFetcher:
    return WebFetcher(allow_private=allow, **options)


async def fetch_error(fetcher_: WebFetcher, url: str) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await fetcher_.fetch(url)
    return caught.value


def resolver(table: dict[str, list[str]], calls: list[str] | None = None) -> Any:
    """A resolver answering from ``table``; names not in it do not exist."""

    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]

    return resolve


# ----------------------------------------------------------------------- content


async def test_an_html_page_becomes_markdown_of_its_main_content_with_url_and_title(
        site: FakeSite) -> None:
    site.page("/chickens", ARTICLE)
    page = await fetcher().fetch(site.url("/chickens"))
    text = render(page, 20_000)
    assert text.startswith(f"URL: {site.url('/chickens')}\nTitle: Roosting habits & more\n")
    assert "# Where chickens sleep" in text
    assert "Chickens roost on perches at night" in text
    assert "- round, not square" in text
    assert f"[more on perches]({site.url('/perches')})" in text  # links made absolute
    assert "secret-tracker-id" not in text and "color: red" not in text
    assert "Cookie settings" not in text  # trafilatura dropped the footer


async def test_a_page_with_little_main_content_is_converted_whole_by_markdownify(
        site: FakeSite) -> None:
    site.page("/tiny", "<html><head><title>Tiny</title><script>x()</script></head><body>"
                       "<h2>Opening hours</h2><table><tr><td>Mon</td><td>9-17</td></tr></table>"
                       "<p>Closed on <b>Sundays</b>.</p></body></html>")
    page = await fetcher().fetch(site.url("/tiny"))
    assert page.title == "Tiny"
    assert "## Opening hours" in page.text
    assert "Closed on **Sundays**." in page.text
    assert "x()" not in page.text


async def test_plain_text_and_json_come_back_as_sent(site: FakeSite) -> None:
    site.page("/notes.txt", "line one\n  indented two\n", content_type="text/plain")
    site.page("/api", '{"temperature": 21.5, "unit": "C"}', content_type="application/json")
    text_page = await fetcher().fetch(site.url("/notes.txt"))
    assert text_page.text == "line one\n  indented two\n"
    assert text_page.title is None
    json_page = await fetcher().fetch(site.url("/api"))
    assert json_page.text == '{"temperature": 21.5, "unit": "C"}'
    assert "Content-Type: application/json (as sent)" in render(json_page, 1000)


async def test_a_pdf_is_read_through_the_document_text_extraction(site: FakeSite) -> None:
    site.page("/invoice.pdf", pdf("Invoice 1234", "Total: 42.00 EUR"),
              content_type="application/pdf")
    page = await fetcher().fetch(site.url("/invoice.pdf"))
    assert "[page 1]\nInvoice 1234" in page.text
    assert "[page 2]\nTotal: 42.00 EUR" in page.text


async def test_a_pdf_without_a_useful_content_type_is_recognised_by_its_bytes(
        site: FakeSite) -> None:
    site.page("/download", pdf("Sniffed"), content_type="application/octet-stream")
    assert "Sniffed" in (await fetcher().fetch(site.url("/download"))).text


async def test_a_broken_pdf_is_refused_as_unreadable(site: FakeSite) -> None:
    site.page("/bad.pdf", b"%PDF-1.4\nnot really", content_type="application/pdf")
    error = await fetch_error(fetcher(), site.url("/bad.pdf"))
    assert error.code == "UNREADABLE" and not error.retryable


async def test_an_image_is_refused_with_what_web_fetch_reads(site: FakeSite) -> None:
    site.page("/cat.png", png(4, 4), content_type="image/png")
    error = await fetch_error(fetcher(), site.url("/cat.png"))
    assert error.code == "UNSUPPORTED_CONTENT"
    assert "image/png" in str(error) and "HTML, text, JSON" in str(error)


async def test_the_charset_of_the_header_or_the_meta_tag_decodes_the_page(
        site: FakeSite) -> None:
    site.page("/latin", "<p>Café crème brûlée</p>".encode("latin-1"),
              content_type="text/html; charset=iso-8859-1")
    site.page("/meta", '<html><head><meta charset="windows-1252"><title>Menü</title></head>'
                       '<body><p>Grüße</p></body></html>'.encode("cp1252"),
              content_type="text/html")
    assert "Café crème brûlée" in (await fetcher().fetch(site.url("/latin"))).text
    meta = await fetcher().fetch(site.url("/meta"))
    assert meta.title == "Menü" and "Grüße" in meta.text


async def test_max_chars_cuts_the_text_and_says_how_much_there_was(site: FakeSite) -> None:
    site.page("/long.txt", "abcdefghij" * 50, content_type="text/plain")
    text = render(await fetcher().fetch(site.url("/long.txt")), 100)
    assert "abcdefghij" * 10 + "\n\n[cut at 100 of 500 characters" in text


def test_the_default_max_chars_keeps_a_page_under_the_large_result_threshold() -> None:
    assert default_max_chars(Settings(large_result_chars=16_000)) == 15_000
    assert default_max_chars(Settings(large_result_chars=100_000)) == 20_000


# ----------------------------------------------------------------------- redirects


async def test_redirects_are_followed_and_the_result_names_the_final_url(
        site: FakeSite) -> None:
    site.redirect("/old", "/middle", status=301)
    site.redirect("/middle", site.url("/new"), status=307)
    site.page("/new", "<title>New home</title><p>moved here</p>")
    page = await fetcher().fetch(site.url("/old"))
    text = render(page, 1000)
    assert text.startswith(f"URL: {site.url('/new')}\nRedirected from: {site.url('/old')}\n")
    assert [r.path for r in site.requests] == ["/old", "/middle", "/new"]


async def test_more_redirects_than_allowed_are_refused(site: FakeSite) -> None:
    site.redirect("/a", "/b")
    site.redirect("/b", "/a")
    error = await fetch_error(fetcher(max_redirects=3), site.url("/a"))
    assert error.code == "TOO_MANY_REDIRECTS" and not error.retryable
    assert len(site.requests) == 4  # the first request and three redirects


# ----------------------------------------------------------------------- limits and errors


async def test_a_body_declared_over_the_byte_cap_is_refused_before_it_is_read(
        site: FakeSite) -> None:
    site.page("/big.txt", "x" * 5000, content_type="text/plain")
    error = await fetch_error(fetcher(max_bytes=1000), site.url("/big.txt"))
    assert error.code == "TOO_LARGE" and not error.retryable
    assert "5000 bytes, over the 1000-byte limit" in str(error)


async def test_an_endless_body_is_abandoned_at_the_byte_cap(site: FakeSite) -> None:
    site.endless("/stream")
    error = await fetch_error(fetcher(max_bytes=300_000), site.url("/stream"))
    assert error.code == "TOO_LARGE"
    assert "the download was stopped" in str(error)
    await asyncio.wait_for(site.abandoned.wait(), 5)


async def test_gzip_and_deflate_bodies_are_decoded(site: FakeSite) -> None:
    text = "compressed words " * 200
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    site.page("/gz", gzip.compress(text.encode()), content_type="text/plain",
              headers={"Content-Encoding": "gzip"})
    site.page("/zlib", zlib.compress(text.encode()), content_type="text/plain",
              headers={"Content-Encoding": "deflate"})
    site.page("/raw", raw_deflate.compress(text.encode()) + raw_deflate.flush(),
              content_type="text/plain", headers={"Content-Encoding": "deflate"})
    for path in ("/gz", "/zlib", "/raw"):
        assert (await fetcher().fetch(site.url(path))).text == text
    assert site.requests[0].headers["accept-encoding"] == "gzip, deflate"


async def test_a_compression_bomb_is_stopped_at_the_byte_cap(site: FakeSite) -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # 50 MB of zeros in about 50 kB
    site.page("/bomb", bomb, content_type="text/plain", headers={"Content-Encoding": "gzip"})
    error = await fetch_error(fetcher(max_bytes=1_000_000), site.url("/bomb"))
    assert error.code == "TOO_LARGE" and "download was stopped" in str(error)


async def test_an_unknown_or_broken_encoding_is_a_bad_response(site: FakeSite) -> None:
    site.page("/br", b"\x0b\x02\x80hello\x03", content_type="text/plain",
              headers={"Content-Encoding": "br"})
    site.page("/broken", b"not gzip at all", content_type="text/plain",
              headers={"Content-Encoding": "gzip"})
    for path in ("/br", "/broken"):
        error = await fetch_error(fetcher(), site.url(path))
        assert error.code == "BAD_RESPONSE" and not error.retryable


async def test_a_site_that_never_answers_times_out_as_retryable(site: FakeSite) -> None:
    site.hang("/slow")
    error = await fetch_error(fetcher(timeout=0.3), site.url("/slow"))
    assert error.code == "TIMEOUT" and error.retryable
    assert "timed out after 0.3 s" in str(error)


@pytest.mark.parametrize(("status", "code", "retryable"), [
    (404, "HTTP_404", False),
    (403, "HTTP_403", False),
    (410, "HTTP_410", False),
    (429, "RATE_LIMITED", True),
    (500, "HTTP_500", True),
    (503, "HTTP_503", True),
])
async def test_error_statuses_are_tool_errors_retryable_only_when_transient(
        site: FakeSite, status: int, code: str, retryable: bool) -> None:
    site.fail("/page", status, headers={"Retry-After": "7"} if status == 429 else None)
    error = await fetch_error(fetcher(), site.url("/page"))
    assert (error.code, error.retryable) == (code, retryable)
    assert f"HTTP {status}" in str(error)
    if status == 429:
        assert "retry after 7 s" in str(error)


async def test_a_closed_port_is_a_retryable_network_error() -> None:
    async with FakeSite() as gone:
        url = gone.url("/")
    error = await fetch_error(fetcher(), url)
    assert error.code == "NETWORK" and error.retryable


async def test_a_name_that_does_not_exist_is_permanent_and_a_dns_hiccup_retryable() -> None:
    missing = await fetch_error(fetcher(resolver=resolver({})), "http://nowhere.test/")
    assert missing.code == "UNKNOWN_HOST" and not missing.retryable

    async def flaky(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    hiccup = await fetch_error(fetcher(resolver=flaky), "http://example.test/")
    assert hiccup.code == "DNS_FAILED" and hiccup.retryable


# ----------------------------------------------------------------------- SSRF


@pytest.mark.parametrize(("host", "reason"), [
    ("localhost", "loopback"),
    ("127.0.0.2", "loopback"),
    ("169.254.169.254", "cloud metadata"),
    ("[::1]", "loopback"),
    ("[fd00:ec2::254]", "cloud metadata"),
    ("[::ffff:127.0.0.1]", "loopback"),
    ("10.20.30.40", "private"),
    ("192.168.1.1", "private"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("100.64.0.1", "not a public address"),
    ("2130706433", "loopback"),  # 127.0.0.1 as one number: resolved, then refused
])
async def test_non_public_addresses_are_refused_without_a_request(
        site: FakeSite, host: str, reason: str) -> None:
    error = await fetch_error(fetcher(allow=[]), f"http://{host}:{site.port}/")
    assert error.code == "BLOCKED_ADDRESS" and not error.retryable
    assert reason in str(error) and "allow_private in [plugins" in str(error)
    assert site.requests == []


async def test_the_fake_site_itself_is_refused_while_the_allowlist_is_empty(
        site: FakeSite) -> None:
    site.page("/", "<p>hi</p>")
    error = await fetch_error(fetcher(allow=[]), site.url("/"))
    assert error.code == "BLOCKED_ADDRESS"
    assert site.requests == []


@pytest.mark.parametrize("target", [
    "http://127.0.0.2:{port}/", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:{port}/", "http://10.0.0.1/admin",
])
async def test_a_redirect_from_an_allowed_site_to_a_private_address_is_refused(
        site: FakeSite, target: str) -> None:
    site.redirect("/go", target.format(port=site.port))
    error = await fetch_error(fetcher(allow=LOCAL), site.url("/go"))
    assert error.code == "BLOCKED_ADDRESS"
    assert [r.path for r in site.requests] == ["/go"]


async def test_a_name_that_resolves_to_a_private_address_is_refused(site: FakeSite) -> None:
    names = {"intranet.example": ["10.1.2.3"],
             "mixed.example": ["93.184.215.14", "192.168.0.10"],
             "metadata.example": ["169.254.169.254"]}
    guard = fetcher(allow=[], resolver=resolver(names))
    for name, address in (("intranet.example", "10.1.2.3"),
                          ("mixed.example", "192.168.0.10"),
                          ("metadata.example", "169.254.169.254")):
        error = await fetch_error(guard, f"http://{name}/")
        assert error.code == "BLOCKED_ADDRESS"
        assert f"{name} resolves to {address}" in str(error)
        assert error.details["address"] == address


async def test_the_request_goes_to_the_checked_address_with_the_host_name_kept(
        site: FakeSite) -> None:
    """DNS rebinding: the name is resolved once per hop and the connection uses that answer."""
    site.page("/", "<title>Pinned</title><p>reached</p>")
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])  # a second lookup would get a private one
    calls: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    page = await fetcher(resolver=rebinding).fetch(site.url("/", host="site.test"))
    assert page.title == "Pinned" and page.url == site.url("/", host="site.test")
    assert calls == ["site.test"]
    assert site.hosts() == [f"site.test:{site.port}"]


async def test_an_address_that_refuses_the_connection_is_skipped_for_the_next(
        site: FakeSite) -> None:
    site.page("/", "<title>Second address</title><p>here</p>")
    names = resolver({"dual.test": ["::1", "127.0.0.1"]})  # the site listens on IPv4 only
    page = await fetcher(allow=["127.0.0.1/32", "::1/128"], resolver=names).fetch(
        site.url("/", host="dual.test"))
    assert page.title == "Second address"
    assert site.hosts() == [f"dual.test:{site.port}"]


async def test_https_keeps_the_host_name_for_sni_and_the_certificate_check() -> None:
    ca = TestCA()
    names = resolver({"secure.test": ["127.0.0.1"], "impostor.test": ["127.0.0.1"]})
    async with FakeSite(tls=ca.server_context("secure.test")) as secure:
        secure.page("/", "<title>Secure</title><p>over TLS</p>")
        tls = fetcher(resolver=names, verify=ca.client_context())
        page = await tls.fetch(secure.url("/", host="secure.test"))
        assert page.title == "Secure"
        assert secure.hosts() == [f"secure.test:{secure.port}"]
        error = await fetch_error(tls, secure.url("/", host="impostor.test"))
        assert error.code == "TLS_ERROR" and not error.retryable
        assert "impostor.test" in str(error)


@pytest.mark.parametrize(("url", "code"), [
    ("file:///etc/passwd", "UNSUPPORTED_SCHEME"),
    ("ftp://ftp.example.com/file", "UNSUPPORTED_SCHEME"),
    ("gopher://127.0.0.1:70/", "UNSUPPORTED_SCHEME"),
    ("javascript:alert(1)", "UNSUPPORTED_SCHEME"),
    ("example.com/page", "UNSUPPORTED_SCHEME"),
    ("http://user:secret@example.com/", "CREDENTIALS_IN_URL"),
    ("http://:80/", "INVALID_URL"),
])
async def test_other_schemes_credentials_and_hostless_urls_are_refused(url: str,
                                                                       code: str) -> None:
    error = await fetch_error(fetcher(resolver=resolver({})), url)
    assert error.code == code and not error.retryable
    assert "secret" not in str(error)


async def test_a_redirect_to_another_scheme_is_refused(site: FakeSite) -> None:
    site.redirect("/file", "file:///etc/passwd")
    error = await fetch_error(fetcher(), site.url("/file"))
    assert error.code == "UNSUPPORTED_SCHEME"


def test_the_allowlist_opens_exactly_its_ranges() -> None:
    import ipaddress

    policy = AddressPolicy(["10.0.0.0/8", "169.254.169.254/32", "::1/128"])
    assert policy.refusal(ipaddress.ip_address("10.200.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("169.254.169.254")) is None
    assert policy.refusal(ipaddress.ip_address("::1")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:10.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("11.0.0.1")) is None  # public anyway
    assert policy.refusal(ipaddress.ip_address("172.16.0.1")) == "a private address"
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) == "a loopback address"
    assert AddressPolicy().refusal(ipaddress.ip_address("2002:7f00:1::")) == \
        "a loopback address"  # 6to4 around 127.0.0.1
    assert AddressPolicy().refusal(ipaddress.ip_address("64:ff9b::a00:1")) == \
        "a private address"  # NAT64 around 10.0.0.1


async def test_the_system_resolver_lists_each_address_once() -> None:
    addresses = await system_resolver("localhost", 80)
    assert "127.0.0.1" in addresses
    assert len(addresses) == len(set(addresses))


def test_allow_private_takes_cidrs_from_toml_or_a_comma_list() -> None:
    table = {"plugins": {"plugins.web": {"allow_private": "127.0.0.1/32, 10.0.0.0/8"}}}
    assert web_config(Settings(**table)).allow_private == ["127.0.0.1/32", "10.0.0.0/8"]
    # The old top-level name lands in the same place.
    assert web_config(Settings(web_allow_private="10.0.0.0/8")).allow_private == ["10.0.0.0/8"]
    assert web_config(Settings()).allow_private == []
    with pytest.raises(ValueError, match="not a CIDR"):
        web_config(Settings(plugins={"plugins.web": {"allow_private": ["intranet"]}}))


# ----------------------------------------------------------------------- the tool


async def test_the_tool_checks_its_arguments(site: FakeSite) -> None:
    tool = web_fetch_tool(fetcher())
    site.page("/", "short text", content_type="text/plain")
    context: Any = None
    with pytest.raises(ToolError) as caught:
        await tool.execute(context, {"url": site.url("/"), "depth": 2})
    assert caught.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ToolError):
        await tool.execute(context, {"url": site.url("/"), "max_chars": 5})
    result = await tool.execute(context, {"url": site.url("/"), "max_chars": 10**9})
    assert isinstance(result, str) and result.endswith("short text")


async def test_a_run_fetches_a_page_and_the_model_reads_it(roost_app: Any,
                                                           site: FakeSite) -> None:
    site.page("/chickens", ARTICLE)
    url = site.url("/chickens")
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "web_fetch", "arguments": {"url": url}}]},
                    {"reply": "They sleep on perches."}]}],
        plugins={"plugins.web": {"allow_private": LOCAL}})
    assert await chat.ask("where do chickens sleep? read " + url) == ["They sleep on perches."]
    assert "web_fetch" in [t.name for t in chat.requests[0].tools]
    answer = without_summary(chat.requests[1].messages[-1].content)
    assert answer.startswith(f"URL: {url}\nTitle: Roosting habits & more\n")
    assert "Chickens roost on perches at night" in answer
    assert [r.path for r in site.requests] == ["/chickens"]


async def test_a_transient_failure_is_retried_by_the_executor_and_the_page_read(
        roost_app: Any, site: FakeSite) -> None:
    site.page("/news", "<title>News</title><p>fresh</p>")
    site.fail_first("/news", 503)
    url = site.url("/news")
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "web_fetch", "arguments": {"url": url}}]},
                    {"reply": "read it"}]}],
        plugins={"plugins.web": {"allow_private": LOCAL}})
    assert await chat.ask("news?") == ["read it"]
    answer = chat.requests[1].messages[-1]
    assert not answer.is_error and "Title: News" in answer.content
    assert [r.path for r in site.requests] == ["/news", "/news"]


async def test_a_permanent_failure_is_not_retried(roost_app: Any, site: FakeSite) -> None:
    site.fail("/gone", 404)
    url = site.url("/gone")
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "web_fetch", "arguments": {"url": url}}]},
                    {"reply": "not there"}]}],
        plugins={"plugins.web": {"allow_private": LOCAL}})
    assert await chat.ask("read it") == ["not there"]
    answer = chat.requests[1].messages[-1]
    assert answer.is_error and "Code HTTP_404: HTTP 404 Not Found from" in answer.content
    assert len(site.requests) == 1


async def test_a_run_is_told_why_a_private_address_was_refused(roost_app: Any,
                                                               site: FakeSite) -> None:
    url = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "web_fetch", "arguments": {"url": url}}]},
                    {"reply": "I cannot read that address."}]}])
    assert await chat.ask("fetch the metadata") == ["I cannot read that address."]
    result = chat.requests[1].messages[-1]
    assert "BLOCKED_ADDRESS" in result.content or "cloud metadata" in result.content
    assert "cloud metadata address" in result.content
