"""The Control UI in a real Chromium, against ``roost run`` on the fake Telegram.

One ``roost run`` serves the whole module (``roost_ui``); each test has its own browser
context and, where it chats, its own Telegram user, so the tests do not see each
other's sessions (under xdist a worker may start its own ``roost run``). With
``ROOST_UI_SCREENSHOTS=1`` pages are saved as screenshots (``artifacts/ui``); the test
visiting every page comes last, so that its pages show what the others did.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.async_api import Page, expect

from bot.testing.telegram import user
from tests.browser.harness import PageErrors, RoostUi, screenshot, until

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

CAROL = user(44, "Carol", "carol")
DAVE = user(45, "Dave", "dave")
ERIN = user(46, "Erin", "erin")
MALLORY = user(47, "Mallory", "mallory")
FRANK = user(48, "Frank", "frank")
GRACE = user(49, "Grace", "grace")
HEIDI = user(42, "Heidi", "heidi")
IVAN = user(43, "Ivan", "ivan")
STRANGER = user(77, "Stranger", "stranger")
"""Not on the allowlist: must pair."""


def text_of(calls: list[Any]) -> list[str]:
    return [str(c.params.get("text", "")) for c in calls]


async def answered(ui: RoostUi, sender: Mapping[str, Any], text: str,
                   reply: str) -> None:
    """``sender`` DMs ``text``; waits until the bot's reply containing ``reply`` arrives."""
    ui.telegram.private_message(text, sender=sender)
    await until(lambda: any(reply in t for t in ui.telegram.sent_texts(sender["id"])),
                f"the reply {reply!r} to {text!r}")


async def nav_paths(page: Page) -> list[str]:
    links = page.locator("nav.pages a")
    return [str(await links.nth(i).get_attribute("href")) for i in range(await links.count())]


async def actions(page: Page) -> list[str]:
    """Where ``page`` can POST to (forms and htmx ``hx-post``), but logging out."""
    found = await page.eval_on_selector_all(
        "form[method=post i], [hx-post]",
        "els => els.map(e => e.getAttribute('hx-post') || e.getAttribute('action') || '')")
    return sorted({a for a in found if a and a != "/ui/logout"})


async def session_path(ui: RoostUi, page: Page, sender: Mapping[str, Any]) -> str:
    """The transcript page of ``sender``'s direct chat, found from the sessions list."""
    await page.goto(ui.url("/ui/sessions"))
    link = page.locator("#session-rows a", has_text=re.compile(rf"\b{sender['id']}\b")).first
    return str(await link.get_attribute("href"))


async def test_a_dm_appears_in_sessions_live_and_its_transcript_opens(
    roost_ui: RoostUi, page: Page,
) -> None:
    await roost_ui.login(page, "viewer")
    await page.goto(roost_ui.url("/ui/sessions"))
    await page.evaluate("window.notReloaded = true")
    roost_ui.telegram.private_message("is the garden watered yet?", sender=CAROL)
    row = page.get_by_text("is the garden watered yet?").first
    await expect(row).to_be_visible(timeout=10_000)
    assert await page.evaluate("window.notReloaded === true"), "the page was reloaded"
    await screenshot(page, "sessions-live")

    await page.locator("#session-rows a", has_text=re.compile(r"\b44\b")).first.click()
    await expect(page).to_have_url(re.compile(r"/ui/sessions/\d+$"))
    await expect(page.get_by_text("is the garden watered yet?").first).to_be_visible()
    await expect(page.get_by_text("echo: is the garden watered yet?").first).to_be_visible()
    await screenshot(page, "session-transcript")


async def test_the_overview_counts_a_new_run_live(roost_ui: RoostUi, page: Page) -> None:
    await roost_ui.login(page, "viewer")
    await page.goto(roost_ui.url("/ui/"))
    await page.evaluate("window.notReloaded = true")
    card = page.locator("section", has=page.locator("#ov-runs"))
    runs = card.locator(".big").first

    async def count() -> int:
        return int((await runs.inner_text()).replace(",", ""))

    before = await count()

    async def counted() -> bool:
        return await count() > before

    await answered(roost_ui, GRACE, "count me in", "echo: count me in")
    await until(counted, "the overview counting the new run")
    assert await page.evaluate("window.notReloaded === true"), "the page was reloaded"


async def test_the_log_tail_shows_a_new_run_live(roost_ui: RoostUi, page: Page) -> None:
    await roost_ui.login(page, "admin")
    await page.goto(roost_ui.url("/ui/logs"))
    await page.evaluate("window.notReloaded = true")
    lines = page.locator("#log-lines")
    await expect(lines).not_to_contain_text("direct:42")
    await answered(roost_ui, HEIDI, "anything in the log?", "echo: anything")
    await expect(lines).to_contain_text("completed session=default:telegram:direct:42",
                                        timeout=10_000)
    assert await page.evaluate("window.notReloaded === true"), "the page was reloaded"


async def test_an_error_id_shown_in_the_chat_opens_its_detail(
    roost_ui: RoostUi, page: Page,
) -> None:
    await answered(roost_ui, ERIN, "fail to read my notes", "That failed: err_")
    reply = next(t for t in roost_ui.telegram.sent_texts(ERIN["id"]) if "err_" in t)
    error_id = re.search(r"err_\w+", reply).group(0)  # type: ignore[union-attr]
    await roost_ui.login(page, "viewer")
    await page.goto(roost_ui.url(await session_path(roost_ui, page, ERIN)))
    await screenshot(page, "session-transcript-tools")
    # The ID in the answer, as the chat showed it, links to the error's detail.
    await page.locator("#messages a", has_text=error_id).last.click()
    await expect(page).to_have_url(roost_ui.url(f"/ui/errors/{error_id}"))
    main = page.locator("main")
    await expect(main).to_contain_text(error_id)
    await expect(main).to_contain_text("read_file")
    await expect(main).to_contain_text("no/such/file.md")
    await expect(main).to_contain_text("Traceback")
    await screenshot(page, "error-detail")


async def test_a_message_with_markup_renders_as_text_and_runs_nothing(
    roost_ui: RoostUi, page: Page, page_errors: PageErrors,
) -> None:
    attack = ('<img src=x onerror="window.pwned=1;alert(1)"> and '
              '<script>window.pwned=2;alert(2)</script> <b>bold</b>')
    await answered(roost_ui, MALLORY, attack, "echo: ")
    await roost_ui.login(page, "admin")
    await page.goto(roost_ui.url("/ui/sessions"))
    await expect(page.get_by_text('<img src=x onerror="window.pwned=1').first).to_be_visible()
    await page.locator("#session-rows a", has_text=re.compile(r"\b47\b")).first.click()
    await expect(page.get_by_text(attack).first).to_be_visible()
    await screenshot(page, "session-markup")
    assert await page.evaluate("typeof window.pwned") == "undefined"
    assert await page.locator("main img[src=x], main script").count() == 0
    assert not page_errors.dialogs


async def test_a_viewer_sees_no_action_and_a_forged_post_is_refused(
    roost_ui: RoostUi, page: Page, browser: Any,
) -> None:
    await answered(roost_ui, DAVE, "a session to act on", "echo: ")
    await roost_ui.login(page, "admin")
    pages = [await session_path(roost_ui, page, DAVE), "/ui/plugins", "/ui/access",
             "/ui/jobs", "/ui/outbox"]
    targets: dict[str, list[str]] = {}
    for path in pages:
        await page.goto(roost_ui.url(path))
        targets[path] = await actions(page)
    assert targets[pages[0]] and targets["/ui/plugins"], targets  # stop/reset, enable/disable

    viewer_context = await browser.new_context()
    try:
        viewer = await viewer_context.new_page()
        await roost_ui.login(viewer, "viewer")
        for path in pages:
            await viewer.goto(roost_ui.url(path))
            assert await actions(viewer) == [], path
            kind = "session" if path.startswith("/ui/sessions/") else path.rsplit("/", 1)[-1]
            await screenshot(viewer, f"viewer-{kind}")
        token = await viewer.get_attribute("meta[name=csrf-token]", "content")
        assert token
        for target in sorted({t for ts in targets.values() for t in ts}):
            reply = await viewer.request.post(roost_ui.url(target), form={"csrf": token},
                                              max_redirects=0)
            assert reply.status == 403, (target, reply.status)
    finally:
        await viewer_context.close()


async def test_a_post_without_the_csrf_token_is_refused(
    roost_ui: RoostUi, page: Page,
) -> None:
    await answered(roost_ui, DAVE, "another message", "echo: another")
    await roost_ui.login(page, "admin")
    session = await session_path(roost_ui, page, DAVE)
    await page.goto(roost_ui.url(session))
    targets = await actions(page)
    await page.goto(roost_ui.url("/ui/plugins"))
    targets += await actions(page)
    assert targets
    for target in targets:
        for form in ({}, {"csrf": "not-the-token"}):
            reply = await page.request.post(roost_ui.url(target), form=form, max_redirects=0)
            assert reply.status == 403, (target, form, reply.status)
    # Nothing happened: the session still answers with its history, every plugin is on.
    await answered(roost_ui, DAVE, "still here?", "echo: still here?")


async def test_approving_a_pairing_code_in_access_lets_the_next_dm_through(
    roost_ui: RoostUi, page: Page, page_errors: PageErrors,
) -> None:
    roost_ui.telegram.private_message("hello, may I?", sender=STRANGER)
    await until(lambda: any("/pair approve" in t
                            for t in roost_ui.telegram.sent_texts(STRANGER["id"])),
                "the pairing code sent to the stranger")
    told = next(t for t in roost_ui.telegram.sent_texts(STRANGER["id"]) if "/pair approve" in t)
    code = re.search(r"/pair approve (\S+)", told).group(1)  # type: ignore[union-attr]

    await roost_ui.login(page, "operator")
    await page.goto(roost_ui.url("/ui/access"))
    request = page.locator("tr, li", has_text=code).first
    await expect(request).to_be_visible()
    await screenshot(page, "access-pending")
    await request.get_by_role("button", name=re.compile("approve", re.IGNORECASE)).click()
    await expect(page.locator("tr", has_text=code)).to_have_count(0)
    await expect(page.locator("tr", has_text="Stranger")).to_have_count(1)  # paired now
    await screenshot(page, "access-approved")

    await answered(roost_ui, STRANGER, "now may I?", "echo: now may I?")
    await page.goto(roost_ui.url("/ui/audit"))
    await expect(page.locator("main")).to_contain_text("operator-user")
    await expect(page.locator("main")).to_contain_text(code)


async def test_stopping_a_running_run_from_the_ui_stops_it_in_the_chat(
    roost_ui: RoostUi, page: Page,
) -> None:
    await answered(roost_ui, FRANK, "first, quickly", "echo: first, quickly")
    roost_ui.telegram.private_message("slow answer please", sender=FRANK)
    await roost_ui.login(page, "operator")
    session = await session_path(roost_ui, page, FRANK)

    async def shown(count: str) -> bool:
        await page.goto(roost_ui.url(session))
        return f"{count} running" in await page.locator("main").inner_text()

    await until(lambda: shown("1"), "the slow run shown as running")
    await screenshot(page, "session-running")
    await page.get_by_role("button", name=re.compile("^stop", re.IGNORECASE)).click()
    await expect(page.get_by_role("status")).to_contain_text("Stopped")
    await until(lambda: shown("0"), "the run gone from the session")
    # Stopped: the next message is answered at once, not after the slow run's minute, and
    # the slow run's answer never comes.
    await answered(roost_ui, FRANK, "are you there?", "echo: are you there?")
    assert not any("finished slowly" in t for t in roost_ui.telegram.sent_texts(FRANK["id"]))
    await page.goto(roost_ui.url("/ui/audit"))
    await expect(page.locator("main")).to_contain_text("operator-user")


async def test_a_tool_call_waiting_shows_up_live_and_is_approved_from_the_page(
    roost_ui: RoostUi, page: Page, page_errors: PageErrors,
) -> None:
    await roost_ui.login(page, "admin")
    await page.goto(roost_ui.url("/ui/approvals"))
    waiting = page.locator("#approvals-pending section", has_text="ui-note.txt")
    await expect(waiting).to_have_count(0)
    roost_ui.telegram.private_message("write the note", sender=IVAN)
    # The open page shows the question without a reload (its SSE stream).
    await expect(waiting).to_have_count(1)
    await expect(waiting).to_contain_text("<b>hi</b>")  # the arguments, as text
    await screenshot(page, "approvals-waiting")
    await waiting.get_by_role("button", name=re.compile("^Approve .*[0-9a-f]$")).click()
    await expect(waiting).to_have_count(0)
    decided = page.locator("tbody tr", has_text="ui-note.txt").first
    await expect(decided).to_contain_text("Approved by admin-user (Control UI)")
    await screenshot(page, "approvals-decided")
    await until(lambda: "written" in roost_ui.telegram.sent_texts(IVAN["id"]),
                "the run going on after the approval")
    # The chat's prompt shows the decision and who took it, its buttons gone.
    assert any(m["text"].startswith("Approved by admin-user (Control UI)")
               and "reply_markup" not in m
               for (chat, _), m in roost_ui.telegram.messages.items() if chat == IVAN["id"])
    assert not page_errors.dialogs


async def test_log_in_and_every_page_renders_without_a_script_error(
    roost_ui: RoostUi, page: Page, page_errors: PageErrors,
) -> None:
    await page.goto(roost_ui.url("/ui/"))
    await expect(page).to_have_url(re.compile(r"/ui/login"))
    await page.get_by_label("Name").fill("admin-user")
    await page.get_by_label("Password").fill("not the password")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("alert")).to_be_visible()
    await screenshot(page, "login")

    await roost_ui.login(page, "admin")
    paths = await nav_paths(page)
    for expected in ("/ui/", "/ui/users", "/ui/sessions", "/ui/errors", "/ui/usage", "/ui/access",
                     "/ui/outbox", "/ui/jobs", "/ui/plugins", "/ui/config", "/ui/logs",
                     "/ui/audit"):
        assert expected in paths, paths
    for path in paths:
        reply = await page.goto(roost_ui.url(path))
        assert reply is not None and reply.status == 200, path
        await expect(page.locator("main h1").first).to_be_visible()
        name = path.strip("/").removeprefix("ui").strip("/") or "overview"
        await screenshot(page, name)
    # A refusal by the Content-Security-Policy is a console error: the page fixture fails
    # the test on any.
    assert not page_errors.all()


async def test_every_page_fits_a_phone_follows_dark_mode_and_labels_its_controls(
    roost_ui: RoostUi, browser: Any,
) -> None:
    context = await browser.new_context(viewport={"width": 390, "height": 844},
                                        color_scheme="dark", is_mobile=True, has_touch=True)
    try:
        phone = await context.new_page()
        await roost_ui.login(phone, "admin")
        await phone.keyboard.press("Tab")  # the first stop skips to the content
        assert await phone.evaluate("document.activeElement.getAttribute('href')") == "#main"
        for path in await nav_paths(phone):
            await phone.goto(roost_ui.url(path))
            name = path.strip("/").removeprefix("ui").strip("/") or "overview"
            await screenshot(phone, f"phone-dark-{name}")
            overflow = await phone.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, (path, overflow)
            background = await phone.evaluate(
                "getComputedStyle(document.body).backgroundColor")
            channels = [int(c) for c in re.findall(r"\d+", background)[:3]]
            assert sum(channels) < 3 * 100, (path, background)  # dark, as the system asks
            unlabelled = await phone.eval_on_selector_all(
                "main input:not([type=hidden]), main select, main textarea, main button",
                """els => els.filter(e => !(e.labels && e.labels.length)
                        && !e.getAttribute('aria-label') && !e.textContent.trim())
                      .map(e => e.outerHTML)""")
            assert unlabelled == [], (path, unlabelled)
    finally:
        await context.close()


async def test_times_are_shown_in_the_viewers_timezone(roost_ui: RoostUi, browser: Any) -> None:
    await answered(roost_ui, CAROL, "what time is it there?", "echo: what time")
    zone = "Pacific/Kiritimati"  # UTC+14: never the same wall-clock time as UTC
    context = await browser.new_context(timezone_id=zone, locale="en-GB")
    try:
        tab = await context.new_page()
        await roost_ui.login(tab, "viewer")
        await tab.goto(roost_ui.url(await session_path(roost_ui, tab, CAROL)))
        shown = tab.locator("main time[datetime]").first
        await expect(shown).to_have_attribute("data-local", "1")
        stamp = str(await shown.get_attribute("datetime"))
        local = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(ZoneInfo(zone))
        text = await shown.inner_text()
        assert f"{local:%d/%m/%Y}, {local:%H:%M}" in text and "UTC" not in text, (stamp, text)
    finally:
        await context.close()
