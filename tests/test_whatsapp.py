"""The WhatsApp channel (plugins/whatsapp) against the fake Cloud API and webhook sender.

The channel runs on a small aiohttp server standing in for Roost's HTTP server; the
fake signs and delivers webhooks like Meta and answers the Graph API with its
documented shapes, failures included (131047, 130429, 131056, 502 pages, resets,
expired media URLs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from bot.testing.whatsapp import FakeWhatsApp
from bot.testing.whatsapp import fake_whatsapp as _fake_whatsapp  # noqa: F401  (the fixture)
from plugins.whatsapp.channel import WhatsAppChannel
from plugins.whatsapp.config import WhatsAppConfig
from plugins.whatsapp.formatting import to_whatsapp
from roost import (
    Attachment,
    ChannelContext,
    InboundMessage,
    MediaError,
    MediaTooLarge,
    OutboundFile,
    OutboundMessage,
)
from roost.channels import (
    Button,
    ButtonPress,
    DeliveryPolicy,
    InboundEvent,
    ReactionEvent,
    SetupError,
    Undeliverable,
)
from tests.media_samples import png

ALICE = "15551234567"
FAST = DeliveryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, max_retry_after=0.1)


class Routes:
    """Roost's HTTP server as a channel sees it (:class:`roost.channels.WebRoutes`)."""

    def __init__(self) -> None:
        self.posts: dict[str, Any] = {}
        self.gets: dict[str, Any] = {}
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()

        async def route(request: web.Request) -> web.StreamResponse:
            table = self.gets if request.method == "GET" else self.posts
            handler = table.get(request.path)
            if handler is None:
                return web.Response(status=404)
            response: web.StreamResponse = await handler(request)
            return response

        app.router.add_route("*", "/{path:.*}", route)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def add_post(self, path: str, handler: Any) -> None:
        self.posts[path] = handler

    def remove_post(self, path: str) -> None:
        self.posts.pop(path, None)

    def add_get(self, path: str, handler: Any) -> None:
        self.gets[path] = handler

    def remove_get(self, path: str) -> None:
        self.gets.pop(path, None)


class Inbox:
    """The core's handler: records events, drops redeliveries by event id."""

    def __init__(self) -> None:
        self.events: list[InboundEvent] = []
        self.seen: set[str] = set()
        self.gate: asyncio.Event | None = None
        self.fail_next = 0

    async def __call__(self, event: InboundEvent) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("database is locked")
        key = event.event_id if isinstance(event, InboundMessage | ReactionEvent) \
            else event.press_id
        if key in self.seen:
            return
        self.seen.add(key)
        self.events.append(event)


Start = Callable[..., Awaitable[tuple[WhatsAppChannel, Inbox]]]


@pytest.fixture
async def start(fake_whatsapp: FakeWhatsApp) -> AsyncIterator[Start]:
    channels: list[WhatsAppChannel] = []
    routes = Routes()
    await routes.start()
    fake_whatsapp.webhook_url = f"http://127.0.0.1:{routes.port}/whatsapp/webhook"

    async def factory(**config: Any) -> tuple[WhatsAppChannel, Inbox]:
        settings = WhatsAppConfig(
            phone_number_id=fake_whatsapp.phone_number_id, access_token=fake_whatsapp.token,
            app_secret=fake_whatsapp.app_secret, verify_token=fake_whatsapp.verify_token,
            api_base=fake_whatsapp.base_url, rate_limit_wait=0.05, pair_rate_limit_wait=0.05,
            **config)
        channel = WhatsAppChannel(settings, policy=FAST)
        inbox = Inbox()
        await channel.begin(inbox, ChannelContext(http_routes=routes))
        channels.append(channel)
        return channel, inbox

    yield factory
    for channel in channels:
        await channel.stop()
    assert routes.runner is not None
    await routes.runner.cleanup()


def reply(text: str, **fields: Any) -> OutboundMessage:
    return OutboundMessage(channel="whatsapp", chat_id=ALICE, text=text, **fields)


async def talking(start: Start, fake: FakeWhatsApp, **config: Any) -> tuple[
        WhatsAppChannel, Inbox, InboundMessage]:
    """A started channel and Alice's first message, recorded."""
    channel, inbox = await start(**config)
    assert await fake.deliver(fake.text(ALICE, "hello")) == 200
    (message,) = inbox.events
    assert isinstance(message, InboundMessage)
    return channel, inbox, message


# -- the webhook -----------------------------------------------------------------


async def test_the_verification_handshake_echoes_the_challenge_only_for_the_verify_token(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    await start()
    token = fake_whatsapp.verify_token
    assert await fake_whatsapp.verification(token) == (200, "1158201444")
    status, body = await fake_whatsapp.verification("guess")
    assert status == 403 and "1158201444" not in body
    assert (await fake_whatsapp.verification(token, mode="unsubscribe"))[0] == 403


async def test_a_delivery_without_the_apps_signature_is_refused_and_never_handled(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    _, inbox = await start()
    payload = fake_whatsapp.text(ALICE, "forged")
    assert await fake_whatsapp.post(payload, signature="sha256=" + "0" * 64) == 401
    assert await fake_whatsapp.post(payload, signature="") == 401
    assert inbox.events == []
    assert await fake_whatsapp.post(payload) == 200
    assert [e.text for e in inbox.events if isinstance(e, InboundMessage)] == ["forged"]


async def test_a_delivery_is_answered_only_after_the_handler_returned(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    _, inbox = await start()
    inbox.gate = asyncio.Event()
    posting = asyncio.create_task(fake_whatsapp.post(fake_whatsapp.text(ALICE, "hi")))
    await asyncio.sleep(0.05)  # give a premature answer the chance to show
    assert not posting.done()
    inbox.gate.set()
    assert await posting == 200


async def test_an_unrecorded_delivery_gets_a_500_and_metas_redelivery_is_handled_once(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    _, inbox = await start()
    inbox.fail_next = 1
    payload = fake_whatsapp.text(ALICE, "once")
    assert await fake_whatsapp.deliver(payload) == 200
    assert await fake_whatsapp.post(payload) == 200  # a late duplicate
    assert fake_whatsapp.deliveries == [500, 200, 200]
    assert [e.text for e in inbox.events if isinstance(e, InboundMessage)] == ["once"]


async def test_a_text_becomes_a_direct_message_keyed_by_its_wamid_and_statuses_are_ignored(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    _, inbox = await start()
    payload = fake_whatsapp.text(ALICE, "hello", name="Alice W")
    wamid = payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    assert await fake_whatsapp.post(fake_whatsapp.status("wamid.OUT1", ALICE)) == 200
    assert await fake_whatsapp.post(fake_whatsapp.status("wamid.OUT2", ALICE, "failed",
                                                         error=131047)) == 200
    assert await fake_whatsapp.post(payload) == 200
    (message,) = inbox.events
    assert isinstance(message, InboundMessage)
    assert (message.chat_id, message.chat_type, message.sender_id, message.sender_name,
            message.message_id, message.event_id) == (ALICE, "direct", ALICE, "Alice W",
                                                      wamid, wamid)


# -- replies ---------------------------------------------------------------------


def test_markdown_becomes_whatsapps_formatting_and_code_is_left_alone() -> None:
    assert to_whatsapp("# Plan\n**bold**, *it*, ~~gone~~ and `**raw**` [docs](https://x.y)") \
        == "*Plan*\n*bold*, _it_, ~gone~ and `**raw**` docs (https://x.y)"
    assert to_whatsapp("```python\n**kept**\n```") == "```\n**kept**\n```"


async def test_a_long_reply_goes_in_4096_character_pieces_after_the_typing_indicator(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, _, message = await talking(start, fake_whatsapp)
    async with channel.typing(message):
        await fake_whatsapp.wait_until(lambda: bool(fake_whatsapp.reads))
        last = await channel.send(reply("**a**" + "b" * 5000))
    (read,) = fake_whatsapp.reads
    assert read["message_id"] == message.message_id
    assert read["typing_indicator"] == {"type": "text"}
    first, second = fake_whatsapp.visible(ALICE)
    assert first.startswith("*a*bbb") and len(first) <= 4096 < len(first + second)
    assert len(first + second) == 5003
    assert last == fake_whatsapp.sent[-1].wamid


async def test_buttons_go_as_reply_buttons_and_a_press_comes_back_as_a_button_press(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, inbox, _ = await talking(start, fake_whatsapp)
    buttons = ((Button("Approve this very long action", "ap:1"), Button("Deny", "dn:1")),
               (Button("Always", "al:1"), Button("Never", "nv:1")))
    await channel.send(reply("Run `rm`?", buttons=buttons))
    first, second = fake_whatsapp.sent
    titles = [b["reply"]["title"] for b in first.payload["interactive"]["action"]["buttons"]]
    assert titles == ["Approve this very l…", "Deny", "Always"]
    assert first.text == "Run `rm`?"
    assert second.payload["interactive"]["action"]["buttons"][0]["reply"]["id"] == "nv:1"
    assert await fake_whatsapp.post(fake_whatsapp.press(ALICE, first.wamid, "ap:1")) == 200
    press = inbox.events[-1]
    assert isinstance(press, ButtonPress)
    assert (press.chat_id, press.message_id, press.data, press.user_id) == (
        ALICE, first.wamid, "ap:1", ALICE)


async def test_outside_the_window_a_reply_is_undeliverable_without_a_template(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, _ = await start()  # Alice never wrote: no window
    with pytest.raises(Undeliverable, match="24-hour window"):
        await channel.send(reply("your reminder"))
    assert fake_whatsapp.sent == [] and fake_whatsapp.calls == []


async def test_outside_the_window_the_template_carries_the_reply(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, _ = await start(template_name="roost_reply", template_language="en_US")
    await channel.send(reply("your\nreminder:  water the plants"))
    (sent,) = fake_whatsapp.sent
    assert sent.type == "template"
    assert sent.payload["template"]["name"] == "roost_reply"
    assert sent.text == "your reminder: water the plants"


async def test_131047_from_whatsapp_is_treated_as_outside_the_window(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, _, _ = await talking(start, fake_whatsapp)
    fake_whatsapp.skew = 25 * 3600  # WhatsApp's view: a day has passed
    with pytest.raises(Undeliverable):
        await channel.send(reply("late"))
    assert [c.result for c in fake_whatsapp.calls] == ["131047"]


async def test_the_window_is_kept_in_the_channels_durable_notes(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, _, _ = await talking(start, fake_whatsapp)
    note = await channel.state.get(f"inbound:{ALICE}")
    assert note is not None and abs(float(note) - fake_whatsapp.last_inbound[ALICE]) < 2
    await channel.state.put(f"inbound:{ALICE}", repr(float(note) - 24 * 3600))
    with pytest.raises(Undeliverable):
        await channel.send(reply("a day late"))


@pytest.mark.parametrize("fault", ["130429", "131056", "502", "reset"])
async def test_rate_limits_and_transient_failures_are_waited_out_and_sent_once(
        start: Start, fake_whatsapp: FakeWhatsApp, fault: str) -> None:
    channel, _, _ = await talking(start, fake_whatsapp)
    fake_whatsapp.fail(fault, times=2)
    await channel.send(reply("through"))
    assert fake_whatsapp.visible(ALICE) == ["through"]
    if fault in ("130429", "131056"):
        scope = "bot" if fault == "130429" else ALICE
        assert [c.result for c in fake_whatsapp.calls] == ["fault", "fault", "ok"]
        channel.limiter.block(scope, 0.0)  # the window had been opened by the 429s


async def test_a_reaction_goes_both_ways(start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, inbox, message = await talking(start, fake_whatsapp)
    assert await channel.react(ALICE, message.message_id, "👍")
    (sent,) = fake_whatsapp.sent
    assert sent.payload["reaction"] == {"message_id": message.message_id, "emoji": "👍"}
    assert await fake_whatsapp.post(fake_whatsapp.reaction(ALICE, "wamid.OUT9", "❤️")) == 200
    assert await fake_whatsapp.post(fake_whatsapp.reaction(ALICE, "wamid.OUT9", "")) == 200
    added, removed = inbox.events[1:]
    assert isinstance(added, ReactionEvent) and isinstance(removed, ReactionEvent)
    assert (added.emoji, added.added, removed.added) == ("❤️", True, False)


# -- media -----------------------------------------------------------------------


async def test_media_in_is_looked_up_then_downloaded_and_an_expired_url_looked_up_again(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    _, inbox = await start()
    image = png(8, 8)
    assert await fake_whatsapp.post(fake_whatsapp.media(
        ALICE, "image", image, "image/png", caption="what is this?")) == 200
    assert await fake_whatsapp.post(fake_whatsapp.media(
        ALICE, "audio", b"OggS" + b"\0" * 60, "audio/ogg; codecs=opus", voice=True)) == 200
    photo, voice = inbox.events
    assert isinstance(photo, InboundMessage) and isinstance(voice, InboundMessage)
    (attachment,) = photo.attachments
    assert (photo.text, attachment.kind, attachment.mime_type) == (
        "what is this?", "photo", "image/png")
    assert voice.attachments[0].kind == "voice"
    channel = (await start())[0]
    assert await channel.download(attachment, 10 << 20) == image
    # The next download's URL expires between the lookup and the fetch.
    fake_whatsapp.expiring = 1
    assert await channel.download(attachment, 10 << 20) == image
    assert [c.result for c in fake_whatsapp.calls if c.path == "download"] == [
        "ok", "expired", "ok"]
    fake_whatsapp.expiring = 2
    with pytest.raises(MediaError, match="expired"):
        await channel.download(attachment, 10 << 20)


async def test_media_that_whatsapp_no_longer_has_or_too_big_is_one_clear_error(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    channel, _ = await start()
    with pytest.raises(MediaError, match="no longer has"):
        await channel.download(Attachment(kind="photo", name="x.jpg", url="4040404"), 1000)
    payload = fake_whatsapp.media(ALICE, "document", b"x" * 5000, "application/pdf",
                                  filename="big.pdf")
    media_id = payload["entry"][0]["changes"][0]["value"]["messages"][0]["document"]["id"]
    with pytest.raises(MediaTooLarge):
        await channel.download(Attachment(kind="document", name="big.pdf", url=media_id), 1000)


async def test_a_file_goes_out_as_an_upload_then_a_message_by_media_id(
        start: Start, fake_whatsapp: FakeWhatsApp, tmp_path: Any) -> None:
    channel, _, _ = await talking(start, fake_whatsapp)
    path = tmp_path / "chart.png"
    path.write_bytes(png(8, 8))
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4 report")
    await channel.send(reply("here", files=(
        OutboundFile(str(path), "chart.png", "image/png", path.stat().st_size, "the chart"),
        OutboundFile(str(pdf), "report.pdf", "application/pdf", pdf.stat().st_size))))
    text, image, document = fake_whatsapp.sent
    assert text.text == "here"
    assert image.type == "image" and image.payload["image"]["caption"] == "the chart"
    assert fake_whatsapp.media_store[image.payload["image"]["id"]].data == png(8, 8)
    assert document.payload["document"]["filename"] == "report.pdf"


async def test_signed_deliveries_of_unknown_shapes_are_skipped_with_200_not_redelivered(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    _, inbox = await start()
    good = fake_whatsapp.text(ALICE, "still here")
    value = good["entry"][0]["changes"][0]["value"]
    odd_message = {**value["messages"][0], "id": "wamid.ODD", "text": "not an object"}
    odd_image = {**value["messages"][0], "id": "wamid.IMG", "type": "image",
                 "image": {"id": 7, "file_size": "x"}}
    shapes: list[Any] = [
        [], {"entry": "x"}, {"entry": [{"changes": [{"value": {"messages": "x"}}]}]},
        {"entry": [{"changes": [{"value": {"contacts": 5, "messages": [1, None]}}]}]},
        {"entry": [{"changes": [{"value": {**value, "messages": [odd_message, odd_image]}}]}]},
        {"entry": [{"changes": [{"value": {"statuses": [{"status": "failed",
                                                         "errors": [5]}]}}]}]},
    ]
    for shape in shapes:
        assert await fake_whatsapp.post(shape) == 200, shape
    assert await fake_whatsapp.post(b"{not json") == 200
    assert await fake_whatsapp.post(good) == 200
    texts = [e.text for e in inbox.events if isinstance(e, InboundMessage)]
    assert texts[-1] == "still here"


async def test_a_131047_status_closes_the_window_unless_the_person_wrote_since(
        start: Start, fake_whatsapp: FakeWhatsApp) -> None:
    # WhatsApp often takes the message and reports 131047 later, in a failed status.
    channel, _, _ = await talking(start, fake_whatsapp)
    await channel.send(reply("taken"))
    failed = fake_whatsapp.status(fake_whatsapp.sent[0].wamid, ALICE, "failed", error=131047)
    assert await fake_whatsapp.post(failed) == 200
    with pytest.raises(Undeliverable):
        await channel.send(reply("next"))
    assert len(fake_whatsapp.sent) == 1
    fake_whatsapp.skew += 5  # timestamps are in seconds: she writes back a little later
    assert await fake_whatsapp.post(fake_whatsapp.text(ALICE, "back")) == 200
    assert await fake_whatsapp.post(failed) == 200  # a late copy: she wrote since
    await channel.send(reply("welcome back"))
    assert fake_whatsapp.visible(ALICE) == ["taken", "welcome back"]


async def test_a_missing_setting_or_http_server_is_one_line_naming_it() -> None:
    inbox = Inbox()
    partial = WhatsAppChannel(WhatsAppConfig(phone_number_id="1", access_token="t"))
    with pytest.raises(SetupError) as refused:
        await partial.begin(inbox)
    assert str(refused.value) == ("the whatsapp channel needs WHATSAPP_APP_SECRET, "
                                  "WHATSAPP_VERIFY_TOKEN")
    complete = WhatsAppChannel(WhatsAppConfig(phone_number_id="1", access_token="t",
                                              app_secret="s", verify_token="v"))
    with pytest.raises(SetupError, match="ROOST_HTTP_PORT"):
        await complete.begin(inbox)
