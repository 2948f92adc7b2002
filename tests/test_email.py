"""The email channel against real servers: Dovecot (IMAP) and aiosmtpd (SMTP).

Mail reaches the bot's mailbox the way a mail client's does (``imaplib`` APPEND to a
Dovecot started once per test session); the bot reads it with aioimaplib (IDLE)
and answers through aiosmtplib to an aiosmtpd server that wants a login. The core
runs in-process with a scripted model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.testing.app import EventRecorder, scripted, settle
from bot.testing.mail import Dovecot, SmtpSink
from plugins.mail.channel import EmailChannel
from plugins.scripted_provider import ScriptedProvider
from roost import ChannelContext, ChannelHealth, InboundMessage, OutboundMessage, Settings
from roost.channels import DeliveryPolicy, InboundEvent, MemoryState
from tests.conftest import AppFactory
from tests.test_replicas_leader import Logged
from workspaces import workspace_dir

FAST = DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)
ALICE = "alice@example.com"
BOT = "bot@example.com"


@pytest.fixture
async def sink() -> AsyncIterator[SmtpSink]:
    server = await SmtpSink().start()
    try:
        yield server
    finally:
        await server.close()


class Mail:
    """The bot's mailbox on Dovecot, its SMTP server, and Alice writing to it."""

    def __init__(self, dovecot: Dovecot, sink: SmtpSink, user: str | None = None) -> None:
        self.dovecot, self.sink = dovecot, sink
        self.user = user or dovecot.add_user()

    def table(self, **extra: Any) -> dict[str, Any]:
        """The plugin's settings for this mailbox."""
        return {"plugins": {"plugins.mail": {
            "imap_url": f"imap://127.0.0.1:{self.dovecot.port}", "smtp_url": self.sink.url,
            "address": BOT, "username": self.user, "password": "secret",
            "smtp_username": "bot", "reconnect_min_seconds": 0.05, **extra}}}

    def write(self, text: str, *, subject: str = "Plans", sender: str = ALICE,
              answers: EmailMessage | None = None, html: str | None = None,
              headers: dict[str, str] | None = None,
              files: list[tuple[str, str, bytes]] = (),  # type: ignore[assignment]
              received: float | None = None) -> EmailMessage:
        """Alice's mail (answering ``answers``, a reply of the bot's, if given), delivered."""
        mail = EmailMessage()
        mail["From"] = f"Alice <{sender}>"
        mail["To"] = BOT
        mail["Subject"] = subject if answers is None else answers["Subject"]
        mail["Message-ID"] = make_msgid(domain="example.com")
        if answers is not None:
            mail["In-Reply-To"] = answers["Message-ID"]
            mail["References"] = f"{answers['References']} {answers['Message-ID']}"
        for name, value in (headers or {}).items():
            mail[name] = value
        mail.set_content(text)
        if html is not None:
            mail.add_alternative(html, subtype="html")
        for name, mime, data in files:
            maintype, _, subtype = mime.partition("/")
            mail.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
        self.dovecot.deliver(self.user, mail, received=received)
        return mail


@pytest.fixture
def mail(dovecot: Dovecot, sink: SmtpSink) -> Mail:
    return Mail(dovecot, sink)


async def start(make_app: AppFactory, mail: Mail, provider: ScriptedProvider | None,
                **settings: Any) -> tuple[Roost, EmailChannel, EventRecorder]:
    """A Roost app reading ``mail``'s mailbox, once the channel is connected."""
    extra = settings.pop("table", {})
    app, _, log = await make_app(provider, **mail.table(**extra),
                                 **{"dm_policy": "open", **settings})
    channel = EmailChannel(app.settings, policy=FAST)
    await app.add_channel(channel)
    await connected(channel)
    return app, channel, log


async def connected(channel: EmailChannel) -> None:
    async with asyncio.timeout(20):  # a hang guard
        await channel.watcher.idling.wait()
    assert channel.health().ready


def user_texts(provider: ScriptedProvider) -> list[str]:
    return [str(r.messages[-1].content) for r in provider.requests]


# -- conversations -----------------------------------------------------------------


async def test_a_mail_is_answered_in_its_thread_and_a_thread_is_one_conversation(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "Hi **Alice**"}, {"reply": "Noted"}, {"reply": "Other"})
    app, _, _ = await start(make_app, mail, provider)

    first = mail.write("Can we meet on Friday?")
    [reply] = await mail.sink.wait_for(1)
    assert mail.sink.envelopes == [(BOT, [ALICE])]
    assert reply["To"] == ALICE and BOT in reply["From"]
    assert reply["Subject"] == "Re: Plans"
    assert reply["In-Reply-To"] == first["Message-ID"]
    assert reply["References"] == first["Message-ID"]
    assert reply["Auto-Submitted"] == "auto-replied"
    assert reply.get_content_type() == "multipart/alternative"
    plain = reply.get_body(("plain",))
    html = reply.get_body(("html",))
    assert plain is not None and html is not None
    assert plain.get_content().strip() == "Hi **Alice**"
    assert "<strong>Alice</strong>" in html.get_content()
    assert user_texts(provider) == ["Plans\n\nCan we meet on Friday?"]

    # Alice answers in the thread, her client quoting the history below.
    mail.write("Friday works.\n\nOn Mon, Alice wrote:\n> Hi **Alice**\n", answers=reply)
    [_, second] = await mail.sink.wait_for(2)
    assert second["Subject"] == "Re: Plans"
    assert second["References"].split() == [first["Message-ID"], reply["Message-ID"],
                                            second["In-Reply-To"]]
    assert user_texts(provider)[-1] == "Friday works."
    # A new subject is a new thread: a conversation of its own.
    mail.write("Something else", subject="Invoices")
    [*_, third] = await mail.sink.wait_for(3)
    assert third["Subject"] == "Re: Invoices"
    await settle(app)
    requests = provider.requests
    assert [m.role for m in requests[1].messages].count("user") == 2  # the thread's history
    assert [m.role for m in requests[2].messages].count("user") == 1  # a thread apart


async def test_machine_sent_mail_is_never_answered_so_nothing_loops(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "answered"}, loop=True)
    app, _, _ = await start(make_app, mail, provider)
    mail.write("I am on holiday", headers={"Auto-Submitted": "auto-replied"})
    mail.write("Weekly digest", headers={"List-Id": "<news.example.com>"})
    mail.write("Sale!", headers={"Precedence": "bulk"})
    mail.write("Undeliverable", sender="MAILER-DAEMON@example.com")
    # Roost's own reply coming back (a bounce copy, another Roost answering).
    mail.write("Re: hello", sender="other-bot@example.com",
               headers={"Auto-Submitted": "auto-replied", "X-Auto-Response-Suppress": "All"})
    mail.write("A person asks", headers={"Auto-Submitted": "no"})
    [reply] = await mail.sink.wait_for(1)
    await settle(app)
    assert user_texts(provider) == ["Plans\n\nA person asks"]
    assert len(mail.sink.accepted) == 1 and reply["To"] == ALICE


async def test_html_mail_with_attachments_in_and_a_file_out_as_an_attachment(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"steps": [
        {"tool_calls": [{"name": "send_file", "arguments": {"path": "report.csv",
                                                            "caption": "The report"}}]},
        {"reply": "done"}]})
    app, _, _ = await start(make_app, mail, provider, stream_replies=False)
    workspace = workspace_dir(app.settings.workspaces_dir, "email", ALICE)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "report.csv").write_bytes(b"a,b\n1,2\n")
    html = ("<html><body><p>What is in <b>this</b> file?</p>"
            "<blockquote type='cite'>old quoted text</blockquote></body></html>")
    mail.write("ignored: the HTML part is not preferred over this one", html=html,
               files=[("notes.txt", "text/plain", b"hello notes")])
    sent = await mail.sink.wait_for(2)
    await settle(app)
    # The model got the plain part and the attachment, fetched into the workspace.
    text = user_texts(provider)[0]
    assert text.startswith("Plans\n\nignored: the HTML part") and "notes.txt" in text
    [stored] = list(workspace.rglob("notes.txt"))
    assert stored.read_bytes() == b"hello notes"
    # send_file: the file goes out attached to a mail in the thread, then the reply.
    with_file = next(m for m in sent if any(True for _ in m.iter_attachments()))
    [attached] = list(with_file.iter_attachments())
    assert attached.get_filename() == "report.csv"
    assert attached.get_content().replace("\r\n", "\n") == "a,b\n1,2\n"
    assert with_file["Subject"] == "Re: Plans" and with_file["In-Reply-To"]
    assert any("done" in m.get_body(("plain",)).get_content() for m in sent)  # type: ignore[union-attr]


async def test_an_html_only_mail_reaches_the_model_as_text_without_its_quote(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "ok"})
    app, _, _ = await start(make_app, mail, provider)
    raw = EmailMessage()
    raw["From"], raw["To"], raw["Subject"] = ALICE, BOT, "Html"
    raw["Message-ID"] = make_msgid(domain="example.com")
    raw.set_content("<html><body><p>Line <b>one</b></p><p>Two &amp; three "
                    "<a href='https://example.com/x'>link</a></p>"
                    "<div class='gmail_quote'>On Monday you wrote: old</div></body></html>",
                    subtype="html")
    mail.dovecot.deliver(mail.user, raw)
    await mail.sink.wait_for(1)
    await settle(app)
    assert user_texts(provider) == ["Html\n\nLine one\n\nTwo & three link "
                                    "(https://example.com/x)"]


async def test_stop_as_a_mail_stops_the_thread_s_run(make_app: AppFactory,
                                                     mail: Mail) -> None:
    provider = scripted({"match": "think", "reply": "too late", "delay": 30},
                        {"reply": "unused"})
    app, _, log = await start(make_app, mail, provider)
    first = mail.write("think hard")
    await log.wait_for("activity", limit=20)
    # Alice writes /stop in the thread (answering her own mail).
    mail.write("/stop", answers=_as_reply(first))
    [reply] = await mail.sink.wait_for(1)
    await settle(app)
    assert reply.get_body(("plain",)).get_content().strip() == "Stopped."  # type: ignore[union-attr]
    assert "run.cancelled" in log.types()


def _as_reply(mail: EmailMessage) -> EmailMessage:
    """Headers that make a mail written with ``answers=`` continue ``mail``'s thread."""
    parent = EmailMessage()
    parent["Subject"] = mail["Subject"]
    parent["Message-ID"] = mail["Message-ID"]
    parent["References"] = ""
    return parent


async def test_pairing_goes_by_the_sender_s_address(make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "welcome"}, loop=True)
    app, _, _ = await start(make_app, mail, provider, dm_policy="pairing",
                            dm_allowlist=["email:carol@example.com"])
    mail.write("let me in")
    [code_mail] = await mail.sink.wait_for(1)
    body = code_mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert provider.requests == []
    access = app.services.access
    assert access is not None
    [request] = await access.pending()
    assert request.user == f"email:{ALICE}" and request.code in body
    assert code_mail["In-Reply-To"] is not None
    # Someone on the allowlist by address is answered at once.
    mail.write("hello", sender="carol@example.com")
    [_, answer] = await mail.sink.wait_for(2)
    assert answer["To"] == "carol@example.com"
    assert user_texts(provider) == ["Plans\n\nhello"]


# -- durability --------------------------------------------------------------------


async def test_a_restart_loses_and_repeats_nothing_and_a_new_uidvalidity_is_handled(
        make_app: AppFactory, mail: Mail, caplog: pytest.LogCaptureFixture) -> None:
    provider = scripted({"reply": "one"}, {"reply": "two"}, {"reply": "three"})
    mail.write("old mail, there before Roost's first start", received=time.time() - 3600)
    app, _, _ = await start(make_app, mail, provider)
    mail.write("first")
    await mail.sink.wait_for(1)
    await settle(app)
    await app.close()

    mail.write("second, while Roost is down", subject="Down")
    app, channel, _ = await start(make_app, mail, provider)  # the same data dir: a restart
    await mail.sink.wait_for(2)
    await settle(app)
    assert user_texts(provider) == ["Plans\n\nfirst", "Down\n\nsecond, while Roost is down"]

    # The mailbox is rebuilt (new UIDVALIDITY) under a running Roost, whose session the
    # server then drops mid-IDLE: it reconnects, reads everything since the last mail again,
    # and the inbox drops the two it recorded.
    mail.dovecot.set_uidvalidity(mail.user, 4242)
    channel.watcher.idling.clear()
    assert "kicked" in mail.dovecot.kick(mail.user)
    mail.write("third, after the rebuild", subject="After")
    [*_, third] = await mail.sink.wait_for(3)
    await connected(channel)
    await settle(app)
    assert third["Subject"] == "Re: After"
    assert user_texts(provider)[2:] == ["After\n\nthird, after the rebuild"]
    assert len(mail.sink.accepted) == 3
    assert "UIDVALIDITY changed" in caplog.text and "reconnecting" in caplog.text
    assert await channel.state.get("uidvalidity") == "4242"


async def test_smtp_4xx_is_retried_and_5xx_is_recorded_not_retried(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "retried"}, {"reply": "refused"})
    app, _, _ = await start(make_app, mail, provider)
    mail.sink.refusals = ["451 4.7.1 Greylisted, try again later"]
    mail.write("first")
    [reply] = await mail.sink.wait_for(1)
    assert mail.sink.attempts == 2 and reply["Subject"] == "Re: Plans"

    mail.sink.refusals = ["550 5.1.1 No such user"]
    mail.write("second", subject="Bounce")
    await mail.sink.wait_attempts(3)
    await settle(app)
    inbox = app.services.inbox
    assert inbox is not None
    await inbox.writer.write(lambda db: db.execute("SELECT 1"))  # after the queued ones
    async with inbox.db.execute("SELECT state, attempts, last_error FROM outbox"
                                " ORDER BY id") as cursor:
        rows = await cursor.fetchall()
    assert [r[0] for r in rows] == ["delivered", "pending"]
    assert rows[1][1] == 1 and "550 5.1.1 No such user" in rows[1][2]
    assert mail.sink.attempts == 3 and len(mail.sink.accepted) == 1


async def test_replicas_on_postgresql_read_the_mailbox_on_the_leader_only_and_take_over(
        make_app: AppFactory, mail: Mail, pg_url: str, tmp_path: Path) -> None:
    provider = scripted({"reply": "answered"}, loop=True)
    pair: list[tuple[Roost, EmailChannel]] = []
    for name in ("a", "b"):
        app, _, _ = await make_app(provider, data_dir=tmp_path / name, database_url=pg_url,
                                   lease_seconds=2, dm_policy="open", **mail.table())
        channel = EmailChannel(app.settings, policy=FAST)
        await app.add_channel(channel)
        pair.append((app, channel))
    waits = {asyncio.ensure_future(c.watcher.idling.wait()): i for i, (_, c) in enumerate(pair)}
    done, pending = await asyncio.wait(waits, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    [leading] = [waits[t] for t in done]
    (leader_app, leader), (other_app, follower) = pair[leading], pair[1 - leading]
    assert "standby" in follower.health().detail and follower.health().ready

    mail.write("first")
    await mail.sink.wait_for(1)
    await settle(leader_app)
    await leader_app.close()  # the follower takes over, from the UID the leader noted
    await connected(follower)
    mail.write("second", subject="Later")
    await mail.sink.wait_for(2)
    await settle(other_app)
    assert user_texts(provider) == ["Plans\n\nfirst", "Later\n\nsecond"]
    assert len(mail.sink.accepted) == 2
    del leader


async def test_a_mail_the_core_could_not_record_is_read_again_and_only_then_noted(
        mail: Mail) -> None:
    handed: list[str] = []
    recorded = asyncio.Event()

    async def handler(message: InboundEvent) -> None:
        assert isinstance(message, InboundMessage)
        handed.append(message.text)
        if len(handed) == 1:
            raise RuntimeError("the inbox could not be written")
        recorded.set()

    channel = EmailChannel(Settings(**mail.table()), policy=FAST)
    state = MemoryState()
    await channel.begin(handler, ChannelContext(state=state))
    try:
        await connected(channel)
        uid = mail.dovecot.deliver(mail.user, _plain("hello"))
        async with asyncio.timeout(20):  # a hang guard
            await recorded.wait()
        assert handed == ["Plans\n\nhello", "Plans\n\nhello"]
        assert state.values["last_uid"] == str(uid)
    finally:
        await channel.stop()


def _plain(text: str) -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = ALICE, BOT, "Plans"
    message["Message-ID"] = make_msgid(domain="example.com")
    message.set_content(text)
    return message


async def test_broken_and_hostile_mail_costs_a_log_line_and_the_next_is_answered(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "fine"}, loop=True)
    app, channel, _ = await start(make_app, mail, provider,
                                  table={"max_mail_bytes": 40_000})
    mail.write("x" * 50_000, subject="Too big")
    mail.dovecot.deliver(mail.user, b"\x00\xff garbage without headers\r\n\r\n\xfe")
    mail.dovecot.deliver(mail.user, b"From: =?bogus?Q?x?= <>\r\nSubject: x\r\n\r\nno sender")
    mail.dovecot.deliver(mail.user, (
        b"From: alice@example.com\r\nSubject: =?utf-8?B?!!!notbase64?=\r\n"
        b"Message-ID: <a@b>\r\nReferences: " + b"<r@x> " * 3000 + b"\r\n"
        b"Content-Type: multipart/mixed; boundary=zz\r\n\r\n--zz\r\n"
        b"Content-Type: text/plain; charset=no-such-charset\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\n@@@not base64@@@\r\n--zz\r\n"
        b"Content-Type: application/octet-stream; name=\"../../etc/passwd\"\r\n"
        b"Content-Disposition: attachment; filename=\"../../etc/passwd\"\r\n\r\nroot\r\n"))
    mail.write("a normal mail after all that")
    sent = await mail.sink.wait_for(2)
    await settle(app)
    assert [m["To"] for m in sent] == [ALICE, ALICE]
    # Two threads, two sessions: the runs may finish in either order.
    normal, odd = sorted(user_texts(provider), key=lambda t: not t.startswith("Plans"))
    assert normal == "Plans\n\na normal mail after all that"
    assert odd.startswith("@@@not base64@@@")  # undecodable: shown as it came
    assert "inbox/" in odd and "/passwd" in odd and "../" not in odd
    hostile = next(m for m in sent if m["In-Reply-To"] == "<a@b>")
    assert len(hostile["References"].split()) <= 20  # bounded, however long the chain
    assert channel.health().ready
    workspace = workspace_dir(app.settings.workspaces_dir, "email", ALICE)
    assert all(workspace in p.resolve().parents for p in workspace.rglob("*passwd*"))


def test_a_missing_sdk_or_setting_is_one_line() -> None:
    from bot.app.cli.serve import missing_sdk
    from plugins.mail.config import setup
    from roost.channels import SetupError

    assert missing_sdk("email", ModuleNotFoundError(name="aioimaplib")) == \
        "the email channel needs aioimaplib: pip install 'roost[email]'"
    with pytest.raises(SetupError) as refused:
        setup(Settings(plugins={"plugins.mail": {"imap_url": "imaps://imap.example.com",
                                                 "address": "roost@example.com"}}))
    assert str(refused.value) == "the email channel needs EMAIL_SMTP_URL and EMAIL_PASSWORD"
    with pytest.raises(SetupError, match="is not a imap:// or imaps:// URL"):
        setup(Settings(plugins={"plugins.mail": {
            "imap_url": "http://x", "smtp_url": "smtps://s", "address": "r@example.com",
            "password": "p"}}))


async def test_idle_is_renewed_and_mail_still_arrives(
        make_app: AppFactory, mail: Mail, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="roost.plugins.mail")
    renewed = Logged("IDLE renewed")
    renewed.setLevel(logging.DEBUG)
    logging.getLogger("roost.plugins.mail").addHandler(renewed)
    try:
        provider = scripted({"reply": "still here"})
        app, _, _ = await start(make_app, mail, provider, table={"idle_seconds": 0.2})
        await renewed.wait(2)
        mail.write("after two renewals")
        await mail.sink.wait_for(1)
        await settle(app)
        assert user_texts(provider) == ["Plans\n\nafter two renewals"]
    finally:
        logging.getLogger("roost.plugins.mail").removeHandler(renewed)


async def test_with_a_trusted_server_only_mail_it_authenticated_is_read(
        make_app: AppFactory, mail: Mail) -> None:
    provider = scripted({"reply": "verified"}, loop=True)
    app, _, _ = await start(make_app, mail, provider,
                            table={"trusted_authserv_id": "mx.example.net"})
    mail.write("no proof at all", subject="None")
    mail.write("forged by another server", subject="Forged", headers={
        "Authentication-Results": "evil.example; dmarc=pass header.from=example.com"})
    mail.write("failed", subject="Failed", headers={
        "Authentication-Results": "mx.example.net; dkim=fail header.d=example.com; "
                                  "dmarc=fail header.from=example.com"})
    mail.write("signed by someone else", subject="Other", headers={
        "Authentication-Results": "mx.example.net; dkim=pass header.d=attacker.example"})
    mail.write("DKIM of the sender's domain", subject="Dkim", headers={
        "Authentication-Results": "mx.example.net 1; spf=fail; dkim=pass "
                                  "header.d=example.com header.s=sel"})
    mail.write("DMARC passed", subject="Dmarc", headers={
        "Authentication-Results": "MX.example.net; dmarc=pass (p=reject) "
                                  "header.from=example.com"})
    sent = await mail.sink.wait_for(2)
    await settle(app)
    assert sorted(m["Subject"] for m in sent) == ["Re: Dkim", "Re: Dmarc"]
    assert sorted(t.split("\n")[0] for t in user_texts(provider)) == ["Dkim", "Dmarc"]


async def test_a_mail_outside_any_thread_and_a_hostile_recipient(mail: Mail) -> None:
    channel = EmailChannel(Settings(**mail.table(subject="A note from Roost")), policy=FAST)

    async def handler(message: InboundEvent) -> None:
        raise AssertionError("nothing is read here")

    await channel.begin(handler)
    try:
        sent = await channel.send(OutboundMessage(channel="email", chat_id=ALICE,
                                                  text="Your reminder", kind="notice"))
        [note] = await mail.sink.wait_for(1)
        assert note["Message-ID"] == sent and note["Subject"] == "A note from Roost"
        assert note["In-Reply-To"] is None and note["References"] is None
        for hostile in ("alice@example.com\r\nBcc: eve@example.com", "eve", "<a@b>, c@d"):
            with pytest.raises(ValueError, match="is not an address"):
                await channel.send(OutboundMessage(channel="email", chat_id=hostile, text="x"))
        assert mail.sink.attempts == 1
    finally:
        await channel.stop()


async def test_an_unreachable_imap_server_is_not_ready_with_a_reason(
        mail: Mail, caplog: pytest.LogCaptureFixture) -> None:
    from bot.testing.mail import free_port

    reconnecting = Logged("reconnecting")
    logging.getLogger("roost.plugins.mail").addHandler(reconnecting)
    table = mail.table()
    table["plugins"]["plugins.mail"]["imap_url"] = f"imap://127.0.0.1:{free_port()}"
    channel = EmailChannel(Settings(**table), policy=FAST)

    async def handler(message: InboundEvent) -> None:
        raise AssertionError("nothing is read here")

    try:
        assert channel.health() == ChannelHealth(False, "connecting to IMAP")
        await channel.begin(handler)
        await reconnecting.wait(2)  # it keeps trying, backing off
        health = channel.health()
        assert not health.ready and health.detail.startswith("IMAP failing (IMAP: ")
        assert "secret" not in health.detail
    finally:
        logging.getLogger("roost.plugins.mail").removeHandler(reconnecting)
        await channel.stop()


async def test_a_server_without_idle_is_polled(make_app: AppFactory, dovecot: Dovecot,
                                               sink: SmtpSink,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="roost.plugins.mail")
    mail = Mail(dovecot, sink, dovecot.add_user(idle=False))
    provider = scripted({"reply": "polled"})
    app, _, _ = await start(make_app, mail, provider, table={"poll_seconds": 0.1})
    assert "the server has no IDLE: polling every 0.1s" in caplog.text
    mail.write("anyone there?")
    await mail.sink.wait_for(1)
    await settle(app)
    assert user_texts(provider) == ["Plans\n\nanyone there?"]


async def test_mail_announced_during_a_fetch_is_not_left_waiting(mail: Mail) -> None:
    """Dovecot tells of mail that arrives during a command at that command's end, once;
    aioimaplib drops that news when the command is a UID FETCH."""
    got: asyncio.Queue[str] = asyncio.Queue()

    async def handler(message: InboundEvent) -> None:
        assert isinstance(message, InboundMessage)
        await got.put(message.text)

    sizes = Logged("RFC822.SIZE")  # aioimaplib logs what it receives
    sizes.setLevel(logging.DEBUG)
    wire = logging.getLogger("aioimaplib.aioimaplib")
    wire.addHandler(sizes)
    wire.setLevel(logging.DEBUG)
    channel = EmailChannel(Settings(**mail.table()), policy=FAST)
    await channel.begin(handler)
    try:
        await connected(channel)
        seen = sizes.count
        async with channel.watcher.reading:  # the hand-over waits here
            mail.dovecot.deliver(mail.user, _plain("one"))
            await sizes.wait(seen + 1)  # the watcher learnt of "one" and waits for us
            mail.dovecot.deliver(mail.user, _plain("two"))  # announced after the next FETCH
        async with asyncio.timeout(10):  # a hang guard (IDLE would wait 25 minutes)
            assert [await got.get(), await got.get()] == ["Plans\n\none", "Plans\n\ntwo"]
    finally:
        wire.removeHandler(sizes)
        wire.setLevel(logging.NOTSET)
        await channel.stop()
