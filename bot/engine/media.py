"""Media in a run: the intake before the model is asked, images in the history.

:func:`receive_files` runs the intake (:mod:`bot.media.intake`) for a run's message
through the message's channel, with the transcriber a plugin offers;
:func:`drop_images` keeps a long photo conversation inside the window by
replacing old images (oldest first) with a one-line note.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bot.config.settings import Settings
from bot.contracts.channel import Channel
from bot.contracts.llm import ChatMessage, ContentPart
from bot.contracts.media import Transcriber
from bot.contracts.messages import InboundMessage
from bot.media.intake import Received, receive
from bot.pluginhost.manager import PluginHost

log = logging.getLogger("roost.engine.media")

MAX_CONTEXT_IMAGES = 20
"""Images (and documents) sent with one request at most, newest kept. Anthropic takes up
to 100 per request but lowers the size it accepts past 20; every image costs up to
~1,600 tokens on every later turn."""


async def transcriber_of(host: PluginHost, settings: Settings) -> Transcriber | None:
    """The first transcriber a plugin offers through ``roost_transcriber``, if any."""
    offered = await host.hooks.roost_transcriber(settings=settings)
    return offered[0] if offered else None


async def receive_files(message: InboundMessage, workspace: Path,
                        channels: Mapping[str, Channel], host: PluginHost,
                        settings: Settings) -> Received:
    """Fetch ``message``'s attachments through its channel and store them in ``workspace``
    (the sender's): what was stored, and the notices for what was not."""
    channel = channels.get(message.channel)

    async def find() -> Transcriber | None:
        # Asked only once an audio file turned up (by its bytes, whatever it was sent as).
        return await transcriber_of(host, settings)

    started = time.monotonic()
    received = await receive(message, workspace,
                             channel.download if channel is not None else None, settings,
                             find_transcriber=find)
    log.info("%s:%s sent %d file(s): %d stored, %d notice(s), %.0f ms", message.channel,
             message.sender_id, len(message.attachments), len(received.stored),
             len(received.notices), (time.monotonic() - started) * 1000)
    return received


def with_lines(text: str, received: Received) -> str:
    """The user's text followed by one line per received file (just the lines if no text)."""
    lines = received.text
    if not lines:
        return text
    return f"{text}\n\n{lines}" if text.strip() else lines


def removed_note(part: ContentPart, why: str = "removed from context") -> str:
    """``[image: inbox/2026-11-23/photo-1.jpg — removed from context]``."""
    return f"[{part.kind}: {part.path} — {why}]"


def without_parts(message: ChatMessage, parts: Sequence[ContentPart],
                  why: str = "removed from context") -> ChatMessage:
    """A copy of ``message`` with ``parts`` replaced by notes at the end of its text."""
    keep = tuple(p for p in message.parts if p not in parts)
    notes = "\n".join(removed_note(p, why) for p in message.parts if p in parts)
    content = f"{message.content}\n{notes}" if message.content else notes
    return dataclasses.replace(message, content=content, parts=keep)


def text_only(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with every image and document replaced by its one-line note.

    For runs that only need the words, such as a memory flush: sending the
    conversation's photos again would cost ~1,600 tokens each and tell it
    nothing the lines describing them do not.
    """
    return [without_parts(m, m.parts) if m.parts else m for m in messages]


def drop_images(messages: Sequence[ChatMessage],
                ratio: Callable[[Sequence[ChatMessage]], float], soft_ratio: float,
                max_parts: int = MAX_CONTEXT_IMAGES,
                exists: Callable[[ContentPart], bool] | None = None) -> list[ChatMessage]:
    """History with old images and documents replaced by notes where needed.

    A part whose file is gone becomes ``[image: … — file no longer available]``;
    beyond the newest ``max_parts``, older ones go; then, while ``ratio``
    says the history fills at least ``soft_ratio`` of the window, the oldest
    remaining ones go too, one at a time (images first: the costliest thing in
    a photo conversation, and replaced before any text is pruned). Messages
    are copied, never changed (the same objects live in the session).
    """
    out = list(messages)
    located = [(i, p) for i, m in enumerate(out) for p in m.parts]
    if not located:
        return out
    check = exists or (lambda p: p.file.is_file())
    gone = [(i, p) for i, p in located if not check(p)]
    for i, p in gone:
        out[i] = without_parts(out[i], (p,), "file no longer available")
    located = [(i, p) for i, p in located if (i, p) not in gone]
    surplus = len(located) - max_parts
    for i, p in located[:max(0, surplus)]:
        out[i] = without_parts(out[i], (p,))
    located = located[max(0, surplus):]
    if not located or ratio(out) < soft_ratio:
        return out
    for i, p in located:
        out[i] = without_parts(out[i], (p,))
        if ratio(out) < soft_ratio:
            break
    return out


def part_lines(message: ChatMessage) -> str:
    """What a message's parts were, as text (compaction transcripts, text-only models)."""
    return "\n".join(f"[{p.kind}: {p.path}]" for p in message.parts)
