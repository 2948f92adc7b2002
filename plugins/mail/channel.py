"""The email channel: a mailbox read over IMAP, replies sent over SMTP.

Composed of a :class:`~plugins.mail.imap.MailWatcher` (the update source), the
translation in :mod:`plugins.mail.reading` and :mod:`plugins.mail.writing`, and an
:class:`~plugins.mail.smtp.SmtpSender`. The sender's address is the user
(``email:alice@example.com`` in pairing and ``dm_allowlist``); every mail is a
direct message, and each thread is a conversation (a session) of its own. Only
the leading replica reads the mailbox; every replica sends.

What a reply needs to land in its thread (the subject, the ids it answers) is kept
in the channel's durable notes under the thread's key before the mail is handed
over, so a reply sent after a restart, or by another replica, threads the same.
Mail has no buttons, edits, reactions or streaming: a reply is one mail.
"""

from __future__ import annotations

import json
import logging
import secrets

from plugins.mail import reading
from plugins.mail.config import CHANNEL_NAME, MailSetup, setup
from plugins.mail.imap import MailWatcher, check_setup
from plugins.mail.reading import Thread
from plugins.mail.smtp import SmtpSender
from plugins.mail.writing import compose, reply_subject
from roost import (
    Attachment,
    Channel,
    ChannelHealth,
    InboundHandler,
    InboundMessage,
    MediaError,
    MediaTooLarge,
    OutboundFile,
    OutboundMessage,
    Settings,
)
from roost.channels import (
    Capabilities,
    DeliveryPolicy,
    InFlight,
    Limits,
    Rate,
    RateLimiter,
    opened_files,
    parse_command,
)

log = logging.getLogger("roost.plugins.mail")

SALT = "message_id_salt"
"""Note: random, once per deployment; makes the replies' ``Message-ID`` unique to it."""


def thread_note(key: str) -> str:
    """The note key of a thread's reply headers."""
    return f"thread:{key}"


class EmailChannel(Channel):
    """A mailbox as a chat: see the module docstring."""

    name = CHANNEL_NAME
    marks_sending = True
    capabilities = Capabilities()

    def __init__(self, settings: Settings, *, policy: DeliveryPolicy | None = None,
                 mail_setup: MailSetup | None = None) -> None:
        self.mail = mail_setup or setup(settings)
        check_setup(self.mail)
        self.watcher = MailWatcher(self.mail, self.translate)
        # The budget is the mailbox's, shared by the replicas sending from it.
        limiter = RateLimiter(Limits(overall=Rate(self.mail.config.sends_per_minute, 60.0)),
                              shared_by=self)
        self.sender = SmtpSender(self.mail, policy=policy, limiter=limiter)
        self.inflight = InFlight()
        self._salt: str | None = None

    def health(self) -> ChannelHealth:
        """Not ready until the first IMAP connection, and while reconnecting."""
        return self.watcher.health

    async def start(self, handler: InboundHandler) -> None:
        """Start watching the mailbox (connection failures are retried in the background)."""
        self._salt = await self.state.get(SALT)
        if self._salt is None:
            self._salt = secrets.token_hex(6)
            await self.state.put(SALT, self._salt)
        if not self.mail.config.trusted_authserv_id:
            log.warning("email: senders' addresses are taken as they come (anyone can "
                        "write any From): set trusted_authserv_id to check them")
        self.watcher.start(handler, self.state, self.leadership)

    async def stop_intake(self) -> None:
        """Stop reading mail; a mail being handed over finishes first."""
        await self.watcher.stop()

    async def stop(self) -> None:
        """Stop reading, then let mails being sent finish."""
        await self.watcher.stop()
        await self.inflight.wait_idle(10.0)

    # -- inbound ---------------------------------------------------------------------

    async def translate(self, raw: bytes, uidvalidity: int, uid: int) -> InboundMessage | None:
        """The core's message for mail ``uid`` (``None``: not for Roost, logged why)."""
        message = reading.parse(raw)
        who = reading.sender(message)
        if who is None:
            log.info("email: mail %d has no usable sender: skipped", uid)
            return None
        address, name = who
        if address == self.mail.address:
            return None  # our own mail (a copy, a bounce to ourselves)
        why = reading.automated(message)
        trusted = self.mail.config.trusted_authserv_id
        if why is None and trusted:
            why = reading.authenticated(message, trusted, address)
        if why is not None:
            log.info("email: mail %d from %s skipped: %s", uid, address, why)
            return None
        thread = reading.thread_of(message, f"<{uidvalidity}.{uid}@roost.invalid>")
        key = reading.thread_key(address, thread.root)
        text = reading.body_text(message)
        if thread.starts and thread.subject and parse_command(text) is None:
            text = f"{thread.subject}\n\n{text}".strip()
        await self.state.put(thread_note(key), _note(thread))
        return InboundMessage(
            channel=CHANNEL_NAME, chat_id=address, chat_type="direct", sender_id=address,
            sender_name=name, text=text, message_id=thread.message_id, thread_id=key,
            conversation=key, attachments=reading.attachments(message, f"{uidvalidity}/{uid}"),
            event_id=reading.thread_key(address, thread.message_id), raw=None)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of an attached file, fetched again from the mailbox by UID."""
        try:
            validity, uid, index = (int(x) for x in attachment.url.split("/"))
        except ValueError:
            raise MediaError("not an attachment of this mailbox") from None
        box = self.watcher.mailbox(self.mail)
        try:
            if await box.open() != validity:
                raise MediaError("the mailbox was rebuilt since: the file is gone")
            raw = await box.fetch(uid)
        except MediaError:
            raise
        except Exception as exc:
            raise MediaError(f"the mail could not be read ({str(exc)[:100]})") from exc
        finally:
            await box.close()
        part = None if raw is None else reading.part_at(reading.parse(raw), index)
        if part is None:
            raise MediaError("the mail is gone")
        data = reading.payload_of(part)
        if len(data) > limit:
            raise MediaTooLarge(len(data), limit)
        return data

    # -- outbound --------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Send the reply as one mail in its thread; its ``Message-ID``."""
        with self.inflight.busy():
            return await self._send(message)

    async def _send(self, message: OutboundMessage) -> str:
        to = message.chat_id
        if not reading.is_address(to):
            raise ValueError(f"email: {to!r} is not an address to reply to")
        note = None if not message.thread_id else \
            await self.state.get(thread_note(message.thread_id))
        thread = json.loads(note) if note else {}
        cap = self.mail.config.max_attachment_bytes

        def check(file: OutboundFile, size: int) -> None:
            if size > cap:
                raise MediaTooLarge(size, cap, f"{file.name} is over {cap // 1_048_576} MB")

        with opened_files(message.files, check) as handles:
            files = [(file.name, file.mime_type or "application/octet-stream", handle.read_all())
                     for file, handle in zip(message.files, handles, strict=True)]
        text = message.text
        for file in message.files:
            if file.caption:
                text += f"\n\n{file.name}: {file.caption}"
        domain = self.mail.address.rpartition("@")[2]
        message_id = f"<{message.delivery_id or secrets.token_hex(8)}.{self._salt}@{domain}>"
        mail = compose(
            sender=self.mail.address, sender_name=self.mail.config.display_name, to=to,
            subject=reply_subject(str(thread.get("subject", "")), self.mail.config.subject),
            text=text, message_id=message_id, in_reply_to=thread.get("last"),
            references=[str(r) for r in thread.get("references", [])], files=files)
        await self.sender.send(mail, to, message_id)
        return message_id


def _note(thread: Thread) -> str:
    return json.dumps({"subject": thread.subject, "last": thread.message_id,
                       "references": thread.reply_references()})
