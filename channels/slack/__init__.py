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

**Files** (:mod:`channels.slack.media`). The ``files`` of a message become
attachments (``url`` is ``url_private_download``); :meth:`SlackChannel.download`
fetches one with the bot token (``files:read``), only from Slack's hosts or
``SLACK_API_BASE``, with a byte limit. A reply's files are shared after its
text into the same channel and thread with ``files_upload_v2``
(``files:write``); over 1 GB raises ``MediaTooLarge`` before anything is posted.

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

from channels.slack.channel import SlackChannel
from channels.slack.common import MESSAGE_LIMIT
from channels.slack.errors import delivery_error

__all__ = ["MESSAGE_LIMIT", "SlackChannel", "delivery_error"]
