"""Roost's outgoing clients verify servers with TLS contexts made once per process.

Real clients (Roost's aiogram session with bot/config/tls.py's context, the OpenAI provider
with plugins/openai_http.py's) talk to an https site on 127.0.0.1 whose certificate a
throwaway CA signed: the handshake is refused and nothing is sent; with a context
trusting that CA the call goes through.
"""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest
from aiogram import Bot
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramNetworkError

from bot.config.settings import Settings
from bot.config.tls import client_tls
from bot.contracts.llm import ChatMessage, LLMRequest
from bot.testing.web import FakeSite, TestCA
from channels.telegram.receiving import TolerantSession
from plugins.openai_http import sdk_tls
from plugins.openai_provider import OpenAIProvider

TOKEN = "123456:TEST-TOKEN"
ME = {"ok": True, "result": {"id": 123456, "is_bot": True, "first_name": "Roost",
                             "username": "roost_bot"}}


def test_the_shared_contexts_are_one_per_process_and_require_a_verified_certificate() -> None:
    for made in (client_tls, sdk_tls):
        context = made()
        assert context is made()
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


async def test_the_openai_provider_refuses_an_untrusted_certificate() -> None:
    ca = TestCA()
    async with FakeSite(tls=ca.server_context("127.0.0.1")) as site:
        provider = OpenAIProvider(Settings(openai_base_url=f"{site.base_url}/v1"),
                                  retry_base_delay=0.001)
        failed = asyncio.Event()
        errors: list[str] = []

        async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
            errors.append(error)
            failed.set()

        request = LLMRequest(model="m", system="be brief", messages=(ChatMessage("user", "hi"),))
        task = asyncio.create_task(provider.complete(request, on_retry=on_retry))
        try:
            await asyncio.wait_for(failed.wait(), 30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await provider.aclose()
    assert "CERTIFICATE_VERIFY_FAILED" in errors[0]
    assert site.requests == []
