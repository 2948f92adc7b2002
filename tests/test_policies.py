"""DM and group policies, and un-addressed group messages as context."""

from __future__ import annotations

from bot.testing.app import scripted, settle
from tests.conftest import AppFactory


async def test_in_mention_mode_only_addressed_group_messages_run(make_app: AppFactory) -> None:
    provider = scripted({"reply": "hi"}, loop=True)
    app, channel, _ = await make_app(provider)
    group = {"group": "g"}
    await channel.say("lunch at noon?", sender="a", name="Ann", mentioned=False, **group)
    await channel.say("pizza please", sender="b", name="Bob", mentioned=False, **group)
    await settle(app)
    assert provider.requests == [] and channel.sent == []
    await channel.say("@bot what did we decide?", sender="a", name="Ann", **group)
    await settle(app)
    assert len(provider.requests) == 1
    # Read after the conversation (the request's note): the system prompt stays cacheable.
    note = provider.requests[0].note
    assert "[Ann (id a)]: lunch at noon?" in note and "[Bob (id b)]: pizza please" in note
    assert "lunch at noon?" not in provider.requests[0].system
    await channel.say("@bot and now?", sender="a", **group)
    await settle(app)
    assert "lunch at noon?" not in provider.requests[1].note  # handed over once


async def test_group_context_is_capped(make_app: AppFactory) -> None:
    provider = scripted({"reply": "hi"}, loop=True)
    app, channel, _ = await make_app(provider, group_context_messages=3)
    for i in range(6):
        await channel.say(f"chatter {i}", group="g", mentioned=False)
    await channel.say("@bot hi", group="g")
    await settle(app)
    note = provider.requests[0].note
    assert "chatter 2" not in note and all(f"chatter {i}" in note for i in (3, 4, 5))


async def test_group_chatter_is_capped_by_tokens_newest_whole_messages_kept(
        make_app: AppFactory) -> None:
    provider = scripted({"reply": "hi"}, loop=True)
    app, channel, _ = await make_app(provider)  # group_context_tokens: 2,000 by default
    for i in range(50):  # one member posting long messages: each is cut at 2,000 characters
        await channel.say(f"msg{i:02d} " + "x" * 3_000, sender="a", name="Ann", group="g",
                          mentioned=False)
    await channel.say("@bot sum it up", group="g")
    await settle(app)
    note = provider.requests[0].note
    chatter = [line for line in note.splitlines() if line.startswith("[Ann (id a)]: ")]
    # ~504 tokens a line (ratio 4): the newest three fit in 2,000, a fourth would not.
    assert [line[14:19] for line in chatter] == ["msg47", "msg48", "msg49"]
    assert all(line == f"[Ann (id a)]: msg{i} " + "x" * 1_994 for i, line in
               zip((47, 48, 49), chatter, strict=True))
    assert "(47 earlier message(s) left out" in note
    assert sum(app.engine.estimator_for("scripted").text(line) for line in chatter) <= 2_000


async def test_the_newest_chatter_alone_over_the_cap_is_cut_to_it(make_app: AppFactory) -> None:
    provider = scripted({"reply": "hi"}, loop=True)
    app, channel, _ = await make_app(provider, group_context_tokens=50)
    await channel.say("older", sender="b", name="Bob", group="g", mentioned=False)
    await channel.say("newest " + "y" * 1_000, sender="a", name="Ann", group="g",
                      mentioned=False)
    await channel.say("@bot hi", group="g")
    await settle(app)
    note = provider.requests[0].note
    assert "older" not in note and "(1 earlier message(s) left out" in note
    line = next(line for line in note.splitlines() if line.startswith("[Ann (id a)]: newest"))
    assert 0 < app.engine.estimator_for("scripted").text(line) <= 50


async def test_commands_work_in_groups_without_a_mention(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "x"}))
    await channel.say("/whoami", group="g", mentioned=False)
    await settle(app)
    assert "group chat g" in channel.replies[0]


async def test_all_and_off_group_policies_per_channel_and_per_group(
    make_app: AppFactory,
) -> None:
    provider = scripted({"reply": "{message}"}, loop=True)
    app, channel, _ = await make_app(provider, group_policy="all",
                                     group_policies={"test:quiet": "off"},
                                     admins=["test:boss"])
    await channel.say("anyone?", group="loud", mentioned=False)
    await channel.say("@bot hello?", group="quiet")
    await channel.say("/whoami", sender="pleb", group="quiet")
    await channel.say("/whoami", sender="boss", group="quiet")
    await settle(app)
    texts = channel.replies
    assert "[u1 (id u1)]: anyone?" in texts
    assert len(texts) == 2 and any("id boss" in t for t in texts)


async def test_dm_policies_allowlist_and_disabled(make_app: AppFactory) -> None:
    provider = scripted({"reply": "ok"}, loop=True)
    app, channel, _ = await make_app(provider, dm_policy="allowlist",
                                     dm_allowlist=["test:friend"], admins=["test:boss"],
                                     dm_policies={"other": "disabled"})
    await channel.say("hi", sender="stranger")
    await channel.say("hi", sender="friend")
    await channel.say("hi", sender="boss")
    await settle(app)
    assert len(provider.requests) == 2
    assert [r.messages[-1].sender_id for r in provider.requests] in (
        ["friend", "boss"], ["boss", "friend"])
