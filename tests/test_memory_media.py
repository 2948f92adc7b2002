"""The scheduled memory flush sees a conversation's photos as their text notes, never as
images: it only needs the words (through the Anthropic SDK to the fake Messages API)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from bot.testing.anthropic import FakeAnthropic
from bot.testing.app import create_app, scripted
from bot.testing.media import FileChat
from plugins.memory import MemoryFlushJob
from tests.media_samples import jpeg
from tests.provider_helpers import ANTHROPIC_KEY

WINDOW = 6 * 3600.0
FLUSH = {"match": "^Pre-compaction memory flush", "reply": "NO_REPLY"}
SUMMARY = {"match": r"^(\[Earlier summary\]|user: )", "reply": "A photo, then two turns."}


async def test_the_scheduled_flush_sends_the_note_of_a_photo_not_the_photo(
    tmp_path: Path,
) -> None:
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        fake.reply_text("A receipt.")
        fake.reply_text("NO_REPLY")
        app, recorder = await create_app(
            None, data_dir=tmp_path, provider="anthropic", anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=fake.base_url, plugins={"plugins.memory": {"flush_min_messages": 2}})
        chat = FileChat()
        try:
            await chat.attach(app, recorder)
            photo = chat.add_file("photo-1.jpg", jpeg(800, 600), "photo",
                                  mime_type="image/jpeg")
            await chat.say_with("what is this?", photo)
            await chat.settle()
            # An hour into the next flush window: the conversation is idle by then.
            later = (math.floor(time.time() / WINDOW) + 1) * WINDOW + 3600
            job = MemoryFlushJob(app.settings, lambda: later)
            flushed = await job.flush_due(app.runtime)
        finally:
            await app.close()

    assert flushed == ["default:console:direct:user"]
    chat_turn, flush = fake.requests
    assert any(b.get("type") == "image" for b in chat_turn.body["messages"][0]["content"])
    blocks = [b for m in flush.body["messages"] if isinstance(m["content"], list)
              for b in m["content"]]
    assert blocks and all(b["type"] == "text" for b in blocks)
    texts = "\n".join(b["text"] for b in blocks)
    assert "[image: inbox/" in texts and "photo-1.jpg — removed from context]" in texts
    assert "Scheduled memory flush" in texts


async def test_the_pre_compaction_flush_sends_the_note_of_a_photo_not_the_photo(
    tmp_path: Path,
) -> None:
    provider = scripted(FLUSH, SUMMARY, {"reply": "ack {message}"}, loop=True)
    app, recorder = await create_app(provider, data_dir=tmp_path, compact_min_messages=5,
                                     compact_keep_messages=4)
    chat = FileChat()
    try:
        await chat.attach(app, recorder)
        photo = chat.add_file("photo-1.jpg", jpeg(800, 600), "photo", mime_type="image/jpeg")
        await chat.say_with("what is this?", photo)
        for text in ("turn two", "turn three"):
            await chat.settle()
            await chat.say_with(text)
        await chat.settle()
        await app.engine.compactor.wait()
    finally:
        await app.close()

    first = provider.requests[0].messages[-1]
    assert first.parts and first.parts[0].kind == "image"  # the chat turn saw the photo
    flush = next(r for r in provider.requests
                 if r.messages[-1].content.startswith("Pre-compaction"))
    assert all(not m.parts for m in flush.messages)
    assert "photo-1.jpg — removed from context]" in flush.messages[0].content
