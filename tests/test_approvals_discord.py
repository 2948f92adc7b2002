"""Approvals on Discord, through the real discord.py against the fake: the prompt carries
message components, a press is an interaction acknowledged at once and answered with an
ephemeral follow-up, and the prompt is edited (components removed) to show the outcome."""

from __future__ import annotations

from typing import Any

from bot.app.roost import Roost
from bot.testing.app import settle
from bot.testing.discord import CHANNEL_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.discord.wire import FakeMessage
from channels.delivery import DeliveryPolicy
from channels.discord import DiscordChannel
from tests.conftest import AppFactory
from tests.test_approvals import APPROVE_TOUCH, Touch, resumed, touching

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)
MESSAGES = r"/channels/\d+/messages$"


async def started(make_app: AppFactory, fake: FakeDiscord, touch: Touch,
                  turns: list[dict[str, Any]], **settings: Any) -> Roost:
    from bot.testing.app import scripted

    app, _, _ = await make_app(scripted(*turns), touch, agents=APPROVE_TOUCH,
                               **fake.settings(), **settings)
    await app.add_channel(DiscordChannel(app.settings, guild_ready_timeout=0.05,
                                         delivery=FAST))
    return app


async def prompt_of(fake: FakeDiscord) -> tuple[FakeMessage, dict[str, str]]:
    """The approval prompt and its buttons' custom ids by label, once posted."""
    await fake.wait_for_call("POST", MESSAGES)
    [message] = [m for m in fake.messages.values() if m.components]
    ids = {b["label"]: b["custom_id"] for row in message.components
           for b in row["components"]}
    return message, ids


async def test_only_the_requester_decides_once_and_the_prompt_shows_the_outcome(
        make_app: AppFactory, fake_discord: FakeDiscord) -> None:
    touch = Touch()
    app = await started(make_app, fake_discord, touch, [touching("/srv/d", "done")])
    await fake_discord.guild_message("touch it", mention=True)
    message, ids = await prompt_of(fake_discord)
    assert "/srv/d" in message.content and list(ids) == [
        "Approve", "Deny", "Approve for this session"]
    other = await fake_discord.press(message, ids["Approve"], user_id=5001)
    await fake_discord.wait_for_call("POST", rf"/webhooks/\d+/{other.token}")
    assert [f["content"] for f in other.followups] == ["Not yours to approve."]
    assert touch.ran == []
    mine = await fake_discord.press(message, ids["Approve"])
    await settle(app)
    assert touch.ran == ["/srv/d"]
    assert [f["content"] for f in mine.followups] == ["Approved."]
    assert all(int(f["flags"]) & 64 for f in other.followups + mine.followups)
    assert message.content.startswith("Approved by") and message.components == []
    again = await fake_discord.press(message, ids["Deny"])
    await fake_discord.wait_for_call("POST", rf"/webhooks/\d+/{again.token}")
    assert again.followups[0]["content"].startswith("Already decided: Approved by")
    assert touch.ran == ["/srv/d"]
    assert fake_discord.visible(CHANNEL_ID)[-1] == "done"


async def test_a_press_after_a_restart_resumes_the_run_even_acknowledged_too_late(
        make_app: AppFactory, fake_discord: FakeDiscord) -> None:
    first = Touch()
    app = await started(make_app, fake_discord, first, [touching("/srv/r", "first life")])
    await fake_discord.guild_message("touch it", mention=True)
    message, ids = await prompt_of(fake_discord)
    await app.close()  # stopped at the pause: the question stays open
    second = Touch()
    again = await started(make_app, fake_discord, second, [{"reply": "after restart"}])
    await again.recover()
    await resumed(again)  # the run is back at its pause before the press comes
    # The new process is slow to acknowledge: Discord refuses the callback (10062) and
    # the person sees "This interaction failed", but the press was handed in.
    fake_discord.ack_within = 0.0
    late = await fake_discord.press(message, ids["Approve"])
    await settle(again)
    assert first.ran == [] and second.ran == ["/srv/r"]  # once, after the decision
    assert late.acknowledged == 0 and late.followups == []
    assert message.content.startswith("Approved by") and message.components == []
    assert [m for m in fake_discord.messages.values()
            if m.content.startswith(("Approval needed", "Approved"))] == [message]  # asked once
    assert fake_discord.visible(CHANNEL_ID)[-1] == "after restart"
