"""The plugin guide's channel example (docs/channels.md) works as written: it receives a
signed webhook delivery, refuses a forged one, sends a reply through a 429, and answers
503 once shutdown began. test_docs only executes the block; this runs the channel."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import aiohttp
from aiohttp import web

from roost import ChannelContext, InboundMessage, OutboundMessage
from roost.channels import InboundEvent
from tests.test_docs import FENCE, ROOT
from tests.test_whatsapp import Routes


def guide_example() -> dict[str, Any]:
    """The namespace of the guide's one Python block, executed."""
    text = (ROOT / "docs" / "channels.md").read_text(encoding="utf-8")
    (block,) = [m for m in FENCE.finditer(text) if m["lang"] == "python"]
    namespace: dict[str, Any] = {"__name__": "acme_guide"}
    exec(compile(block["body"], "docs/channels.md", "exec"), namespace)
    return namespace


async def test_the_guides_webhook_channel_receives_refuses_sends_and_drains() -> None:
    posted: list[dict[str, Any]] = []

    async def send(request: web.Request) -> web.Response:
        posted.append(await request.json())
        if len(posted) == 1:
            return web.Response(status=429, headers={"Retry-After": "0"})
        return web.json_response({"id": f"m{len(posted)}"})

    api = web.Application()
    api.router.add_post("/send", send)
    runner = web.AppRunner(api)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    routes = Routes()
    await routes.start()
    channel = guide_example()["AcmeChannel"](f"http://127.0.0.1:{port}", "tok", "sec")
    events: list[InboundEvent] = []

    async def handler(event: InboundEvent) -> None:
        events.append(event)

    try:
        await channel.begin(handler, ChannelContext(http_routes=routes))
        body = json.dumps({"from": "u7", "text": "hi", "id": "e1"}).encode()
        signature = hmac.new(b"sec", body, hashlib.sha256).hexdigest()
        url = f"http://127.0.0.1:{routes.port}/acme/webhook"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, data=body, headers={"X-Signature": "0" * 64}) as r:
                assert r.status == 401 and events == []
            async with http.post(url, data=body, headers={"X-Signature": signature}) as r:
                assert r.status == 200
            (event,) = events
            assert isinstance(event, InboundMessage)
            assert (event.chat_id, event.text, event.event_id) == ("u7", "hi", "e1")
            sent = await channel.send(OutboundMessage(channel="acme", chat_id="u7", text="yo"))
            assert sent == "m2" and [p["text"] for p in posted] == ["yo", "yo"]
            await channel.stop_intake()
            async with http.post(url, data=body, headers={"X-Signature": signature}) as r:
                assert r.status == 503
        await channel.stop()
    finally:
        assert routes.runner is not None
        await routes.runner.cleanup()
        await runner.cleanup()
