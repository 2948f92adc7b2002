"""Roost's outgoing clients verify servers with one shared TLS context (bot/config/tls.py).

A real aiogram client (Roost's Telegram session) talks to an https site on 127.0.0.1
whose certificate a throwaway CA signed: with the shared context (certifi's CAs) the
handshake is refused; with a context trusting that CA the call goes through.
"""

from __future__ import annotations

import json
import ssl

import pytest
from aiogram import Bot
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramNetworkError

from bot.config.tls import client_tls
from bot.testing.web import FakeSite, TestCA
from channels.telegram.receiving import TolerantSession

TOKEN = "123456:TEST-TOKEN"
ME = {"ok": True, "result": {"id": 123456, "is_bot": True, "first_name": "Roost",
                             "username": "roost_bot"}}


def test_the_shared_context_is_one_per_process_and_requires_a_verified_certificate() -> None:
    context = client_tls()
    assert context is client_tls()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


async def test_a_telegram_session_refuses_an_untrusted_certificate_and_trusts_its_tls() -> None:
    ca = TestCA()
    async with FakeSite(tls=ca.server_context("127.0.0.1")) as site:
        site.page(f"/bot{TOKEN}/getMe", json.dumps(ME), content_type="application/json")
        api = TelegramAPIServer.from_base(site.base_url)

        refused = TolerantSession(api=api)
        try:
            with pytest.raises(TelegramNetworkError, match="CERTIFICATE_VERIFY_FAILED"):
                await Bot(TOKEN, session=refused).get_me()
        finally:
            await refused.close()
        assert site.requests == []  # nothing was sent over the unverified connection

        trusting = TolerantSession(api=api, tls=ca.client_context())
        try:
            me = await Bot(TOKEN, session=trusting).get_me()
        finally:
            await trusting.close()
        assert me.username == "roost_bot"
        assert [r.path for r in site.requests] == [f"/bot{TOKEN}/getMe"]
