"""Block Kit buttons, presses, edits, deletions and reactions on Slack.

Buttons are ``actions`` blocks under the reply's text (a ``section`` block, since
a message with blocks shows them instead of its ``text``). A press is a
``block_actions`` payload on the events endpoint (or an ``interactive`` Socket
Mode envelope), acknowledged at once; its note goes to the ``response_url`` as
an ephemeral message. ``message_changed`` with an ``edited`` mark is a person's
edit (without one, links were unfurled), ``message_deleted`` a deletion and
``reaction_added``/``_removed`` reactions (scope ``reactions:read``). The bot's
reactions are ``reactions.add``/``.remove`` (``reactions:write``), tried once:
a rate-limited one is dropped, and so is every one until its Retry-After has passed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.webhook.async_client import AsyncWebhookClient

from bot.contracts.messages import (
    ButtonPress,
    ButtonRows,
    InboundMessage,
    MessageDeletion,
    MessageEdit,
    ReactionEvent,
)
from channels.slack.api import SlackApi
from channels.slack.common import (
    CHANNEL_NAME,
    RESPONSE_URL,
    SLACK_ID,
    SLACK_TS,
    TRIGGER_ID,
    Malformed,
    error_code,
    event_key,
    field_of,
    log,
    retry_after,
    sdk_log,
)

NAMES = {"👍": "+1", "👎": "-1", "👀": "eyes", "✅": "white_check_mark", "⚠️": "warning",
         "⚠": "warning", "❤️": "heart", "❤": "heart", "🎉": "tada", "❌": "x",
         "⏳": "hourglass_flowing_sand", "🤔": "thinking_face", "🚀": "rocket", "🔥": "fire",
         "🙏": "pray"}
"""Slack's names of the emoji Roost reacts with (Slack takes names, not characters)."""
EMOJI = {"+1": "👍", "thumbsup": "👍", "-1": "👎", "thumbsdown": "👎", "eyes": "👀",
         "white_check_mark": "✅", "warning": "⚠️", "heart": "❤️", "tada": "🎉", "x": "❌",
         "hourglass_flowing_sand": "⏳", "thinking_face": "🤔", "rocket": "🚀", "fire": "🔥",
         "pray": "🙏"}
"""The characters of the emoji names people's reactions come with (others stay ``:name:``)."""
SECTION_LIMIT = 3000
"""Characters a ``section`` block's text may have."""
STYLES = {"primary": "primary", "success": "primary", "danger": "danger"}


def blocks_of(text: str, rows: ButtonRows) -> list[dict[str, Any]]:
    """``text`` as section blocks, then one ``actions`` block per row of ``rows``."""
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text[i:i + SECTION_LIMIT]}}
        for i in range(0, len(text), SECTION_LIMIT)]
    for r, row in enumerate(r for r in rows if r):
        elements = []
        for c, button in enumerate(row):
            element: dict[str, Any] = {
                "type": "button", "action_id": f"roost-{r}-{c}", "value": button.data,
                "text": {"type": "plain_text", "text": button.label, "emoji": True}}
            if button.style in STYLES:
                element["style"] = STYLES[button.style]
            elements.append(element)
        blocks.append({"type": "actions", "block_id": f"roost-row-{r}", "elements": elements})
    return blocks


def emoji_name(emoji: str) -> str | None:
    """Slack's name for ``emoji`` (a known character, or ``:name:``); ``None`` if unknown."""
    if len(emoji) > 2 and emoji.startswith(":") and emoji.endswith(":"):
        return emoji[1:-1]
    return NAMES.get(emoji)


def press_of(body: Mapping[str, Any]) -> ButtonPress:
    """The press a ``block_actions`` payload reports; :class:`Malformed` if it is not one."""
    actions = body.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        raise Malformed("no action")
    action = actions[0]
    user = body.get("user")
    container = body.get("container")
    if not isinstance(user, dict) or not isinstance(container, dict):
        raise Malformed("no user or container")
    channel = field_of(container, "channel_id", SLACK_ID)
    response_url = field_of(body, "response_url")
    if not RESPONSE_URL.fullmatch(response_url):
        raise Malformed("response_url is not an http(s) URL")
    thread = container.get("thread_ts")
    team = body.get("team")
    return ButtonPress(
        channel=CHANNEL_NAME, chat_id=channel, message_id=field_of(container, "message_ts",
                                                                   SLACK_TS),
        data=field_of(action, "value"), user_id=field_of(user, "id", SLACK_ID),
        user_name=str(user.get("name") or user.get("username") or ""),
        press_id=field_of(body, "trigger_id", TRIGGER_ID), token=response_url,
        chat_type="direct" if channel.startswith("D") else "group",
        thread_id=thread if isinstance(thread, str) and SLACK_TS.fullmatch(thread) else None,
        group_id=str(team["id"]) if isinstance(team, dict) and team.get("id") else None,
        raw=body)


def change_of(body: Mapping[str, Any], bot_user_id: str,
              translate: Callable[[Mapping[str, Any]], InboundMessage | None]
              ) -> MessageEdit | MessageDeletion | ReactionEvent | None:
    """The edit, deletion or reaction an event reports; ``None`` for other events (and
    for edits that are no person's: unfurls, the bot's own messages)."""
    event = body.get("event")
    if not isinstance(event, dict):
        return None
    kind, subtype = event.get("type"), event.get("subtype")
    if kind == "message" and subtype == "message_changed":
        message = event.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("edited"), dict):
            return None  # attachments unfurled: nobody edited anything
        channel = field_of(event, "channel", SLACK_ID)
        inner = {**message, "channel": channel, "channel_type": event.get("channel_type")}
        inner.pop("subtype", None)
        translated = translate({**body, "event": inner})
        if translated is None:
            return None
        edited_ts = field_of(message["edited"], "ts", SLACK_TS)
        return MessageEdit(dataclasses.replace(
            translated, event_id=f"{event_key(channel, translated.message_id)}@{edited_ts}"),
            edited_at=float(edited_ts))
    if kind == "message" and subtype == "message_deleted":
        channel = field_of(event, "channel", SLACK_ID)
        deleted = field_of(event, "deleted_ts", SLACK_TS)
        previous = event.get("previous_message")
        thread = previous.get("thread_ts") if isinstance(previous, dict) else None
        return MessageDeletion(
            channel=CHANNEL_NAME, chat_id=channel, message_ids=(deleted,),
            thread_id=thread if isinstance(thread, str) and thread != deleted else None,
            event_id=f"delete:{event_key(channel, deleted)}")
    if kind in ("reaction_added", "reaction_removed"):
        item = event.get("item")
        if not isinstance(item, dict) or item.get("type") != "message":
            return None
        user = field_of(event, "user", SLACK_ID)
        if user == bot_user_id:
            return None
        name = field_of(event, "reaction")
        channel, ts = field_of(item, "channel", SLACK_ID), field_of(item, "ts", SLACK_TS)
        added = kind == "reaction_added"
        return ReactionEvent(
            channel=CHANNEL_NAME, chat_id=channel, message_id=ts, user_id=user,
            emoji=EMOJI.get(name.split("::")[0], f":{name}:"), added=added,
            event_id=f"{kind}:{channel}:{ts}:{user}:{name}:{event.get('event_ts', '')}")
    return None


class Reactions:
    """The bot's reactions and press notes, through the Web API and response URLs."""

    def __init__(self, api: SlackApi) -> None:
        self.api = api
        self._mine: dict[tuple[str, str], str] = {}
        """The name of the reaction the bot last put on each message, to replace it."""
        self._quiet_until = 0.0
        """After a 429: no reaction call before this (``time.monotonic()``)."""

    async def react(self, channel: str, ts: str, emoji: str | None, *,
                    replacing: str | None = None) -> bool:
        """Put ``emoji`` in place of the bot's earlier reaction (``None``: remove it;
        ``replacing``: the earlier one if this process did not put it); each call tried
        once, ``False`` if Slack refused or rate-limited it."""
        name = None if emoji is None else emoji_name(emoji)
        if emoji is not None and name is None:
            log.info("Slack: no emoji name known for %r; reaction not set", emoji)
            return False
        if time.monotonic() < self._quiet_until:
            log.debug("Slack: reaction on %s dropped (rate limited)", ts)
            return False
        key = (channel, ts)
        before = self._mine.get(key)
        if before is None and replacing is not None:
            before = emoji_name(replacing)
        try:
            if name is not None and name != before:
                await self._call("reactions.add", channel, ts, name, fine="already_reacted")
            if before is not None and before != name:
                await self._call("reactions.remove", channel, ts, before, fine="no_reaction")
        except SlackApiError as exc:
            code = error_code(exc) or f"HTTP {exc.response.status_code}"
            if exc.response.status_code == 429 or code == "ratelimited":
                self._quiet_until = time.monotonic() + retry_after(exc.response.headers)
            level = log.warning if code == "missing_scope" else log.info
            level("Slack: reaction on %s not set (%s)", ts, code)
            return False
        self._mine.pop(key, None)
        if name is not None:
            self._mine[key] = name
            if len(self._mine) > 4096:
                self._mine.pop(next(iter(self._mine)))
        return True

    async def _call(self, method: str, channel: str, ts: str, name: str, *, fine: str) -> None:
        call = self.api.web.reactions_add if method == "reactions.add" \
            else self.api.web.reactions_remove
        try:
            await self.api.inflight.tracked(call(channel=channel, timestamp=ts, name=name))
        except SlackApiError as exc:
            if error_code(exc) != fine:
                raise

    async def answer(self, press: ButtonPress, note: str | None) -> None:
        """``note`` to the presser alone, through the press's ``response_url``."""
        if note is None or not RESPONSE_URL.fullmatch(press.token):
            return
        webhook = AsyncWebhookClient(press.token, retry_handlers=[], logger=sdk_log)
        try:
            response = await self.api.inflight.tracked(webhook.send(
                text=note, response_type="ephemeral", replace_original=False))
        except Exception as exc:
            log.info("Slack: the note for press %s was not shown (%s)", press.press_id,
                     type(exc).__name__)
            return
        if response.status_code != 200:
            log.info("Slack: the note for press %s was not shown (HTTP %d)", press.press_id,
                     response.status_code)
