"""Approvals on Slack, through the real slack-bolt and slack_sdk against the fake: the
prompt carries Block Kit buttons, a press is a signed ``block_actions`` post to the events
endpoint answered ephemerally through its ``response_url``, and the prompt is updated
(buttons removed) to show the outcome."""

from __future__ import annotations

from typing import Any

from bot.app.roost import Roost
from bot.testing.app import scripted, settle
from bot.testing.slack import BOB, FakeSlack
from bot.testing.slack import fake_slack as _fake_slack  # noqa: F401  (the fixture)
from bot.testing.slack.wire import Posted
from channels.delivery import DeliveryPolicy
from channels.slack import SlackChannel
from tests.conftest import AppFactory
from tests.test_approvals import APPROVE_TOUCH, Touch, resumed, touching

FAST = DeliveryPolicy(attempts=3, base_delay=0.02, max_delay=0.1)


async def started(make_app: AppFactory, fake: FakeSlack, touch: Touch,
                  turns: list[dict[str, Any]], **settings: Any) -> Roost:
    app, _, _ = await make_app(scripted(*turns), touch, agents=APPROVE_TOUCH,
                               **fake.settings(), **settings)
    channel = SlackChannel(app.settings, host="127.0.0.1", policy=FAST)
    await app.add_channel(channel)
    fake.events_url = channel.events_url
    return app


async def prompt_of(fake: FakeSlack) -> tuple[Posted, dict[str, str]]:
    """The approval prompt and its buttons' values by label, once posted."""
    await fake.wait_for("chat.postMessage")
    [posted] = [p for p in fake.messages.values()
                if any(b["type"] == "actions" for b in p.blocks)]
    values = {e["text"]["text"]: e["value"] for b in posted.blocks if b["type"] == "actions"
              for e in b["elements"]}
    return posted, values


async def test_only_the_requester_decides_once_and_the_prompt_shows_the_outcome(
        make_app: AppFactory, fake_slack: FakeSlack) -> None:
    touch = Touch()
    app = await started(make_app, fake_slack, touch, [touching("/srv/s", "done")])
    await fake_slack.post_event(fake_slack.message(fake_slack.mention("touch it")))
    posted, values = await prompt_of(fake_slack)
    assert "/srv/s" in posted.text and list(values) == [
        "Approve", "Deny", "Approve for this session"]
    bob = await fake_slack.post_action(fake_slack.block_actions(
        posted, values["Approve"], user=BOB, user_name="bob"))
    assert bob.status == 200
    [note] = await fake_slack.wait_for_responses(1)
    assert note.body["text"] == "Not yours to approve." and touch.ran == []
    assert note.body["response_type"] == "ephemeral"
    # Pressed on a client that has not seen the decision yet: built while the buttons show.
    stale = fake_slack.block_actions(posted, values["Deny"])
    await fake_slack.post_action(fake_slack.block_actions(posted, values["Approve"]))
    await settle(app)
    assert touch.ran == ["/srv/s"]
    assert (await fake_slack.wait_for_responses(2))[1].body["text"] == "Approved."
    assert posted.text.startswith("Approved by alice")
    assert not any(b["type"] == "actions" for b in posted.blocks)
    await fake_slack.post_action(stale)
    third = (await fake_slack.wait_for_responses(3))[2]
    assert third.body["text"].startswith("Already decided: Approved by alice")
    assert touch.ran == ["/srv/s"]


async def test_a_press_after_a_restart_resumes_the_run_without_asking_again(
        make_app: AppFactory, fake_slack: FakeSlack) -> None:
    first = Touch()
    app = await started(make_app, fake_slack, first, [touching("/srv/r", "first life")])
    await fake_slack.post_event(fake_slack.message(fake_slack.mention("touch it")))
    posted, values = await prompt_of(fake_slack)
    await app.close()  # stopped at the pause: the question stays open
    second = Touch()
    again = await started(make_app, fake_slack, second, [{"reply": "after restart"}])
    await again.recover()
    await resumed(again)  # the run is back at its pause before the press comes
    assert (await fake_slack.post_action(fake_slack.block_actions(
        posted, values["Approve"]))).status == 200
    await settle(again)
    assert first.ran == [] and second.ran == ["/srv/r"]
    assert (await fake_slack.wait_for_responses(1))[0].body["text"] == "Approved."
    assert posted.text.startswith("Approved by alice")
    prompts = [p for p in fake_slack.messages.values() if p.text.startswith("Approval needed")]
    assert prompts == []  # the one prompt now shows the outcome; none was sent again
    assert [p.text for p in fake_slack.messages.values()][-1] == "after restart"


async def test_a_prompt_deleted_meanwhile_gets_its_outcome_as_a_new_message(
        make_app: AppFactory, fake_slack: FakeSlack) -> None:
    touch = Touch()
    app = await started(make_app, fake_slack, touch, [touching(reply="nobody answered")],
                        approval_timeout=0.3)
    await fake_slack.post_event(fake_slack.message(fake_slack.mention("touch it")))
    posted, _ = await prompt_of(fake_slack)
    posted.deleted = True  # someone deleted the prompt: chat.update says message_not_found
    await settle(app)
    assert fake_slack.calls_of("chat.update")[-1].error == "message_not_found"
    texts = [p.text for p in fake_slack.messages.values() if not p.deleted]
    assert texts[0].startswith("Denied (no answer in time) by nobody")
    assert texts[-1] == "nobody answered" and touch.ran == []
