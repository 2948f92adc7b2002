"""The SMTP side: one mail sent, its failures sorted into "retry" and "refused for good".

A 4xx reply (greylisting, a full queue, "try again later"), a dropped connection
or a timeout is :class:`~roost.channels.Transient`: retried with back-off, then
handed back to the core, which keeps the reply in its outbox and tries again
later. A 5xx reply (an unknown recipient, a refused sender, bad credentials) is
permanent: :class:`SmtpRefused`, not retried here (a refused recipient is
:class:`RecipientRefused`, which the core gives up at once). Sends are paced at
``sends_per_minute`` for all replicas together.
"""

from __future__ import annotations

import logging
import ssl
from email.message import EmailMessage

import aiosmtplib

from plugins.mail.config import MailSetup
from roost import marked_send
from roost.channels import (
    DeliveryPolicy,
    Limits,
    Rate,
    RateLimiter,
    Transient,
    Undeliverable,
    deliver,
)

log = logging.getLogger("roost.plugins.mail")


class SmtpRefused(Exception):
    """The SMTP server refused the mail for good (a 5xx reply)."""


class RecipientRefused(SmtpRefused, Undeliverable):
    """The SMTP server refused the recipient for good (5xx to ``RCPT TO``): the core
    gives the reply up at once instead of sending it again later."""


def classify(exc: Exception) -> Exception:
    """What ``exc`` from aiosmtplib means: :class:`Transient` or :class:`SmtpRefused`."""
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        codes = [r.code for r in exc.recipients]
        text = "; ".join(f"{r.code} {r.message}" for r in exc.recipients)[:300]
        if codes and all(400 <= c < 500 for c in codes):
            return Transient(f"SMTP {text}")
        return RecipientRefused(f"SMTP refused the recipient: {text}")
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        text = f"SMTP {exc.code} {exc.message}"[:300]
        if 400 <= exc.code < 500 or exc.code < 0:
            return Transient(text)
        return SmtpRefused(text)
    return Transient(f"SMTP: {exc or type(exc).__name__}")


def refused(exc: BaseException) -> bool:
    """Whether a failed send certainly delivered nothing (the server answered no)."""
    return isinstance(exc, SmtpRefused) or (
        isinstance(exc, Transient) and str(exc).startswith("SMTP 4"))


class SmtpSender:
    """Sends one mail at a time through the configured SMTP server."""

    def __init__(self, setup: MailSetup, *, policy: DeliveryPolicy | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self.setup = setup
        self.policy = policy or DeliveryPolicy()
        self.limiter = limiter or RateLimiter(
            Limits(overall=Rate(setup.config.sends_per_minute, 60.0)))

    async def send(self, mail: EmailMessage, recipient: str, note: str) -> None:
        """Send ``mail`` to ``recipient``; raises :class:`SmtpRefused` or
        :class:`Transient` once retries are spent. ``note`` (the ``Message-ID``) is kept
        with the reply before the server is first asked (:func:`roost.marked_send`)."""
        async def once() -> None:
            async with self.limiter.slot(counted=True):
                await marked_send(lambda: self._submit(mail, recipient), refused=refused,
                                  note=lambda: note)

        await deliver(once, what=f"email to {recipient}", policy=self.policy)

    async def _submit(self, mail: EmailMessage, recipient: str) -> None:
        endpoint, config = self.setup.smtp, self.setup.config
        login = self.setup.smtp_login
        try:
            await aiosmtplib.send(
                mail, sender=self.setup.address, recipients=[recipient],
                hostname=endpoint.host, port=endpoint.port,
                username=login[0] if login else None, password=login[1] if login else None,
                use_tls=endpoint.tls, start_tls=None if not endpoint.tls else False,
                tls_context=ssl.create_default_context(), timeout=config.timeout)
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise classify(exc) from exc
