"""The fake Bot API server: one aiohttp app, every call recorded, faults applied."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from bot.testing.telegram.faults import Faults
from bot.testing.telegram.files import Files
from bot.testing.telegram.interactions import Interactions
from bot.testing.telegram.messages import Messages
from bot.testing.telegram.state import State
from bot.testing.telegram.updates import Updates
from bot.testing.telegram.wire import (
    HTML_PAGES,
    MB,
    ApiError,
    Call,
    Failure,
    decode_form,
    decode_value,
    drop_connection,
    dump_json,
    require,
    scope_key,
    scope_of,
)


class FakeTelegram(State):
    """An aiohttp server on 127.0.0.1 speaking the Bot API for one bot.

    ``token`` must look like ``<digits>:<text>``; its number is the bot's user
    id. Calls with another token get a 401, as from the real server. Its parts:
    :class:`Faults` (failures injected), :class:`Messages` (what the bot posts),
    :class:`Updates` (what it receives) and :class:`Files`; their methods for tests
    are the fake's own.
    """

    def __init__(self, *, token: str = "123456:TEST-TOKEN", username: str = "test_bot",
                 first_name: str = "TestBot") -> None:
        super().__init__(token=token, username=username, first_name=first_name)
        self.injector = Faults(self)
        self.outbox = Messages(self)
        self.queue = Updates(self)
        self.store = Files(self, self.queue, self.outbox)
        self.interactions = Interactions(self, self.queue)
        # What tests call, from the parts.
        self.fail = self.injector.fail
        self.inject_faults = self.injector.inject_faults
        self.push_update = self.queue.push_update
        self.push_raw = self.queue.push_raw
        self.push_json = self.queue.push_json
        self.redeliver = self.queue.redeliver
        self.private_message = self.queue.private_message
        self.group_message = self.queue.group_message
        self.mention = self.queue.mention
        self.reply_to_bot = self.queue.reply_to_bot
        self.topic_message = self.queue.topic_message
        self.command = self.queue.command
        self.add_file = self.store.add_file
        self.photo_sizes = self.store.photo_sizes
        self.media_message = self.store.media_message
        self.photo = self.store.photo
        self.document = self.store.document
        self.voice = self.store.voice
        self.fail_download = self.store.fail_download
        self.press = self.interactions.press
        self.edit_by_user = self.interactions.edit_by_user
        self.user_reaction = self.interactions.user_reaction

    @property
    def faults(self) -> dict[str, int]:
        """How many calls got each injected fault (``"window"``: calls inside a 429 window)."""
        return self.injector.faults

    @property
    def pending_updates(self) -> int:
        """Updates queued and not yet confirmed by an offset (or webhook answer)."""
        return self.queue.pending_updates

    @property
    def webhook_attempts(self) -> list[tuple[int, int]]:
        """``(update_id, HTTP status)`` of each webhook delivery (0: no connection)."""
        return self.queue.webhook_attempts

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Uploads are checked against upload_limit by the method (413 as JSON, as
        # the Bot API answers); aiohttp's own cap is only a backstop above it.
        app = web.Application(client_max_size=max(8 * MB, 2 * self.upload_limit))
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self.store.serve_file)
        # Cancel a handler when its client hangs up, so an abandoned long poll
        # ends at once instead of holding the shutdown for its whole timeout.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     handler_cancellation=True)
        self.closing = False
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop serving (waking any long poll) and release the port."""
        self.closing = True
        await self.queue.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # -- serving -----------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        method = request.match_info["method"]
        params = decode_form(await request.post()) if request.can_read_body else {}
        params.update({k: decode_value(k, v) for k, v in request.query.items()})
        call = Call(method, params, started, status=0)
        if self.on_call is not None:
            self.on_call(call)
        await self.record_call(call, arrived=True)
        scope = scope_of(method, params)
        failure: Failure | None = None
        try:
            if request.match_info["token"] != self.token:
                raise ApiError(401, "Unauthorized")
            self.injector.check_window(call, scope)
            failure = self.injector.take_failure(method.lower())
            if failure is not None:
                call.fault = failure.kind
                if failure.kind == "status":
                    raise ApiError(failure.status, failure.description, failure.retry_after,
                                    failure.parameters)
                if failure.kind == "html":
                    call.status, call.error = failure.status, "HTML error page"
                    await self.record_call(call)
                    return web.Response(status=failure.status, content_type="text/html",
                                        text=HTML_PAGES.get(failure.status,
                                                             HTML_PAGES[502]))
                if failure.kind == "reset_before":
                    await self.record_call(call)
                    drop_connection(request)
                if failure.kind == "stall":
                    await asyncio.sleep(failure.seconds)
            call.result = await self._dispatch(method.lower(), params)
        except ApiError as exc:
            call.status, call.error = exc.status, exc.description
            body: dict[str, Any] = {"ok": False, "error_code": exc.status,
                                    "description": exc.description}
            parameters = dict(exc.parameters)
            if exc.retry_after is not None:
                parameters["retry_after"] = exc.retry_after
                if call.fault != "window":
                    self.injector.open_window(scope, exc.retry_after)
            if parameters:
                body["parameters"] = parameters
            await self.record_call(call)
            return web.json_response(body, status=exc.status)
        call.status = 200
        await self.record_call(call)
        if failure is not None and failure.kind == "reset_after":
            drop_connection(request)
        if failure is not None and failure.kind == "hold_after":
            await asyncio.sleep(failure.seconds)
        return web.Response(text='{"ok": true, "result": ' + dump_json(call.result) + "}",
                            content_type="application/json")

    async def _dispatch(self, method: str, p: dict[str, Any]) -> Any:
        if method == "getme":
            return self.bot_user
        if method == "getupdates":
            return await self.queue.get_updates(p)
        if method == "sendmessage":
            return self.outbox.send_message(p)
        if method == "editmessagetext":
            return self.outbox.edit_message(p)
        if method == "editmessagecaption":
            return self.outbox.edit_caption(p)
        if method == "deletemessage":
            return self.outbox.delete_message(p)
        if method in ("sendphoto", "senddocument"):
            return self.store.send_media(method, p)
        if method == "getfile":
            return self.store.get_file(p)
        if method == "answercallbackquery":
            return self.interactions.answer_callback_query(p)
        if method == "setmessagereaction":
            return self.interactions.set_message_reaction(p)
        if method == "sendchataction":
            require(p, "chat_id", "action")
            return True
        if method == "setmycommands":
            return self.outbox.set_commands(p)
        if method == "getmycommands":
            return self.commands.get(scope_key(p.get("scope")), [])
        if method == "deletemycommands":
            self.commands.pop(scope_key(p.get("scope")), None)
            return True
        if method == "setwebhook":
            return self.queue.set_webhook(p)
        if method == "deletewebhook":
            if p.get("drop_pending_updates"):
                self.queue.drop_pending()
            self.webhook = None
            return True
        if method == "getwebhookinfo":
            return {"url": self.webhook.url if self.webhook else "",
                    "has_custom_certificate": False,
                    "pending_update_count": self.queue.queued}
        if method in ("close", "logout"):
            return True
        raise ApiError(404, "Not Found")
