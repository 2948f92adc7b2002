"""Telegram sends whose outcome is unknown are found out, not guessed.

The real aiogram against the fake Bot API, whose message ids run in sequence per
chat (shared with the people in it) and whose ``editMessageText`` answers as
Telegram does ("message is not modified", "message to edit not found", "message
can't be edited"). The last test kills a real ``roost run`` with SIGKILL between
Telegram taking a reply and Roost recording it.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bot.contracts.channel import sending_mark
from bot.contracts.messages import OutboundFile, OutboundMessage
from bot.testing.chaos import ChaosConfig, ChaosRun
from bot.testing.telegram import BOB, Call, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import Transient
from channels.telegram import TelegramChannel
from channels.telegram.sender import MAX_TEXT
from tests.media_samples import png
from tests.roost_processes import forked_run
from tests.test_telegram_intake import FAST, Inbox, StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)

GROUP = -1001234567890


def reply(text: str, chat: int = 42, **kwargs: Any) -> OutboundMessage:
    return OutboundMessage(channel="telegram", chat_id=str(chat), text=text, **kwargs)


async def talking(start_tg: StartTg, fake: FakeTelegram, *,
                  group: bool = False) -> tuple[TelegramChannel, int]:
    """A started channel that has received one message in the chat (so it knows an id),
    and that message's id."""
    tg = await start_tg(Inbox())
    update = fake.group_message("hello") if group else fake.private_message("hello")
    await fake.wait_confirmed(update["update_id"])
    return tg, update["message"]["message_id"]


def probes(fake: FakeTelegram) -> list[str]:
    """What each probe (an edit of a message the channel does not know) was answered."""
    return [c.error or "edited" for c in fake.calls_of("editMessageText")]


async def test_a_send_reset_after_telegram_took_it_is_found_and_not_sent_again(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg, _ = await talking(start_tg, fake_telegram)
    fake_telegram.fail("sendMessage", kind="reset_after")
    sent = await tg.send(reply("only **once**"))
    assert fake_telegram.visible(42) == ["only once"]
    [posted] = fake_telegram.calls_of("sendMessage")
    assert posted.fault == "reset_after"
    assert sent == str(posted.result["message_id"])
    # Found by an edit to the very same text: a no-op that proves the message is there.
    [probe] = fake_telegram.calls_of("editMessageText")
    assert "message is not modified" in probe.error
    assert (probe.params["text"], probe.params["parse_mode"]) == \
        (posted.params["text"], posted.params["parse_mode"])


async def test_a_send_reset_before_telegram_took_it_is_sent_again_exactly_once(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg, _ = await talking(start_tg, fake_telegram)
    await tg.send(reply("ok"))  # the same text, earlier: must not be taken for the lost one

    def someone_writes(call: Call) -> None:
        if call.method == "sendMessage":
            fake_telegram.on_call = None
            # Alice writes while the send is lost: her message takes the next id.
            fake_telegram.private_message("are you there?")

    fake_telegram.fail("sendMessage", kind="reset_before")
    fake_telegram.on_call = someone_writes
    await tg.send(reply("ok"))
    assert fake_telegram.visible(42) == ["ok", "ok"]
    assert [c.fault for c in fake_telegram.calls_of("sendMessage")] == \
        ["", "reset_before", ""]
    # Alice's message (unless the channel received it first) is not ours; the ids after
    # it were never used: not posted. The earlier "ok" is known, so never probed.
    *others, unused, again = probes(fake_telegram)
    assert others in ([], ["Bad Request: message can't be edited"])
    assert unused == again == "Bad Request: message to edit not found"


async def test_in_a_group_the_probe_steps_over_other_members_messages(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg, _ = await talking(start_tg, fake_telegram, group=True)

    def the_group_talks(call: Call) -> None:
        if call.method == "sendMessage":
            fake_telegram.on_call = None
            for n in range(3):  # posted before the reply takes its id
                fake_telegram.group_message(f"chatter {n}", sender=BOB)

    fake_telegram.fail("sendMessage", kind="reset_after")
    fake_telegram.on_call = the_group_talks
    await tg.send(reply("answer", chat=GROUP))
    assert fake_telegram.visible(GROUP) == ["answer"]
    assert len(fake_telegram.calls_of("sendMessage")) == 1
    # Bob's messages are stepped over (or skipped, once the channel received them).
    *others, found = probes(fake_telegram)
    assert set(others) <= {"Bad Request: message can't be edited"}
    assert "message is not modified" in found


async def test_a_photo_and_a_document_whose_answers_were_lost_are_found_by_their_captions(
        start_tg: StartTg, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    tg, _ = await talking(start_tg, fake_telegram)
    picture, notes = tmp_path / "a.png", tmp_path / "notes.txt"
    picture.write_bytes(png(40, 30))
    notes.write_bytes(b"plain text")
    fake_telegram.fail("sendPhoto", kind="reset_after")
    fake_telegram.fail("sendDocument", kind="reset_after")
    await tg.send(reply("", files=(
        OutboundFile(str(picture), "a.png", "image/png", picture.stat().st_size, "the plot"),
        OutboundFile(str(notes), "notes.txt", "text/plain", 10))))
    assert [(u.method, u.caption) for u in fake_telegram.uploads] == \
        [("photo", "the plot"), ("document", None)]
    assert len(fake_telegram.calls_of("sendPhoto")) == 1
    assert len(fake_telegram.calls_of("sendDocument")) == 1
    # Each found by an edit to its own caption (none for the document): a no-op.
    answers = [c.error for c in fake_telegram.calls_of("editMessageCaption")]
    assert len(answers) == 2 and all("message is not modified" in a for a in answers)


async def test_a_reply_whose_last_attempt_lost_its_answer_is_found_not_failed(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    # Each lost answer is found out before the next attempt, the last one's too.
    tg, _ = await talking(start_tg, fake_telegram)
    fake_telegram.fail("sendMessage", kind="reset_before", times=FAST.attempts - 1)
    fake_telegram.fail("sendMessage", kind="reset_after")
    sent = await tg.send(reply("persistent"))
    assert fake_telegram.visible(42) == ["persistent"]
    calls = fake_telegram.calls_of("sendMessage")
    assert len(calls) == FAST.attempts
    assert sent == str(calls[-1].result["message_id"])


async def test_a_redelivery_posts_only_the_pieces_an_earlier_attempt_did_not(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    # As after a restart: a new channel, and the floor the first attempt noted.
    first, floor = await talking(start_tg, fake_telegram)
    text = "a" * MAX_TEXT + " " + "b" * 100
    posted = 0

    def die_after_the_first_piece(call: Call) -> None:
        nonlocal posted
        if call.method == "sendMessage":
            posted += 1
            if posted == 2:
                fake_telegram.fail("sendMessage", 403)  # the process "dies" here

    fake_telegram.on_call = die_after_the_first_piece
    with pytest.raises(Exception, match="blocked"):
        await first.send(reply(text))
    fake_telegram.on_call = None
    await first.stop()
    again = await start_tg(Inbox())
    await again.send(reply(text, redelivery=True, attempt_note=str(floor)))
    first_piece, second_piece = fake_telegram.visible(42)
    assert first_piece.startswith("aaa") and second_piece.endswith("bbb")


@pytest.mark.e2e
async def test_a_kill_9_between_telegram_taking_a_reply_and_its_mark_leaves_one_copy(
        tmp_path: Path) -> None:
    run = ChaosRun(tmp_path, ChaosConfig(users=1, kills=0), spawn=forked_run)
    telegram = run.telegram
    async with telegram, run.model:
        proc = await run.spawn(0)
        try:
            telegram.fail("sendMessage", kind="hold_after", seconds=120)
            run.say(0, "plain")
            # Telegram took the reply; its answer is held until the process is gone.
            await telegram.wait_until(run.all_answered, limit=60)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            proc = await run.spawn(1)

            def outbox_settled() -> bool:
                db = sqlite3.connect(tmp_path / "data" / "roost.db")
                try:
                    return db.execute("SELECT count(*) FROM outbox WHERE state = 'pending'"
                                      ).fetchone()[0] == 0
                finally:
                    db.close()

            async with asyncio.timeout(60):  # a hang guard, not a measurement
                while not outbox_settled():  # noqa: ASYNC110 (another process's database)
                    await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    report = run.count()
    assert report.answered == 1
    assert report.duplicated == []
    assert telegram.visible(5000)[-1].startswith("ok #1")


async def test_a_reply_found_not_to_have_arrived_at_all_takes_its_mark_and_note_back(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    # Its note must not outlive it: other messages posted before its redelivery would sit
    # above the noted id, where a probe for it could mistake one of them for it.
    tg, hello = await talking(start_tg, fake_telegram)
    marks: list[tuple[bool, str | None]] = []

    class Mark:
        async def record(self, on: bool, note: str | None = None) -> None:
            marks.append((on, note))

    fake_telegram.fail("sendMessage", kind="reset_before", times=FAST.attempts)
    with sending_mark(Mark()), pytest.raises(Transient):
        await tg.send(reply("never arrived"))
    assert marks == [(True, str(hello)), (False, None)]
    assert fake_telegram.visible(42) == []


async def test_a_piece_found_after_all_keeps_the_mark_when_a_later_piece_is_refused(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    tg, _ = await talking(start_tg, fake_telegram)
    marks: list[bool] = []

    class Mark:
        async def record(self, on: bool, note: str | None = None) -> None:
            marks.append(on)

    pieces = 0

    def refuse_the_second(call: Call) -> None:
        nonlocal pieces
        if call.method == "sendMessage":
            pieces += 1
            if pieces == 2:
                fake_telegram.fail("sendMessage", 403)

    fake_telegram.fail("sendMessage", kind="reset_after")
    fake_telegram.on_call = refuse_the_second
    with sending_mark(Mark()), pytest.raises(Exception, match="blocked"):
        await tg.send(reply("a" * MAX_TEXT + " " + "b" * 10))
    assert len(fake_telegram.visible(42)) == 1  # the first piece is on screen
    assert marks == [True]  # so the reply stays marked: at most once holds


async def test_two_replies_to_one_chat_do_not_interleave_their_pieces(
        start_tg: StartTg, fake_telegram: FakeTelegram) -> None:
    # Nothing lands between a reply's pieces: after a restart, what sits above its note
    # is its own pieces (and people's messages), never another of Roost's.
    tg, _ = await talking(start_tg, fake_telegram)
    first, second = "a" * MAX_TEXT + " " + "A" * 10, "b" * MAX_TEXT + " " + "B" * 10
    await asyncio.gather(tg.send(reply(first)), tg.send(reply(second)))
    shown = [text[-1] for text in fake_telegram.visible(42)]
    assert shown in (["a", "A", "b", "B"], ["b", "B", "a", "A"]), shown
