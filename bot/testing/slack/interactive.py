"""Block Kit buttons, presses, edits, deletions and reactions in the fake, as Slack has them.

``blocks`` on ``chat.postMessage``/``chat.update`` are checked (an ``actions``
block holds at most 25 elements; a button needs plain-text ``text`` of at most
75 characters, an ``action_id`` unique in the message, a ``value`` of at most
2,000 characters; else ``invalid_blocks``) and kept. A press is a
``block_actions`` payload POSTed form-encoded as ``payload=<JSON>`` and signed,
to the same endpoint as events (or an ``interactive`` Socket Mode envelope).
``reactions.add``/``.remove`` need ``reactions:write`` and answer
``message_not_found``, ``already_reacted``, ``no_reaction`` and ``invalid_name``.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from bot.testing.slack.state import State
from bot.testing.slack.wire import ALICE, APP_ID, Posted

EMOJI_NAMES = frozenset({
    "+1", "thumbsup", "-1", "thumbsdown", "eyes", "white_check_mark", "warning", "heart",
    "tada", "x", "hourglass_flowing_sand", "thinking_face", "rocket", "fire", "pray",
})
"""The emoji names the fake's workspace knows (Slack's standard set, abridged)."""
REACTIONS_SCOPE = "reactions:write"


def blocks_error(blocks: Any) -> str | None:
    """Slack's error for ``blocks`` (given as JSON text or a list), or ``None`` if fine."""
    if isinstance(blocks, str):
        try:
            blocks = json.loads(blocks)
        except ValueError:
            return "invalid_blocks_format"
    if not isinstance(blocks, list) or len(blocks) > 50:
        return "invalid_blocks"
    action_ids: set[str] = set()
    for block in blocks:
        if not isinstance(block, dict):
            return "invalid_blocks"
        if block.get("type") == "section":
            text = block.get("text")
            if not isinstance(text, dict) or not 1 <= len(str(text.get("text") or "")) <= 3000:
                return "invalid_blocks"
        elif block.get("type") == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
                return "invalid_blocks"
            for element in elements:
                if not isinstance(element, dict) or element.get("type") != "button":
                    return "invalid_blocks"
                text = element.get("text")
                action_id = str(element.get("action_id") or "")
                if not isinstance(text, dict) or text.get("type") != "plain_text" \
                        or not 1 <= len(str(text.get("text") or "")) <= 75 \
                        or not action_id or action_id in action_ids \
                        or len(str(element.get("value") or "")) > 2000 \
                        or element.get("style") not in (None, "primary", "danger"):
                    return "invalid_blocks"
                action_ids.add(action_id)
        else:
            return "invalid_blocks"
    return None


def parsed_blocks(blocks: Any) -> list[Any]:
    """``blocks`` as a list (form-encoded calls send it as JSON text)."""
    if isinstance(blocks, str):
        loaded = json.loads(blocks)
        return loaded if isinstance(loaded, list) else []
    return list(blocks) if isinstance(blocks, list) else []


class Interactive:
    """Reactions in the Web API, and the events and payloads people's actions make."""

    def __init__(self, state: State) -> None:
        self.state = state

    # -- Web API ------------------------------------------------------------------

    def _reactable(self, params: dict[str, Any]) -> tuple[tuple[str, str], str] | dict[str, Any]:
        if REACTIONS_SCOPE not in self.state.scopes:
            return {"ok": False, "error": "missing_scope", "needed": REACTIONS_SCOPE,
                    "provided": ",".join(sorted(self.state.scopes))}
        channel, ts = str(params.get("channel") or ""), str(params.get("timestamp") or "")
        posted = self.state.messages.get(ts)
        known = (posted is not None and not posted.deleted and posted.channel == channel) \
            or (channel, ts) in self.state.user_messages
        if not known:
            return {"ok": False, "error": "message_not_found"}
        name = str(params.get("name") or "")
        if name not in EMOJI_NAMES:
            return {"ok": False, "error": "invalid_name"}
        return (channel, ts), name

    def reactions_add(self, params: dict[str, Any]) -> dict[str, Any]:
        found = self._reactable(params)
        if isinstance(found, dict):
            return found
        key, name = found
        mine = self.state.reactions.setdefault(key, [])
        if name in mine:
            return {"ok": False, "error": "already_reacted"}
        mine.append(name)
        return {"ok": True}

    def reactions_remove(self, params: dict[str, Any]) -> dict[str, Any]:
        found = self._reactable(params)
        if isinstance(found, dict):
            return found
        key, name = found
        mine = self.state.reactions.get(key, [])
        if name not in mine:
            return {"ok": False, "error": "no_reaction"}
        mine.remove(name)
        return {"ok": True}

    # -- events people cause ---------------------------------------------------------

    def message_changed(self, original: Mapping[str, Any], text: str, *,
                        unfurl: bool = False) -> dict[str, Any]:
        """The ``message`` event of subtype ``message_changed`` for a user's edit of the
        ``original`` message event (``unfurl``: only attachments changed, no ``edited``)."""
        ts = self.state.next_ts()
        message = {k: v for k, v in original.items()
                   if k not in ("channel", "channel_type", "event_ts")}
        previous = dict(message)
        message["text"] = text
        if unfurl:
            message["text"] = original.get("text", "")
            message["attachments"] = [{"id": 1, "title": "a link", "from_url": "https://x"}]
        else:
            message["edited"] = {"user": original.get("user", ALICE), "ts": ts}
        return {"type": "message", "subtype": "message_changed", "hidden": True,
                "channel": original["channel"], "channel_type": original.get("channel_type"),
                "ts": ts, "event_ts": ts, "message": message, "previous_message": previous}

    def message_deleted(self, original: Mapping[str, Any]) -> dict[str, Any]:
        """The ``message`` event of subtype ``message_deleted`` for ``original``."""
        ts = self.state.next_ts()
        self.state.user_messages.discard((original["channel"], original["ts"]))
        return {"type": "message", "subtype": "message_deleted", "hidden": True,
                "channel": original["channel"], "channel_type": original.get("channel_type"),
                "ts": ts, "event_ts": ts, "deleted_ts": original["ts"],
                "previous_message": {k: v for k, v in original.items()
                                     if k not in ("channel", "channel_type", "event_ts")}}

    def reaction(self, channel: str, ts: str, name: str, *, added: bool = True,
                 user: str = ALICE, item_user: str | None = None) -> dict[str, Any]:
        """A ``reaction_added`` (or ``_removed``) event on the message ``ts``."""
        event_ts = self.state.next_ts()
        return {"type": "reaction_added" if added else "reaction_removed", "user": user,
                "reaction": name, "item_user": item_user or self.state.bot_user_id,
                "item": {"type": "message", "channel": channel, "ts": ts},
                "event_ts": event_ts}

    def block_actions(self, posted: Posted, value: str, *, user: str = ALICE,
                      user_name: str = "alice") -> dict[str, Any]:
        """The ``block_actions`` payload of ``user`` pressing the button whose value is
        ``value`` under the app's message ``posted``."""
        button = next((e for b in posted.blocks if b.get("type") == "actions"
                       for e in b["elements"] if e.get("value") == value), None)
        if button is None:
            raise AssertionError(f"no button with value {value!r} under {posted.ts}")
        block = next(b for b in posted.blocks if b.get("type") == "actions"
                     and button in b["elements"])
        n = next(self.state.ids)
        container = {"type": "message", "message_ts": posted.ts, "channel_id": posted.channel,
                     "is_ephemeral": False}
        message: dict[str, Any] = {"type": "message", "user": self.state.bot_user_id,
                                   "bot_id": self.state.bot_id, "text": posted.text,
                                   "ts": posted.ts, "blocks": posted.blocks}
        if posted.thread_ts:
            container["thread_ts"] = posted.thread_ts
            message["thread_ts"] = posted.thread_ts
        return {
            "type": "block_actions", "api_app_id": APP_ID, "token": "legacy-verification-token",
            "team": {"id": self.state.team_id, "domain": "fake"},
            "user": {"id": user, "username": user_name, "name": user_name,
                     "team_id": self.state.team_id},
            "container": container, "trigger_id": f"trigger.{n}",
            "channel": {"id": posted.channel, "name": "general"}, "message": message,
            "state": {"values": {}}, "response_url": f"{self.state.url}/response/{n}",
            "actions": [{"type": "button", "action_id": button["action_id"],
                         "block_id": block.get("block_id", "b"), "value": value,
                         "text": button["text"], "action_ts": f"{time.time():.6f}"}],
        }


def action_body(payload: Mapping[str, Any]) -> str:
    """An interactivity request body: ``payload=<JSON>``, form-encoded, as Slack sends it."""
    return urllib.parse.urlencode({"payload": json.dumps(payload)})

