"""The fake Slack server: its parts, built once, and their routes, started and stopped."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

from bot.testing.parts import StateField
from bot.testing.slack.api import Api
from bot.testing.slack.events import Events
from bot.testing.slack.faults import Faults
from bot.testing.slack.files import Files
from bot.testing.slack.interactive import Interactive
from bot.testing.slack.state import State
from bot.testing.slack.wire import (
    APP_TOKEN,
    BOT_TOKEN,
    SIGNING_SECRET,
    Call,
    Posted,
    ResponsePost,
    SharedFile,
    SlackFile,
)


class FakeSlack:
    """An aiohttp server on 127.0.0.1 that behaves like Slack to one app.

    ``events_url`` is where :meth:`post_event` and friends send requests (the
    app's ``/slack/events`` endpoint); set it once the app listens.

    It holds its parts: the :class:`State` they share, the scripted
    :class:`Faults`, the :class:`Events` sent to the app, the :class:`Files`
    and the Web :class:`Api`; its methods are theirs.
    """

    bot_token = StateField[str]()
    app_token = StateField[str]()
    signing_secret = StateField[str]()
    team_id = StateField[str]()
    bot_user_id = StateField[str]()
    bot_id = StateField[str]()
    channel = StateField[str]()
    dm_channel = StateField[str]()
    events_url = StateField[str | None]()
    calls = StateField[list[Call]]()
    messages = StateField[dict[str, Posted]]()
    responses = StateField[list[ResponsePost]]()
    acks = StateField[dict[str, dict[str, Any]]]()
    socket_connections = StateField[int]()
    scopes = StateField[set[str]]()
    denial = StateField[str]()
    files = StateField[dict[str, SlackFile]]()
    shared = StateField[list[SharedFile]]()
    file_requests = StateField[list[tuple[str, dict[str, str], int]]]()
    injected = StateField[list[tuple[str, str]]]()
    sockets = StateField[list[web.WebSocketResponse]]()
    reactions = StateField[dict[tuple[str, str], list[str]]]()

    def __init__(self, *, bot_token: str = BOT_TOKEN, app_token: str = APP_TOKEN,
                 signing_secret: str = SIGNING_SECRET) -> None:
        self.state = State(bot_token=bot_token, app_token=app_token,
                           signing_secret=signing_secret)
        faults = Faults(self.state)
        self._events = Events(self.state, faults)
        self._files = Files(self.state, faults)
        self._interactive = Interactive(self.state)
        self._api = Api(self.state, faults, self._files, self._interactive)
        self._runner: web.AppRunner | None = None
        self.settings = self.state.settings
        self.next_ts = self.state.next_ts
        self.wait_until = self.state.wait_until
        self.fail = faults.fail
        self.inject = faults.inject
        self.chaos = faults.chaos
        self.calls_of = faults.calls_of
        self.sent = faults.sent
        self.quiet = faults.quiet
        self.visible = faults.visible
        self.wait_for = faults.wait_for
        self.wait_for_responses = faults.wait_for_responses
        self.wait_for_ack = faults.wait_for_ack
        self.mention = self._events.mention
        self.message = self._events.message
        self.direct_message = self._events.direct_message
        self.app_mention = self._events.app_mention
        self.bot_message = self._events.bot_message
        self.envelope = self._events.envelope
        self.next_event_id = self._events.next_event_id
        self.post_event = self._events.post_event
        self.deliver_event = self._events.deliver_event
        self.url_verification = self._events.url_verification
        self.post_body = self._events.post_body
        self.slash_command = self._events.slash_command
        self.socket_event = self._events.socket_event
        self.deliver_socket_event = self._events.deliver_socket_event
        self.socket_slash_command = self._events.socket_slash_command
        self.socket_send = self._events.socket_send
        self.wait_for_socket = self._events.wait_for_socket
        self.file = self._files.file
        self.message_changed = self._interactive.message_changed
        self.message_deleted = self._interactive.message_deleted
        self.reaction = self._interactive.reaction
        self.block_actions = self._interactive.block_actions
        self.post_action = self._events.post_action
        self.socket_action = self._events.socket_action

    @property
    def url(self) -> str:
        """``http://127.0.0.1:{port}`` (no trailing slash)."""
        return self.state.url

    @property
    def base_url(self) -> str:
        """The Web API base for ``AsyncWebClient(base_url=...)``; the trailing slash matters."""
        return self.state.base_url

    async def start(self) -> None:
        """Bind to a free port on 127.0.0.1 and start serving."""
        # Uploads may be large: the upload URL takes what Slack's would.
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._api.handle)
        app.router.add_get("/api/{method}", self._api.handle)  # conversations.history, .replies
        app.router.add_get("/socket", self._events.serve_socket)
        app.router.add_post("/response/{id}", self._api.response_url)
        app.router.add_get("/files-pri/{tail:.*}", self._files.serve_private)
        app.router.add_post("/upload/v1/{key}", self._files.receive_upload)
        app.router.add_get("/", self._files.login_page)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.state.port = self._runner.addresses[0][1]
        self.state.session = aiohttp.ClientSession()

    async def stop(self) -> None:
        """Close sockets and the client session, release the port."""
        for ws in list(self.state.sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
        if self.state.session is not None:
            await self.state.session.close()
            self.state.session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
