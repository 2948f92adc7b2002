"""The Slack channel: slack-bolt's ``AsyncApp`` over the Events API (HTTP) or Socket Mode.

**Modes.** ``SLACK_BOT_TOKEN`` with ``SLACK_APP_TOKEN`` connects over Socket
Mode (``apps.connections.open``, then a websocket; no public URL needed).
``SLACK_BOT_TOKEN`` with ``SLACK_SIGNING_SECRET`` serves the Events API on
``0.0.0.0:{slack_port}`` at ``/slack/events`` (requests with a bad signature
get 401). When both are set, Socket Mode wins: a Slack app with Socket Mode on
receives nothing over HTTP. ``SLACK_API_BASE`` redirects the Web API.

**Translation.** ``chat_id`` is the Slack channel id; DMs (``channel_type
im``) are ``direct``, everything else (public and private channels, group
DMs) ``group``. ``message_id`` is the message ``ts``. A reply inside a thread
carries ``thread_id = thread_ts``, so a thread is a session of its own; a
top-level message has no ``thread_id`` and belongs to the channel's session.

**Where replies go.** ``thread_ts = OutboundMessage.thread_id or
OutboundMessage.reply_to``. The core sets ``reply_to`` to the triggering
message in groups, so a top-level mention in a channel is answered in a new
thread under it (the mention itself stays in the channel's session; follow-ups
in that thread form the thread's session), a reply in a thread is answered in
that thread, and a top-level DM is answered at the top level.

**Addressed.** ``mentioned`` is set for ``app_mention`` events, ``<@BOT>`` in
the text (which is stripped), replies in a thread the bot has posted in
(remembered in memory for the newest 10,000 threads), DMs and slash commands. Policies
are applied by the core. The bot's own messages, other bots' (``bot_id``,
``bot_message``) and edits, deletions and joins are ignored.

**Hostile input.** A request whose signature headers are not Slack's (a
timestamp that is not whole seconds, a signature that is not ``v0=`` and
hex) gets 401 before anything parses it. A malformed payload (not JSON, not
an object, no event, wrong types inside) and a request Roost does not handle
(block actions, views, shortcuts, ``app_rate_limited``) are answered 200, or
acked over Socket Mode, and dropped with one warning line: a redelivery would
fail the same way, and bolt would answer a 404 or, for some shapes, fail in
its middleware with a 500, both of which Slack retries. A Socket Mode frame
that is not JSON, or an envelope with fields of the wrong types, costs one
warning too (acked if it names its envelope id) and never a traceback.

**Acknowledged means recorded.** Bolt runs with ``process_before_response``:
an Events API request is answered, and a Socket Mode envelope acked, only
after the core's handler returned (the message is in its inbox). If the
handler raised, the request gets a 500 and the envelope no ack, so Slack
delivers it again. A message's ``event_id`` is ``{channel}:{ts}``: the
``message`` and ``app_mention`` events of one post, and Slack's retries of
either, carry the same key, on which the core dedupes (the adapter also skips
a key the core already took in this process). A slash command is acked once
the core recorded it too (``event_id`` ``cmd:{trigger_id}``); if it could not
be, Slack shows the user that the command failed. After
:meth:`SlackChannel.stop_intake` (shutdown begins) the Events endpoint answers
503 and Socket Mode envelopes are left unacked, so Slack delivers them again
after the restart; replies keep going out until :meth:`SlackChannel.stop`.

**Replies** are converted to mrkdwn (:mod:`channels.slack_format`) and split
at 4,000 characters without breaking code blocks. **Streaming** (on unless
``stream_channels.slack = false``) posts a draft with ``chat.postMessage`` and
edits it with ``chat.update`` at most once a second; the final reply replaces
the draft (further chunks follow in the same thread) and a silent reply
deletes it. **Typing:** Slack has no typing indicator a bot can show in
channels (``assistant.threads.setStatus`` is only for AI-assistant threads),
so :meth:`SlackChannel.typing` does nothing; the streamed draft is the sign
of life.

**Slash commands.** ``/roost <command> [args]`` is acked at once and reaches
the core as ``/<command> args`` from that user in that channel; other slash
commands pointed at the app (``/stop``) pass through as typed. Their replies
go to the command's ``response_url`` as ephemeral messages (only the invoker
sees them, as they saw the command), so a command works even in channels the
bot was not invited to. Slash commands are declared in the app manifest, not
at runtime; :meth:`SlackChannel.register_commands` logs the snippet (debug).
Commands typed as plain message text (``/status``) also work; the core
parses them.

**Errors.** Web API calls go through :func:`channels.delivery.deliver`, with
every failure mapped in one place (:func:`delivery_error`): a 429 becomes
:class:`RateLimited` with the ``Retry-After`` header; 5xx with any body,
connection resets, timeouts and bodies slack_sdk cannot decode
:class:`Transient`; Slack's API errors (``channel_not_found``...) are final.
The SDK's own retry handlers are off, so there is one retry layer.

**Exactly once.** ``chat.postMessage`` has no idempotency key, so each post
carries a nonce in its message metadata; after a failure that may have taken
effect, the conversation is searched for it before posting again, and a post
that timed out but landed later is deleted. A reply the core sends with a
``delivery_id`` (its outbox key, the same across restarts) carries that as the
nonce (``roost-7``, ``roost-7#1`` for the second piece...), and the
conversation's last day is read once before posting it: pieces an earlier
attempt posted, in this process or one that stopped before the core recorded
the delivery, are not posted again. (That read costs one history call per
reply; if it fails, rate-limited or unauthorized, the reply is posted.)
:meth:`SlackChannel.send` returns the ``ts`` of the reply's last message;
with ``replace`` it edits the named draft, or, if that edit fails for good,
posts anew and deletes the draft, so no draft stays frozen.
:meth:`SlackChannel.withdraw` deletes a message (one already gone is fine).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Hashable,
    Iterator,
    Mapping,
    Sequence,
)
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from slack_sdk.webhook.async_client import AsyncWebhookClient

from bot.contracts.channel import Channel, InboundHandler, ReplyStream
from bot.contracts.commands import parse_command
from bot.contracts.messages import Attachment, ChatType, InboundMessage, OutboundMessage, clean_text
from channels.delivery import DeliveryPolicy, EditStream, RateLimited, Transient, deliver
from channels.logline import short as _short
from channels.slack_format import from_slack, split_for_slack, to_mrkdwn, unescape

if TYPE_CHECKING:
    from bot.config.settings import Settings
    from bot.contracts.commands import Command

log = logging.getLogger("roost.channels.slack")
_sdk_log = logging.getLogger("roost.channels.slack.sdk")

MESSAGE_LIMIT = 4_000
"""Slack's recommended maximum for a message's text; longer replies are split."""
DEFAULT_API_BASE = "https://slack.com/api/"
EVENTS_PATH = "/slack/events"
SLASH_COMMAND = "/roost"
RESPONSE_URL_USES = 5
"""Slack accepts at most this many posts to one ``response_url``."""
REMEMBERED = 10_000
"""Event ids, message ids and bot threads remembered (each, newest first)."""
CONNECT_TIMEOUT = 30.0
STOP_GRACE = 10.0
"""How long :meth:`SlackChannel.stop` waits for Web API calls in flight."""
METADATA_EVENT = "roost_reply"
"""The message metadata type under which each post carries its nonce."""
LOOKUP_MARGIN = 120.0
"""How far back (seconds) a failed post is looked for, to absorb clock skew."""
LOOKUP_LIMIT = 200
"""Messages read back when looking for a failed post (the newest ones)."""
SWEEP_MARGIN = 2.0
"""Seconds after the call timeout by which a timed-out post has landed, if ever."""
REDELIVERY_LOOKBACK = 24 * 3600.0
"""How far back (seconds) a reply with a ``delivery_id`` is looked for before it is
posted: an earlier attempt, maybe in a process since restarted, may have posted it."""
TRANSIENT_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable",
                              "request_timeout"})
"""Error codes Slack documents as its own trouble, sometimes sent with HTTP 200."""

# Message subtypes that are a person saying something; the rest (edits,
# deletions, joins, topic changes, bot posts...) are not addressed to the bot.
_SPOKEN_SUBTYPES = frozenset({"file_share", "thread_broadcast", "me_message"})
# A streaming edit is cosmetic: one try, and the next edit or the final reply catches up.
_EDIT_POLICY = DeliveryPolicy(attempts=1)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class _Malformed(ValueError):
    """A Slack payload missing what the adapter needs."""


class _NotRecorded(Exception):
    """The core's handler raised: the delivery must not be acknowledged (Slack retries)."""


# Slack's signature headers as Slack sends them: the timestamp is whole Unix
# seconds, the signature ``v0=`` and a hex SHA-256. Anything else is refused
# before slack_sdk's verifier, which calls int() on the timestamp (a 500 for
# "1.5") and compares the signature with hmac.compare_digest (a TypeError for
# non-ASCII text).
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
# What Slack's ids look like. The core stores ids as given (only text and
# names are cleaned of lone surrogates), so anything else is malformed.
_SLACK_ID = re.compile(r"[A-Z0-9]{1,64}")
_SLACK_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,9}")
_TRIGGER_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")
_RESPONSE_URL = re.compile(r"https?://[\x21-\x7e]{1,2000}")


@dataclass(frozen=True, slots=True)
class _SlashReply:
    channel_id: str
    response_url: str


# Set while a slash command is handed to the core. The core runs the command
# in a task created inside that call, which inherits this context, so the
# command's reply (sent from that task) finds its response_url here without
# the core knowing about Slack.
_SLASH: ContextVar[_SlashReply | None] = ContextVar("roost_slack_slash", default=None)


class _Recent(Generic[K]):
    """A set that keeps only the newest ``size`` keys."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[K, None] = OrderedDict()

    def add(self, key: K) -> bool:
        """Remember ``key``; ``False`` if it was already known."""
        if key in self._keys:
            self._keys.move_to_end(key)
            return False
        self._keys[key] = None
        if len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class _SocketClient(SocketModeClient):
    """slack_sdk's Socket Mode client, reading each frame defensively.

    The SDK parses a frame with ``json.loads`` and builds the request with
    ``SocketModeRequest.from_dict`` unguarded: a frame that is not JSON or
    is nested too deeply, or an envelope whose fields have the wrong types,
    is logged with a traceback and never acked, so Slack keeps sending it.
    Here such a frame costs one warning line, and an envelope that names
    its id is acked (a redelivery would be just as broken).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._listening: set[asyncio.Future[None]] = set()

    async def process_message(self) -> None:
        raw = await self.message_queue.get()
        if raw is None:
            return
        message = _socket_frame(raw)
        if message is None:
            return
        if "envelope_id" in message:
            problem = _envelope_problem(message)
            if problem:
                log.warning("Slack: Socket Mode envelope skipped: %s", problem)
                envelope_id = message["envelope_id"]
                if isinstance(envelope_id, str) and envelope_id:
                    await _ack(self, envelope_id)
                return
        # As the SDK does: listeners run in a task of their own, so a core that
        # takes its time recording one envelope does not hold up the others.
        task = asyncio.ensure_future(self.run_message_listeners(message, raw))
        self._listening.add(task)
        task.add_done_callback(self._listening.discard)


class _KeyedLocks:
    """One lock per key, alive only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class SlackChannel(Channel):
    """Slack through slack-bolt; see the module docstring for the mapping."""

    name = "slack"

    def __init__(self, settings: Settings, *, host: str = "0.0.0.0",
                 policy: DeliveryPolicy | None = None, edit_interval: float = 1.0,
                 timeout: int = 30) -> None:
        """``timeout`` bounds each Web API call (seconds); an answer that takes
        longer counts as a transient failure."""
        self.settings = settings
        self.timeout = timeout
        self.host = host
        self.policy = policy or DeliveryPolicy()
        self.edit_interval = edit_interval
        self.port: int | None = None
        """The HTTP port actually bound (``slack_port`` may be 0 in tests)."""
        self.bot_user_id = ""
        self.bot_id = ""
        self._handler: InboundHandler | None = None
        self._web: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._runner: web.AppRunner | None = None
        self._socket: _SocketClient | None = None
        self._verifier: SignatureVerifier | None = None
        self._handled: _Recent[str] = _Recent(REMEMBERED)
        """Delivery keys the core has recorded (see :func:`_event_key`)."""
        self._handling = _KeyedLocks()
        self._tasks: set[asyncio.Task[None]] = set()
        self._bot_threads: _Recent[tuple[str, str]] = _Recent(REMEMBERED)
        self._dropped: _Recent[tuple[str, str]] = _Recent(REMEMBERED)
        """Drafts the reply was posted in place of (and deleted)."""
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._manifest_logged = False
        self._intake_open = True

    @property
    def events_url(self) -> str:
        """The local Events API URL (HTTP mode, once started)."""
        if self.port is None:
            raise RuntimeError("the Slack channel is not listening over HTTP")
        return f"http://127.0.0.1:{self.port}{EVENTS_PATH}"

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        """Check the bot token, then listen (HTTP) or connect (Socket Mode)."""
        s = self.settings
        if s.slack_bot_token is None:
            raise ValueError("SLACK_BOT_TOKEN is not set")
        app_token = s.slack_app_token.get_secret_value() if s.slack_app_token else None
        secret = s.slack_signing_secret.get_secret_value() if s.slack_signing_secret else None
        if app_token is None and secret is None:
            raise ValueError("set SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET "
                             "(Events API over HTTP) next to SLACK_BOT_TOKEN")
        self._handler = handler
        # No SDK retry handlers: deliver() owns retries, and two layers of them
        # could post one reply twice.
        self._web = AsyncWebClient(token=s.slack_bot_token.get_secret_value(),
                                   base_url=_api_base(s.slack_api_base), retry_handlers=[],
                                   logger=_sdk_log, timeout=self.timeout)
        try:
            auth = await self._web.auth_test()
        except SlackApiError as exc:
            raise RuntimeError(f"Slack refused SLACK_BOT_TOKEN: auth.test answered "
                               f"{_error_code(exc) or exc.response.status_code}") from exc
        self.bot_user_id = str(auth.get("user_id") or "")
        self.bot_id = str(auth.get("bot_id") or "")
        self._app = self._build_app(secret or "", socket_mode=app_token is not None)
        if app_token is not None:
            await self._connect_socket(app_token)
            log.info("Slack: connected over Socket Mode as %s", self.bot_user_id)
        else:
            await self._listen_http(secret or "")
            log.info("Slack: Events API on %s:%s%s as %s", self.host, self.port, EVENTS_PATH,
                     self.bot_user_id)

    async def stop_intake(self) -> None:
        """Take no more deliveries; replies keep going out until :meth:`stop`.

        The Events endpoint answers 503 from now on and Socket Mode envelopes
        are left unacked: Slack delivers both again (after the restart).
        Deliveries already being handed over finish and are acknowledged.
        """
        self._intake_open = False

    async def stop(self) -> None:
        """Stop receiving, then let Web API calls in flight finish (up to 10 s)."""
        self._intake_open = False
        if self._socket is not None:
            socket, self._socket = self._socket, None
            with contextlib.suppress(Exception):
                await socket.close()  # type: ignore[no-untyped-call]  # SDK method lacks hints
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        try:
            await asyncio.wait_for(self._idle.wait(), STOP_GRACE)
        except TimeoutError:
            log.warning("Slack: %d Web API call(s) still running at shutdown", self._in_flight)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _build_app(self, secret: str, *, socket_mode: bool) -> AsyncApp:
        app = AsyncApp(client=self._web, signing_secret=secret, name="roost",
                       logger=logging.getLogger("roost.channels.slack.bolt"),
                       # Socket Mode requests are not signed; the socket is authenticated.
                       request_verification_enabled=not socket_mode,
                       # Bolt answers only once the listener returned: a delivery
                       # is acknowledged after the core recorded it, and a
                       # listener that raised is answered with a 500 (Slack retries).
                       process_before_response=True,
                       # A request no listener takes (block_actions, a type Slack
                       # invents later, junk) reaches the error handler below, which
                       # answers 200, instead of a 404 that Slack would retry.
                       raise_error_for_unhandled_request=True)

        # A closure, not the bound method: bolt passes arguments by parameter name.
        async def on_error(error: Exception, request: AsyncBoltRequest) -> BoltResponse | None:
            return self._bolt_error(error, request)

        app.error(on_error)

        # Bolt builds listener arguments from parameter names, so these are plain
        # closures named the way it expects (a bound method would expose ``self``).
        async def on_event(body: dict[str, Any], request: AsyncBoltRequest) -> None:
            try:
                await self._on_event(body, _header(request, "x-slack-retry-num"))
            except Exception as exc:
                raise _NotRecorded(str(exc)) from exc

        async def on_command(ack: AsyncAck, body: dict[str, Any]) -> None:
            # The core only records the command before returning, well inside
            # Slack's 3 s; the reply follows via response_url. If recording
            # failed, bolt answers 500 and Slack tells the user it failed.
            try:
                await self._on_command(body)
            except Exception as exc:
                raise _NotRecorded(str(exc)) from exc
            await ack()

        # One catch-all listener each, so every event is acked (an unhandled one
        # would get a 404 and be redelivered) and routed in one place.
        app.event(re.compile(".*"))(on_event)
        app.command(re.compile(".*"))(on_command)
        return app

    def _bolt_error(self, error: Exception, request: AsyncBoltRequest) -> BoltResponse | None:
        """Bolt's error handler, for listener and middleware errors alike.

        Only a failure of the core's handler is worth a retry: bolt's 500
        stands. Anything else is the payload's fault (bolt's middleware
        choked on it, or nothing handles its type), and a redelivery would
        fail the same way: acknowledged with 200 and dropped with one warning
        line, as bolt recommends for unhandled requests (a 404 or a 500 would
        make Slack retry it).
        """
        if isinstance(error, _NotRecorded):
            log.error("Slack: the core did not record a delivery; Slack will deliver it "
                      "again", exc_info=error.__cause__ or error)
            return None
        if isinstance(error, BoltUnhandledRequestError):
            log.warning("Slack: skipped a request nothing handles (%s)",
                        _describe(request.body))
        else:
            log.warning("Slack: skipped a malformed request (%s: %s)", type(error).__name__,
                        _short(error))
        return BoltResponse(status=200, body="")

    async def _listen_http(self, secret: str) -> None:
        self._verifier = SignatureVerifier(secret)
        web_app = web.Application(client_max_size=1 << 20)
        web_app.router.add_post(EVENTS_PATH, self._http_request)
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.settings.slack_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def _connect_socket(self, app_token: str) -> None:
        assert self._web is not None
        # Ask for the socket URL here: inside connect() a refused app token would
        # be retried forever instead of failing start().
        try:
            opened = await self._web.apps_connections_open(app_token=app_token)
        except SlackApiError as exc:
            raise RuntimeError(f"Slack refused SLACK_APP_TOKEN: apps.connections.open "
                               f"answered {_error_code(exc) or exc.response.status_code}") from exc
        client = _SocketClient(app_token=app_token, web_client=self._web, logger=_sdk_log)
        client.socket_mode_request_listeners.append(self._socket_request)
        client.wss_uri = str(opened["url"])
        try:
            # The SDK's connect/close carry no type hints.
            await asyncio.wait_for(client.connect(), CONNECT_TIMEOUT)  # type: ignore[no-untyped-call]
        except BaseException:
            await client.close()  # type: ignore[no-untyped-call]
            raise
        self._socket = client

    # -- inbound -----------------------------------------------------------------

    async def _http_request(self, request: web.Request) -> web.StreamResponse:
        """One Events API request: verify, screen, hand to bolt."""
        assert self._app is not None and self._verifier is not None
        if not self._intake_open:
            # Shutting down: Slack retries a 5xx later, when Roost is back.
            return web.Response(status=503, text="shutting down")
        raw = await request.read()
        # Bolt parses the body before verifying it and answers junk with a 500
        # and a traceback, so unsigned requests are refused here first.
        if not self._signed(raw, request.headers.get("X-Slack-Request-Timestamp"),
                            request.headers.get("X-Slack-Signature")):
            log.warning("Slack: refused a request with a bad signature from %s", request.remote)
            return web.Response(status=401, text="invalid signature")
        try:
            bolt_request = AsyncBoltRequest(
                body=raw.decode("utf-8", errors="replace"), query=request.query_string,
                headers={k.lower(): request.headers.getall(k) for k in request.headers})
            problem = _malformed(bolt_request.body)
        except Exception as exc:
            # Bolt reads ids out of the body while building the request.
            problem = f"unparseable body ({type(exc).__name__}: {_short(exc)})"
        if problem:
            log.warning("Slack: request skipped: %s", problem)
            return web.Response(status=200)
        try:
            response = await self._app.async_dispatch(bolt_request)
        except Exception as exc:
            if _caused_by(exc, _NotRecorded):
                # Nothing was recorded: a 5xx makes Slack deliver it again.
                log.exception("Slack: the core did not record a request; answered 500 so "
                              "Slack retries it")
                return web.Response(status=500, text="not recorded")
            # Bolt itself choked on the payload: a redelivery would too.
            log.warning("Slack: malformed request skipped (%s: %s)", type(exc).__name__,
                        _short(exc))
            return web.Response(status=200)
        # A 5xx from bolt means the core did not record the event (the listener
        # raised): it goes back to Slack as is, and Slack redelivers.
        return await to_aiohttp_response(response)

    def _signed(self, body: bytes, timestamp: str | None, signature: str | None) -> bool:
        """Whether the request carries Slack's valid, fresh signature."""
        assert self._verifier is not None
        if (timestamp is None or signature is None or not _TIMESTAMP.fullmatch(timestamp)
                or not _SIGNATURE.fullmatch(signature)):
            return False
        try:
            return self._verifier.is_valid(body, timestamp, signature)
        except (TypeError, ValueError):  # the SDK's own parsing; refused all the same
            return False

    async def _socket_request(self, client: AsyncBaseSocketModeClient,
                              req: SocketModeRequest) -> None:
        """One Socket Mode envelope: hand to bolt; ack it once the core recorded it.

        An envelope whose listener raised is not acked, so Slack delivers it
        again; a malformed one is acked (a redelivery would fail the same
        way). Nothing raises out of here: the SDK would log a traceback.
        """
        assert self._app is not None
        if not self._intake_open:
            # Shutting down: unacked, Slack delivers it again later.
            log.debug("Slack: envelope %s left unacked at shutdown", req.envelope_id)
            return
        payload: dict[str, Any] | None = None
        problem = _malformed(req.payload)
        if problem:
            log.warning("Slack: Socket Mode envelope skipped: %s", problem)
        else:
            headers: dict[str, str | Sequence[str]] = {}
            if isinstance(req.retry_attempt, int):
                headers["x-slack-retry-num"] = str(req.retry_attempt)
            try:
                response = await self._app.async_dispatch(AsyncBoltRequest(
                    mode="socket_mode", body=req.payload, headers=headers))
            except Exception as exc:
                if _caused_by(exc, _NotRecorded):
                    log.exception("Slack: the core did not record envelope %s; not acked, "
                                  "so Slack delivers it again", req.envelope_id)
                    return
                # Bolt reads ids out of the body while building the request, and
                # a redelivery would fail the same way.
                log.warning("Slack: malformed Socket Mode envelope skipped (%s: %s)",
                            type(exc).__name__, _short(exc))
                response = BoltResponse(status=200, body="")
            if response.status >= 500:
                log.warning("Slack: envelope %s was not recorded; not acked, so Slack "
                            "delivers it again", req.envelope_id)
                return
            payload = _ack_payload(response)
        await _ack(client, req.envelope_id, payload)

    async def _on_event(self, body: dict[str, Any], retry: str | None) -> None:
        try:
            message = self._translate(body)
        except Exception as exc:
            # Whatever the payload holds (a list where a string belongs, an
            # unexpected shape), a redelivery would fail the same way: skip it.
            log.warning("Slack: malformed event skipped: %s", _problem(exc))
            return
        if message is not None:
            await self._hand_over(message, retry)

    async def _hand_over(self, message: InboundMessage, retry: str | None = None) -> None:
        """Give ``message`` to the core unless the core already recorded its key.

        The ``message`` and ``app_mention`` events of one post share a key, so
        whichever comes second (or a retry of either) waits for the first and
        is skipped once the core has it. A key is remembered only after the
        handler returned: if it raised, the redelivery is handed over again.
        The core dedupes on ``event_id`` as well; this only spares it the work.
        """
        if self._handler is None:
            raise RuntimeError("the Slack channel is not started")
        key = message.event_id
        async with self._handling.hold(key):
            if key in self._handled:
                log.info("Slack: %s delivered again (retry %s): already recorded, skipped",
                         key, retry or "-")
                return
            await self._handler(message)
            self._handled.add(key)

    def _translate(self, body: Mapping[str, Any]) -> InboundMessage | None:
        """The inbound message for one event, or ``None`` when it is not for the core."""
        event = body.get("event")
        if not isinstance(event, dict):
            raise _Malformed("no event object")
        kind, subtype = event.get("type"), event.get("subtype")
        if kind not in ("message", "app_mention"):
            return None
        if subtype is not None and subtype not in _SPOKEN_SUBTYPES:
            return None
        if event.get("bot_id") or event.get("user") == self.bot_user_id:
            return None
        channel, user = _field(event, "channel", _SLACK_ID), _field(event, "user", _SLACK_ID)
        ts = _field(event, "ts", _SLACK_TS)
        raw_text = event.get("text") or ""
        if not isinstance(raw_text, str):
            raise _Malformed(f"text of {ts} is not a string")
        channel_type = event.get("channel_type") or ("im" if channel.startswith("D") else "")
        direct = channel_type == "im"
        thread_ts = _field(event, "thread_ts", _SLACK_TS) if event.get("thread_ts") else None
        thread = thread_ts if thread_ts != ts else None
        text, at_bot = from_slack(raw_text, self.bot_user_id)
        mentioned = (direct or kind == "app_mention" or at_bot
                     or (thread is not None and (channel, thread) in self._bot_threads))
        chat_type: ChatType = "direct" if direct else "group"
        return InboundMessage(
            channel=self.name, chat_id=channel, chat_type=chat_type, sender_id=user,
            sender_name=_sender_name(event), text=text, message_id=ts, thread_id=thread,
            mentioned=mentioned, attachments=_attachments(event), raw=event,
            group_id=_team(body, event), event_id=_event_key(channel, ts))

    async def _on_command(self, body: dict[str, Any]) -> None:
        try:
            command, channel = _field(body, "command"), _field(body, "channel_id", _SLACK_ID)
            user = _field(body, "user_id", _SLACK_ID)
            response_url = _field(body, "response_url")
            if not _RESPONSE_URL.fullmatch(response_url):
                raise _Malformed("response_url is not an http(s) URL")
            trigger = _field(body, "trigger_id", _TRIGGER_ID) if body.get("trigger_id") else ""
            text = _command_text(command, unescape(str(body.get("text") or "")).strip())
        except Exception as exc:
            log.warning("Slack: malformed slash command skipped: %s", _problem(exc))
            return
        if parse_command(text) is None:
            # Answered in the background: bolt acks only once this returns.
            self._spawn(self._usage(response_url))
            return
        message = InboundMessage(
            channel=self.name, chat_id=channel,
            chat_type="direct" if channel.startswith("D") else "group", sender_id=user,
            sender_name=str(body.get("user_name") or ""), text=text, mentioned=True, raw=body,
            group_id=_team(body, body),
            # Slack never redelivers a command, but the inbox wants a unique key.
            event_id=f"cmd:{trigger or response_url}")
        token = _SLASH.set(_SlashReply(channel, response_url))
        try:
            await self._hand_over(message)
        finally:
            _SLASH.reset(token)

    async def _usage(self, response_url: str) -> None:
        with _logged("answering a slash command"):
            await self._respond(response_url, f"Usage: `{SLASH_COMMAND} <command> [args]`, "
                                              f"for example `{SLASH_COMMAND} help`.")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- outbound ----------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one reply; the ``ts`` of its last message (``None`` via response_url).

        A slash command's reply goes to its response_url. Otherwise the reply is
        posted (threaded as the module doc says); with ``replace`` the draft is
        edited into the first piece, or, if that fails for good, the reply is
        posted anew and the draft deleted.
        """
        slash = _SLASH.get()
        if slash is not None and slash.channel_id == message.chat_id and not message.replace:
            await self._respond(slash.response_url, message.text)
            return None
        thread_ts = message.thread_id or message.reply_to
        pieces = split_for_slack(message.text, MESSAGE_LIMIT) if message.text.strip() else []
        return await self._deliver_reply(message.chat_id, thread_ts, pieces,
                                         draft=message.replace or None,
                                         delivery_id=message.delivery_id,
                                         look_first=message.redelivery)

    async def withdraw(self, chat_id: str, message_id: str) -> None:
        """Delete one of the bot's messages; one already gone counts as deleted."""
        await self._delete(chat_id, message_id)

    def open_stream(self, message: InboundMessage) -> ReplyStream | None:
        """An edited draft in the reply's place, unless streaming is off for Slack."""
        if self._web is None or not self.settings.streams(self.name):
            return None
        target = OutboundMessage.reply_to_message(message, "")
        channel, thread_ts = target.chat_id, target.thread_id or target.reply_to

        shown = [""]  # the draft's text as Slack has it, to skip a no-op final edit
        editing: list[asyncio.Task[None]] = []
        doubtful = [False]  # a draft edit failed: it may still land after the final one

        async def send(draft: str) -> str:
            text = to_mrkdwn(draft)
            try:
                ts = await self._post(channel, text, thread_ts)
            except Exception:
                # No draft then ("" is no message): the final reply is posted fresh.
                log.warning("Slack: could not post a streaming draft", exc_info=True)
                return ""
            shown[0] = text
            return ts

        async def update(ts: str, text: str) -> None:
            try:
                await self._call("chat.update", self._api().chat_update, _EDIT_POLICY,
                                 channel=channel, ts=ts, text=text)
            except Exception:
                doubtful[0] = True
                raise
            shown[0] = text

        async def edit(ts: str, draft: str) -> None:
            if ts:
                # Shielded: the stream cancels a pending edit when the reply is
                # final, but a request already sent would still be applied,
                # possibly after the final edit. finalize() waits for it.
                editing[:] = [asyncio.ensure_future(update(ts, to_mrkdwn(draft)))]
                await asyncio.shield(editing[0])

        async def finalize(ts: str | None, final: str | None) -> None:
            await asyncio.gather(*editing, return_exceptions=True)
            pieces = split_for_slack(final, MESSAGE_LIMIT) if final and final.strip() else []
            last = await self._deliver_reply(channel, thread_ts, pieces, draft=ts or None,
                                             shown=shown[0])
            # The draft may have been replaced by a new message: the stream
            # names the message that now carries the reply.
            stream.message_id = last
            if doubtful[0] and ts and pieces and self._kept(channel, ts):
                # A draft edit that timed out may still be applied by Slack
                # after the final text: put the final text back once it would have.
                self._spawn(self._reassert(channel, ts, pieces[0]))

        stream = EditStream(send=send, edit=edit, finalize=finalize, limit=MESSAGE_LIMIT,
                            interval=self.edit_interval)
        return stream

    async def _deliver_reply(self, channel: str, thread_ts: str | None, pieces: list[str],
                             *, draft: str | None, shown: str | None = None,
                             delivery_id: str | None = None,
                             look_first: bool = True) -> str | None:
        """Put ``pieces`` in place of ``draft`` (or post them); the last message's ts.

        No pieces means a silent reply: the draft is deleted. The draft is
        edited into the first piece (skipped when it already shows it); if that
        edit fails for good (the draft is gone, too old, or Slack keeps failing
        the edit), the piece is posted anew and the draft deleted, so no draft
        is left frozen. Raises when the reply could not be delivered.

        With a ``delivery_id`` (the core's key of the reply, the same across
        attempts and restarts) each piece's nonce derives from it, and the
        conversation is read once for pieces already posted, which are not
        posted again: the core sends a key again only when an earlier attempt
        failed, here or in a process that stopped before recording it, and
        that attempt may have posted some or all of the pieces. ``look_first``
        False (a first delivery: nothing can have been posted yet) skips that read.
        """
        nonces: list[str | None] = [None] * len(pieces)
        posted: dict[str, str] = {}
        if delivery_id and pieces:
            nonces = [delivery_id if i == 0 else f"{delivery_id}#{i}"
                      for i in range(len(pieces))]
            if look_first:
                posted = await self._posted_before(channel, thread_ts, delivery_id)
        if not pieces:
            if draft:
                await self._delete(channel, draft)
            return None
        first: str | None = None
        if draft:
            if pieces[0] == shown:
                first = draft
            else:
                try:
                    await self._call("chat.update", self._api().chat_update, self.policy,
                                     channel=channel, ts=draft, text=pieces[0])
                    first = draft
                except Exception as exc:
                    log.warning("Slack: could not edit draft %s into the reply (%s); "
                                "posting it anew", draft, exc)
        if first is None:
            first = posted.get(nonces[0] or "") or await self._post(
                channel, pieces[0], thread_ts, nonces[0])
            if draft:
                await self._drop_draft(channel, draft)
        last = first
        for piece, nonce in zip(pieces[1:], nonces[1:], strict=True):
            last = posted.get(nonce or "") or await self._post(channel, piece, thread_ts, nonce)
        return last

    def _kept(self, channel: str, ts: str) -> bool:
        return (channel, ts) not in self._dropped

    async def _reassert(self, channel: str, ts: str, text: str) -> None:
        await asyncio.sleep(self.timeout + SWEEP_MARGIN)
        with _logged("restoring a reply after a late draft edit"):
            await self._call("chat.update", self._api().chat_update, self.policy,
                             channel=channel, ts=ts, text=text)

    async def _drop_draft(self, channel: str, ts: str) -> None:
        """Delete a draft the reply was posted in place of.

        The reply is out, so a failure here must not fail the send (the core
        would post the reply again); it is logged instead.
        """
        self._dropped.add((channel, ts))
        try:
            await self._delete(channel, ts)
        except Exception:
            log.exception("Slack: could not delete the replaced draft %s in %s", ts, channel)

    async def _delete(self, channel: str, ts: str) -> None:
        try:
            await self._call("chat.delete", self._api().chat_delete, self.policy,
                             channel=channel, ts=ts)
        except SlackApiError as exc:
            if _error_code(exc) != "message_not_found":
                raise

    @contextlib.asynccontextmanager
    async def typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Nothing: Slack offers bots no typing indicator in channels (see the module doc)."""
        yield

    async def register_commands(self, commands: Sequence[Command]) -> None:
        """Log (once, at debug level) the manifest entries Slack needs; nothing is called."""
        if self._manifest_logged:
            return
        self._manifest_logged = True
        names = ", ".join(sorted({c.name for c in commands}))
        log.debug("Slack slash commands live in the app manifest, not in the API. "
                  "Add to the manifest:\n%s", _manifest(names))

    async def _post(self, channel: str, text: str, thread_ts: str | None,
                    nonce: str | None = None) -> str:
        """Post one message exactly once; its ts.

        ``chat.postMessage`` has no idempotency key, and a call that failed
        with a reset, a timeout or a 5xx may still have posted. So each post
        carries a nonce in its message metadata (``nonce``, else a random
        one), and before posting again after such a failure the conversation
        is searched for it. A call that timed out may also land *after* the
        retry posted: once the call timeout has passed, a sweep deletes any
        other message with the nonce.
        """
        nonce = nonce or uuid.uuid4().hex
        metadata = {"event_type": METADATA_EVENT, "event_payload": {"nonce": nonce}}
        # Slack's clock, not ours, stamps the message: leave a generous margin.
        since = f"{time.time() - LOOKUP_MARGIN:.6f}"
        unsure = False
        found_again = False

        async def attempt() -> str:
            nonlocal unsure, found_again
            if unsure:
                found = await self._find_posts(channel, thread_ts, nonce, since)
                if found:
                    log.info("Slack: a post that failed had gone out (ts %s); not posting "
                             "again", found[0])
                    found_again = True
                    return found[0]
            try:
                response = await self._api().chat_postMessage(
                    channel=channel, text=text, thread_ts=thread_ts, metadata=metadata)
            except Exception as exc:
                mapped = delivery_error(exc)
                unsure = unsure or isinstance(mapped, Transient)
                if mapped is exc:
                    raise
                raise mapped from exc
            return str(response.get("ts") or "")

        ts = await self._tracked(deliver(attempt, what="Slack chat.postMessage",
                                         policy=self.policy))
        if thread_ts:
            self._bot_threads.add((channel, thread_ts))
        if unsure and not found_again:
            self._spawn(self._sweep(channel, thread_ts, nonce, since, keep=ts))
        return ts

    async def _posted_before(self, channel: str, thread_ts: str | None,
                             delivery_id: str) -> dict[str, str]:
        """The pieces of reply ``delivery_id`` already posted: ts by nonce.

        One read of the last day, no retries: when it fails (Slack limits
        history reads hard for some apps, or a scope is missing) the reply
        is posted, risking a duplicate rather than holding up the reply.
        """
        since = f"{time.time() - REDELIVERY_LOOKBACK:.6f}"
        try:
            found = await self._tracked(self._read_nonces(channel, thread_ts, since))
        except Exception as exc:
            log.info("Slack: could not check whether reply %s was posted already (%s); "
                     "posting it", delivery_id, _problem(exc))
            return {}
        mine = {nonce: stamps[0] for nonce, stamps in found.items()
                if nonce == delivery_id or nonce.startswith(delivery_id + "#")}
        if mine:
            log.info("Slack: %d piece(s) of reply %s were posted already; not posting "
                     "them again", len(mine), delivery_id)
            if thread_ts:
                self._bot_threads.add((channel, thread_ts))
        return mine

    async def _sweep(self, channel: str, thread_ts: str | None, nonce: str, since: str,
                     keep: str) -> None:
        """Delete copies of a post that landed late (a timed-out try Slack still ran)."""
        await asyncio.sleep(self.timeout + SWEEP_MARGIN)
        with _logged("removing a duplicate post"):
            for ts in await self._find_posts(channel, thread_ts, nonce, since):
                if ts != keep:
                    log.warning("Slack: a timed-out post landed late (ts %s); deleted", ts)
                    await self._delete(channel, ts)

    async def _find_posts(self, channel: str, thread_ts: str | None, nonce: str,
                          since: str) -> list[str]:
        """The ts of the bot's messages carrying ``nonce``, oldest first.

        Without history access (a missing scope) nothing can be checked, and
        none is reported: posting again risks a duplicate, not posting a loss.
        """
        try:
            found = await self._read_nonces(channel, thread_ts, since)
        except (Transient, RateLimited):
            raise
        except Exception as exc:
            log.warning("Slack: could not check whether a failed post went out (%s); "
                        "posting again", exc)
            return []
        return found.get(nonce, [])

    async def _read_nonces(self, channel: str, thread_ts: str | None,
                           since: str) -> dict[str, list[str]]:
        """The ts of the bot's recent messages by their nonce, oldest first.

        Raises Slack's errors mapped by :func:`delivery_error`.
        """
        api = self._api()
        try:
            if thread_ts:
                response = await api.conversations_replies(
                    channel=channel, ts=thread_ts, oldest=since, include_all_metadata=True,
                    limit=LOOKUP_LIMIT)
            else:
                response = await api.conversations_history(
                    channel=channel, oldest=since, include_all_metadata=True,
                    limit=LOOKUP_LIMIT)
        except Exception as exc:
            mapped = delivery_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        found: dict[str, list[str]] = {}
        for item in response.get("messages") or []:
            meta = item.get("metadata") if isinstance(item, dict) else None
            payload = meta.get("event_payload") if isinstance(meta, dict) else None
            if (isinstance(meta, dict) and meta.get("event_type") == METADATA_EVENT
                    and isinstance(payload, dict) and isinstance(payload.get("nonce"), str)
                    and item.get("ts")):
                found.setdefault(payload["nonce"], []).append(str(item["ts"]))
        for stamps in found.values():
            stamps.sort(key=_ts_order)
        return found

    async def _respond(self, response_url: str, text: str) -> None:
        pieces = split_for_slack(text, MESSAGE_LIMIT)
        if len(pieces) > RESPONSE_URL_USES:
            log.warning("Slack: a command reply has %d parts; a response_url takes %d",
                        len(pieces), RESPONSE_URL_USES)
            del pieces[RESPONSE_URL_USES:]
        webhook = AsyncWebhookClient(response_url, retry_handlers=[], logger=_sdk_log)
        for piece in pieces:
            await self._tracked(deliver(functools.partial(_post_response, webhook, piece),
                                        what="Slack response_url", policy=self.policy))

    async def _call(self, method: str, call: Callable[..., Awaitable[AsyncSlackResponse]],
                    policy: DeliveryPolicy, **params: Any) -> AsyncSlackResponse:
        """A Web API call with Slack's errors translated for :func:`deliver`."""
        async def attempt() -> AsyncSlackResponse:
            try:
                return await call(**params)
            except Exception as exc:
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc

        return await self._tracked(deliver(attempt, what=f"Slack {method}", policy=policy))

    async def _tracked(self, call: Awaitable[T]) -> T:
        # Counted so stop() can let replies in flight finish.
        self._in_flight += 1
        self._idle.clear()
        try:
            return await call
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _api(self) -> AsyncWebClient:
        if self._web is None:
            raise RuntimeError("the Slack channel is not started")
        return self._web


# -- helpers ------------------------------------------------------------------------------


def delivery_error(exc: BaseException) -> BaseException:
    """What a Web API failure means to :func:`deliver`; ``exc`` itself if it is for good.

    The one mapping of everything slack_sdk and aiohttp raise:

    * 429 (or ``error: ratelimited``) → :class:`RateLimited` with ``Retry-After``;
    * any 5xx, whatever its body (an HTML error page from a proxy included),
      and the error codes Slack uses for its own trouble → :class:`Transient`;
    * an answer that is not Slack's JSON (slack_sdk raises ``SlackApiError``
      around aiohttp's response, or with no ``error`` to read) → :class:`Transient`;
    * connection errors: aiohttp's ``ClientError`` (resets, server
      disconnects, payload errors), ``TimeoutError``, ``OSError`` → :class:`Transient`;
    * any other ``SlackApiError`` (``channel_not_found``, ``not_in_channel``,
      ``invalid_auth``, ``msg_too_long``...) and everything else → permanent.
    """
    if isinstance(exc, SlackApiError):
        response = exc.response
        # slack_sdk wraps aiohttp's own response (``status``, no ``data``)
        # when the body could not be decoded, its AsyncSlackResponse otherwise.
        raw_status = getattr(response, "status_code", None)
        if not isinstance(raw_status, int):
            raw_status = getattr(response, "status", 0)
        status = raw_status if isinstance(raw_status, int) else 0
        data = getattr(response, "data", None)
        code = data.get("error") if isinstance(data, dict) else None
        if status == 429 or code == "ratelimited":
            return RateLimited(_retry_after(getattr(response, "headers", None)))
        if status >= 500:
            return Transient(f"Slack answered HTTP {status}")
        if code in TRANSIENT_ERRORS:
            return Transient(f"Slack answered {code}")
        if not isinstance(code, str) or not code:
            return Transient(f"Slack's answer (HTTP {status}) could not be read")
        return exc
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return Transient(f"{type(exc).__name__}: {exc}")
    return exc


async def _post_response(webhook: AsyncWebhookClient, text: str) -> None:
    """Post one ephemeral reply to a response_url, errors translated for deliver()."""
    try:
        response = await webhook.send(text=text, response_type="ephemeral")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise Transient(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code == 429:
        raise RateLimited(_retry_after(response.headers))
    if response.status_code >= 500:
        raise Transient(f"response_url answered HTTP {response.status_code}")
    if response.status_code != 200:
        raise RuntimeError(f"response_url answered HTTP {response.status_code}: "
                           f"{response.body[:200]}")


def _api_base(value: str | None) -> str:
    # The SDK joins base and method by plain concatenation.
    if not value:
        return DEFAULT_API_BASE
    return value if value.endswith("/") else value + "/"


def _malformed(body: Any) -> str | None:
    """Why a request body is not handed to bolt, or ``None`` if it is one Roost takes.

    Roost takes events, the URL check, SSL checks and slash commands. Anything
    else (block actions, views, shortcuts, ``app_rate_limited``, junk) is
    answered 200 and dropped here: bolt would answer a 404 (which Slack
    retries), and for some malformed shapes its middleware, and even its
    error handler, raise while reading ids out of the body.
    """
    if not isinstance(body, dict) or not body:
        return "not a JSON object or form"
    kind = body.get("type")
    if "type" in body and not isinstance(kind, str):
        return "its type is not a string"
    if kind == "event_callback":
        event = body.get("event")
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return "event_callback without an event object"
        return None
    if kind == "url_verification" or body.get("ssl_check") == "1":
        return None
    if kind is None and isinstance(body.get("command"), str):
        return None
    return f"a {_short(kind or 'typeless', 60)} request, which Roost does not handle"


async def _ack(client: AsyncBaseSocketModeClient, envelope_id: str,
               payload: dict[str, Any] | None = None) -> None:
    """Acknowledge a Socket Mode envelope; a lost ack only means Slack sends it again."""
    try:
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=envelope_id, payload=payload))
    except Exception as exc:
        log.warning("Slack: could not ack envelope %s (%s); Slack will deliver it again",
                    envelope_id, _problem(exc))


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``kind`` is ``exc`` or among the exceptions it was raised in handling."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _ts_order(ts: str) -> float:
    try:
        return float(ts)
    except ValueError:
        return float("inf")


def _problem(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, _Malformed) else f"{type(exc).__name__}: {_short(exc)}"


def _describe(body: Any) -> str:
    """A request's kind, for the log line that says it was skipped."""
    if not isinstance(body, dict):
        return "not an object"
    kind = body.get("type") or ("command" if "command" in body else "no type")
    return _short(kind, 60)


def _socket_frame(raw: str | bytes) -> dict[str, Any] | None:
    """A Socket Mode frame as a JSON object, or ``None`` (logged) if it is not one."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        log.warning("Slack: skipped a Socket Mode frame that is not JSON (%s)",
                    type(exc).__name__)
        return None
    if not isinstance(message, dict):
        log.warning("Slack: skipped a Socket Mode frame that is not a JSON object")
        return None
    return message


def _envelope_problem(message: Mapping[str, Any]) -> str | None:
    """What is wrong with a Socket Mode envelope's own fields, if anything."""
    envelope_id = message.get("envelope_id")
    if not isinstance(envelope_id, str) or not envelope_id:
        return "its envelope_id is not a string"
    if not isinstance(message.get("type"), str):
        return f"envelope {_short(envelope_id, 60)} has no type"
    if not isinstance(message.get("payload"), dict | str):
        return f"envelope {_short(envelope_id, 60)} has no payload object"
    for key, kinds in (("retry_attempt", int), ("retry_reason", str),
                       ("accepts_response_payload", bool)):
        value = message.get(key)
        if value is not None and not isinstance(value, kinds):
            return f"envelope {_short(envelope_id, 60)} has a bad {key}"
    return None


def _ack_payload(response: BoltResponse) -> dict[str, Any] | None:
    """What bolt answered, as a Socket Mode ack payload (``None``: a bare ack)."""
    if response.status != 200 or not response.body:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if content_type.startswith("application/json"):
        loaded = json.loads(response.body)
        return loaded if isinstance(loaded, dict) else None
    return {"text": response.body}


def _event_key(channel: str, ts: str) -> str:
    """The inbox key of one Slack message.

    A post reaches the app as a ``message`` and an ``app_mention`` event with
    different ``event_id``s (and a retry repeats either), but channel and
    ``ts`` name the message itself, so every delivery of it dedupes.
    """
    return f"{channel}:{ts}"


def _header(request: AsyncBoltRequest, name: str) -> str | None:
    values = request.headers.get(name)
    return str(values[0]) if values else None


def _team(body: Mapping[str, Any], event: Mapping[str, Any]) -> str | None:
    """The Slack workspace (team id) an event or command came from, if it says."""
    for value in (event.get("team"), body.get("team_id")):
        if isinstance(value, str) and _SLACK_ID.fullmatch(value):
            return value
    return None


def _field(data: Mapping[str, Any], key: str, shape: re.Pattern[str] | None = None) -> str:
    """``data[key]``, a non-empty string (of ``shape``, if given), or :class:`_Malformed`."""
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise _Malformed(f"missing {key!r}")
    if shape is not None and not shape.fullmatch(value):
        raise _Malformed(f"{key!r} is not what Slack sends ({_short(value, 40)})")
    return value


def _error_code(exc: SlackApiError) -> str:
    data = exc.response.data
    return str(data.get("error") or "") if isinstance(data, dict) else ""


def _retry_after(headers: Any) -> float:
    """``Retry-After`` in seconds from SDK headers (their key case varies), default 1."""
    items = headers.items() if isinstance(headers, Mapping) else []
    for key, value in items:
        if str(key).lower() == "retry-after":
            raw = value[0] if isinstance(value, list | tuple) and value else value
            with contextlib.suppress(TypeError, ValueError):
                return max(0.0, float(raw))
    return 1.0


def _command_text(command: str, args: str) -> str:
    """``/roost stop now`` → ``/stop now``; another slash command stays as typed."""
    if command == SLASH_COMMAND:
        args = args.lstrip("/").strip()
        return "/" + (args or "help")
    return f"{command} {args}".strip()


def _sender_name(event: Mapping[str, Any]) -> str:
    profile = event.get("user_profile")
    if isinstance(profile, dict):
        for key in ("display_name", "real_name", "name"):
            if isinstance(profile.get(key), str) and profile[key]:
                return str(profile[key])
    return ""


def _attachments(event: Mapping[str, Any]) -> tuple[Attachment, ...]:
    files = event.get("files")
    if not isinstance(files, list):
        return ()
    found = []
    for item in files:
        if not isinstance(item, dict):
            continue
        mime = str(item.get("mimetype") or "")
        major = mime.split("/", 1)[0]
        size = item.get("size")
        # Stored as given (the core cleans only text and names): no lone surrogates.
        found.append(Attachment(
            kind=major if major in ("image", "audio", "video") else "file",
            name=clean_text(str(item.get("name") or "")),
            url=clean_text(str(item.get("url_private") or "")),
            mime_type=clean_text(mime), size=size if type(size) is int and size >= 0 else 0))
    return tuple(found)


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    try:
        yield
    except Exception:
        log.exception("Slack: %s failed", what)


def _manifest(command_names: str) -> str:
    return f"""\
features:
  bot_user: {{display_name: Roost, always_online: true}}
  slash_commands:
    - command: {SLASH_COMMAND}
      url: https://YOUR-HOST{EVENTS_PATH}   # HTTP mode only; omit for Socket Mode
      description: "Roost commands: {command_names}"
      usage_hint: "<command> [args]"
      should_escape: false
oauth_config:
  scopes:
    bot: [app_mentions:read, channels:history, groups:history, im:history, mpim:history,
          chat:write, commands]
settings:
  event_subscriptions:
    request_url: https://YOUR-HOST{EVENTS_PATH}   # HTTP mode only
    bot_events: [app_mention, message.channels, message.groups, message.im, message.mpim]
  socket_mode_enabled: false   # true with SLACK_APP_TOKEN (connections:write)"""
