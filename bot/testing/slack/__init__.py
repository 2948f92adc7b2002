"""A local fake of Slack, for driving the real slack-bolt / slack_sdk against it.

It plays both sides of Slack:

* the **Web API** the app calls (``POST /api/{method}``): ``auth.test``,
  ``chat.postMessage``, ``chat.update``, ``chat.delete``,
  ``apps.connections.open`` and ``conversations.info``, with bearer tokens
  checked and ``{"ok": ...}`` answers. Point ``AsyncWebClient(base_url=...)``
  (Roost: ``SLACK_API_BASE``) at :attr:`FakeSlack.base_url`;
* the **Events API** that calls the app: :meth:`FakeSlack.post_event`,
  :meth:`FakeSlack.post_body`, :meth:`FakeSlack.url_verification` and
  :meth:`FakeSlack.slash_command` send requests signed like Slack's
  (``v0=`` HMAC-SHA256 over ``v0:{timestamp}:{body}``) to
  :attr:`FakeSlack.events_url`, optionally forged or with ``X-Slack-Retry-Num``;
* **Socket Mode**: ``apps.connections.open`` hands out ``ws://.../socket``;
  the socket sends ``hello``, then the envelopes :meth:`FakeSlack.socket_event`
  and :meth:`FakeSlack.socket_slash_command` push, and records the acks;
* the **response_url** of slash commands (``POST /response/{n}``), recorded
  in :attr:`FakeSlack.responses`;
* **files**: :meth:`FakeSlack.file` stores bytes and returns the file object a
  message event carries (``files=[...]``, ``subtype="file_share"``); its
  ``url_private`` (and ``url_private_download``) serve the bytes only to
  ``Authorization: Bearer <bot token>`` with the ``files:read`` scope (see
  :attr:`FakeSlack.scopes`), and answer anything else as Slack does: a 302
  to the login page (an HTML 200), or 403 with ``denial="403"``. Uploads
  work as on Slack (``files.info`` too): ``files.getUploadURLExternal`` (needs ``files:write``)
  hands out an upload URL, a POST of the bytes there, then
  ``files.completeUploadExternal`` shares the files into a channel or thread
  (recorded in :attr:`FakeSlack.shared`); every file is downloadable after.

::

    async with FakeSlack() as fake:
        ...                                    # start the app with fake.settings()
        fake.events_url = "http://127.0.0.1:3000/slack/events"
        await fake.post_event(fake.message("hello", channel=fake.dm_channel))
        [call] = await fake.wait_for("chat.postMessage")
        assert call.params["text"] == "Hi!"

Every Web API call is recorded in :attr:`FakeSlack.calls`; the bot's messages
as they currently stand (edits applied, deletions marked) in
:attr:`FakeSlack.messages` (``conversations.history``/``.replies`` read them
back, metadata included). The ``fake_slack`` pytest fixture yields a started
instance.

**Faults**, the ways the real Slack fails (see
``/work/shared/notes/fake-platform-servers.md``): :meth:`FakeSlack.fail` makes
the next N calls of a method fail with a status (429 with ``Retry-After``,
5xx, or an ``ok: false`` error); :meth:`FakeSlack.inject` queues one of
:data:`FAULTS` for a method (``"*"``: any), and :meth:`FakeSlack.chaos` fails
a random share of calls. Kinds: ``"500"`` (JSON envelope), ``"502"`` (an HTML
page from the proxy), ``"429"``, ``"reset_before"`` (TCP reset before the
call took effect), ``"reset_after"`` (it took effect, then the reset),
``"disconnect"`` (the server closes the connection without answering, before
the call took effect), ``"truncated"`` (a 200 whose JSON body is cut short),
``"stall"`` (the answer comes after ``stall`` seconds). Deliveries to the app
fail too, and Slack redelivers: :meth:`FakeSlack.deliver_event` retries an
event whose POST got a non-2xx (or no answer in time) with
``X-Slack-Retry-Num``; :meth:`FakeSlack.deliver_socket_event` resends an
envelope that was not acked in time.

The modules: :mod:`.wire` (ids, tokens, records, helpers) and one per part,
each an object :class:`FakeSlack` (:mod:`.server`) builds and holds:
:mod:`.state` (what the fake holds, shared by the others), :mod:`.faults`,
:mod:`.events` (what Slack sends the app, Socket Mode included), :mod:`.files`
and :mod:`.api` (the Web API and response URLs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from bot.testing.slack.server import FakeSlack
from bot.testing.slack.wire import (
    ALICE,
    APP_ID,
    APP_TOKEN,
    BAD_GATEWAY_PAGE,
    BOB,
    BOT_ID,
    BOT_TOKEN,
    BOT_USER_ID,
    CHANNEL,
    CHAOS_METHODS,
    DM_CHANNEL,
    FAULTS,
    MAX_TEXT,
    SIGNING_SECRET,
    TEAM_ID,
    Call,
    Delivery,
    Posted,
    ResponsePost,
    SharedFile,
    SlackFile,
    SlashResult,
    sign,
)

__all__ = [
    "ALICE",
    "APP_ID",
    "APP_TOKEN",
    "BAD_GATEWAY_PAGE",
    "BOB",
    "BOT_ID",
    "BOT_TOKEN",
    "BOT_USER_ID",
    "CHANNEL",
    "CHAOS_METHODS",
    "DM_CHANNEL",
    "FAULTS",
    "MAX_TEXT",
    "SIGNING_SECRET",
    "TEAM_ID",
    "Call",
    "Delivery",
    "FakeSlack",
    "Posted",
    "ResponsePost",
    "SharedFile",
    "SlackFile",
    "SlashResult",
    "fake_slack",
    "sign",
]


# -- pytest ---------------------------------------------------------------------------------

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the fake works without pytest installed
    pass
else:
    @pytest_asyncio.fixture(name="fake_slack")
    async def fake_slack() -> AsyncIterator[FakeSlack]:
        """A started :class:`FakeSlack`, stopped after the test.

        Named explicitly, so a test module can import it under another name
        (``from bot.testing.slack import fake_slack as _fixture``) without the
        parameter shadowing the import.
        """
        async with FakeSlack() as fake:
            yield fake
