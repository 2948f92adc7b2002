"""The Matrix channel against a real Synapse, with real matrix-nio clients as the people.

The core runs in process with a scripted model; the homeserver is one Synapse for the
whole session (tests/matrix_server.py), each test with users of its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import nio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.app.roost import Roost
from bot.testing.app import scripted, settle
from plugins.matrix import MatrixConfig
from plugins.matrix.channel import MatrixChannel
from plugins.matrix.render import EVENT_LIMIT, pieces
from plugins.scripted_provider import ScriptedProvider
from roost import Attachment, MediaTooLarge, OutboundFile, OutboundMessage
from roost.channels import DeliveryPolicy, MessageEdit, ReactionEvent
from tests.conftest import AppFactory
from tests.matrix_server import Synapse, User, from_bot

FAST = DeliveryPolicy(attempts=4, base_delay=0.05, max_delay=0.2)


class Bot:
    """The Roost app with the Matrix channel, its account, and the people in the test."""

    def __init__(self, app: Roost, channel: MatrixChannel, account: User) -> None:
        self.app, self.channel, self.account = app, channel, account
        self.id = account.user_id


@pytest.fixture
async def people(synapse: Synapse) -> AsyncIterator[list[User]]:
    users: list[User] = []
    yield users
    for user in users:
        await user.close()


async def person(synapse: Synapse, people: list[User], name: str | None = None) -> User:
    user = await synapse.register(displayname=name)
    people.append(user)
    return user


async def start(make_app: AppFactory, synapse: Synapse, people: list[User],
                provider: ScriptedProvider, *, stream: bool = False,
                password: bool = False, account: User | None = None,
                table: dict[str, Any] | None = None, **settings: Any) -> Bot:
    """The app with a Matrix channel logged in as a new account named Roosty."""
    account = account or await person(synapse, people, "Roosty")
    table = {"homeserver": synapse.url, "user_id": account.user_id, "sync_timeout": 2.0,
             "edit_interval": 0.05, **(table or {})}
    if password:
        table["password"] = account.password
    else:
        table["access_token"] = account.token
    settings.setdefault("dm_policy", "open")
    app, _, _ = await make_app(provider, stream_replies=stream, merge_window_ms=0,
                               plugins={"plugins.matrix": table}, **settings)
    channel = MatrixChannel(app.settings, MatrixConfig.model_validate(table), policy=FAST,
                            timeout=10)
    await app.add_channel(channel)
    await channel.sync.wait_batches(1)
    return Bot(app, channel, account)


async def dm(user: User, bot: Bot) -> str:
    """A direct room of ``user`` and the bot, once the bot joined it."""
    room = await user.dm(bot.id)
    await joined(bot, room)
    return room


async def joined(bot: Bot, room: str) -> None:
    async with asyncio.timeout(20):  # a hang guard
        while room not in bot.channel.api.client.rooms:
            await bot.channel.sync.wait_batches(bot.channel.sync.batches + 1)


async def group_of_three(synapse: Synapse, people: list[User],
                         bot: Bot) -> tuple[User, User, str]:
    """Alice, Bob and a room Alice made with Bob and the bot invited (three: a group, not a
    DM), once the bot joined it."""
    alice = await person(synapse, people, "Alice")
    bob = await person(synapse, people, "Bob")
    room = await alice.group(bot.id, bob.user_id)
    await joined(bot, room)
    return alice, bob, room


def text_of(event: dict[str, Any]) -> str:
    return str(event["content"].get("body", ""))


# -- conversations ------------------------------------------------------------------------


async def test_a_dm_is_answered_with_markdown_rendered_to_html(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "Hi **there** & <b>welcome</b>"})
    bot = await start(make_app, synapse, people, provider)
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    await alice.say(room, "hello")

    [reply] = await alice.wait_for(room, from_bot(bot.id))
    content = reply["content"]
    assert content["body"] == "Hi **there** & <b>welcome</b>"
    assert content["format"] == "org.matrix.custom.html"
    assert content["formatted_body"] == \
        "<p>Hi <strong>there</strong> &amp; &lt;b&gt;welcome&lt;/b&gt;</p>"
    assert "m.relates_to" not in content  # a DM is answered at the top level
    assert provider.requests[-1].messages[-1].content == "hello"
    session = await bot.app.store.get(f"default:matrix:direct:{alice.user_id}")
    assert session.messages


async def test_a_group_answers_only_mentions_and_replies_to_the_bot_in_place(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "answer to: {message}"}, loop=True)
    bot = await start(make_app, synapse, people, provider)
    alice, bob, room = await group_of_three(synapse, people, bot)
    await bob.join(room)

    await alice.say(room, "just chatting")
    by_name = await alice.say(room, "roosty: what is 1+1?")
    by_id = await bob.say(room, f"{bot.id} hi")
    pill = await alice.say(room, "Roosty", **{
        "format": "org.matrix.custom.html",
        "formatted_body": f'<a href="https://matrix.to/#/{bot.id}">Roosty</a>: pill here',
        "m.mentions": {"user_ids": [bot.id]}})
    replies = await alice.wait_for(room, from_bot(bot.id), count=3)
    # Each is answered in place; bob's and alice's runs may end in either order.
    answered = {r["content"]["m.relates_to"]["m.in_reply_to"]["event_id"]: r for r in replies}
    assert sorted(answered) == sorted([by_name, by_id, pill])
    assert answered[by_name]["content"]["body"].endswith("]: what is 1+1?")  # the mention cut
    # A reply to the bot's message addresses it; one to a person's does not.
    await bob.say(room, "no, I meant you", **{
        "m.relates_to": {"m.in_reply_to": {"event_id": by_name}}})
    follow = await alice.say(room, "and 2+2?", **{
        "m.relates_to": {"m.in_reply_to": {"event_id": answered[by_name]["event_id"]}}})
    replies = await alice.wait_for(room, from_bot(bot.id), count=4)
    await settle(bot.app)
    assert len(provider.requests) == 4
    assert replies[3]["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == follow
    assert replies[3]["content"]["body"].endswith("]: and 2+2?")


async def test_a_thread_is_a_conversation_of_its_own_answered_in_the_thread(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "threaded"}, loop=True)
    bot = await start(make_app, synapse, people, provider)
    alice, _, room = await group_of_three(synapse, people, bot)
    root = await alice.say(room, "a topic")
    await alice.say(room, "roosty, in the thread", **{
        "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                         "m.in_reply_to": {"event_id": root}}})
    [reply] = await alice.wait_for(room, from_bot(bot.id))
    assert reply["content"]["m.relates_to"]["rel_type"] == "m.thread"
    assert reply["content"]["m.relates_to"]["event_id"] == root
    assert (await bot.app.store.get(f"default:matrix:group:{room}:{root}")).messages
    # The bot speaks in the thread now: a follow-up there needs no mention.
    await alice.say(room, "and more", **{
        "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                         "m.in_reply_to": {"event_id": reply["event_id"]}}})
    await alice.wait_for(room, from_bot(bot.id), count=2)


async def test_a_streamed_reply_is_one_message_edited_in_place_and_typing_is_shown(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    final = "one two three four five six seven eight"
    provider = scripted({"reply": final, "chunk": 4, "chunk_delay": 0.05})
    bot = await start(make_app, synapse, people, provider, stream=True)
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    typing: list[list[str]] = []
    alice.client.add_ephemeral_callback(
        lambda r, e: typing.append(list(e.users)), nio.TypingNoticeEvent)
    await alice.say(room, "stream please")
    [draft] = await alice.wait_for(room, from_bot(bot.id))
    edits = await alice.wait_for(room, lambda e: e["content"].get("m.relates_to", {}).get(
        "rel_type") == "m.replace" and e["content"]["m.new_content"]["body"] == final)
    assert edits[0]["content"]["m.relates_to"]["event_id"] == draft["event_id"]
    await settle(bot.app)
    assert len(await alice.wait_for(room, from_bot(bot.id))) == 1  # no second message
    assert any(bot.id in users for users in typing)


async def test_a_long_reply_replacing_a_draft_is_split_into_events_under_the_size_limit(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    bot = await start(make_app, synapse, people, scripted({"reply": "hi"}))
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    draft = await bot.channel.replies.post(room, {"msgtype": "m.text", "body": "drafting"},
                                           None)
    text = "\n\n".join(f"paragraph {n} " + "ü" * 3000 for n in range(14))
    expected = len(pieces(text))
    assert expected >= 3
    last = await bot.channel.send(OutboundMessage("matrix", room, text, replace=draft,
                                                  delivery_id="roost-long"))
    events = await alice.wait_for(room, from_bot(bot.id), count=expected)
    assert events[0]["event_id"] == draft and last == events[-1]["event_id"]
    [edit] = await alice.wait_for(room, lambda e: e["content"].get("m.relates_to", {}).get(
        "rel_type") == "m.replace")
    shown = [edit["content"]["m.new_content"]["body"]] + [text_of(e) for e in events[1:]]
    assert "".join("".join(shown).split()) == "".join(text.split())
    assert all(len(json.dumps(e, ensure_ascii=False).encode()) < EVENT_LIMIT
               for e in [edit, *events])
    assert not [e for e in await alice.events(room) if e["type"] == "m.room.redaction"]


# -- events besides messages ----------------------------------------------------------------


async def test_edits_and_reactions_arrive_as_events_and_the_bot_reacts(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "noted"}, loop=True)
    bot = await start(make_app, synapse, people, provider)
    seen: list[Any] = []
    receive = bot.channel.sync.handler
    assert receive is not None

    async def spy(event: Any) -> None:
        seen.append(event)
        await receive(event)

    bot.channel.sync.handler = spy
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    said = await alice.say(room, "first version")
    await alice.wait_for(room, from_bot(bot.id))
    await alice.send(room, {"msgtype": "m.text", "body": "* second version",
                            "m.new_content": {"msgtype": "m.text", "body": "second version"},
                            "m.relates_to": {"rel_type": "m.replace", "event_id": said}})
    reaction = await alice.send(room, {"m.relates_to": {
        "rel_type": "m.annotation", "event_id": said, "key": "👍"}}, "m.reaction")
    await alice.client.room_redact(room, reaction)
    async with asyncio.timeout(20):
        while sum(isinstance(e, ReactionEvent) for e in seen) < 2:
            await bot.channel.sync.wait_batches(bot.channel.sync.batches + 1)
    [edit] = [e for e in seen if isinstance(e, MessageEdit)]
    assert edit.message.message_id == said and edit.message.text == "second version"
    added, removed = [e for e in seen if isinstance(e, ReactionEvent)]
    assert (added.message_id, added.emoji, added.added) == (said, "👍", True)
    assert (removed.message_id, removed.emoji, removed.added) == (said, "👍", False)

    assert await bot.channel.react(room, said, "👀")
    [mine] = await alice.wait_for(room, lambda e: e["type"] == "m.reaction"
                                  and e["sender"] == bot.id)
    assert mine["content"]["m.relates_to"] == {"rel_type": "m.annotation",
                                               "event_id": said, "key": "👀"}
    # After a restart (nothing remembered) the core names the reaction to replace.
    bot.channel.replies.my_reactions.items.clear()
    assert await bot.channel.react(room, said, "✅", replacing="👀")
    await alice.wait_for(room, lambda e: e["type"] == "m.room.redaction"
                         and e["sender"] == bot.id)
    [now] = [e for e in await alice.events(room) if e["type"] == "m.reaction"
             and e["sender"] == bot.id and e["content"].get("m.relates_to")]
    assert now["content"]["m.relates_to"]["key"] == "✅"


# -- media ------------------------------------------------------------------------------------


async def test_an_image_in_is_downloaded_through_authenticated_media_and_a_file_goes_out(
    make_app: AppFactory, synapse: Synapse, people: list[User], tmp_path: Any,
) -> None:
    from PIL import Image

    provider = scripted({"reply": "a picture"})
    bot = await start(make_app, synapse, people, provider)
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    path = tmp_path / "dot.png"
    Image.new("RGB", (4, 4), "red").save(path)
    data = path.read_bytes()
    upload, _ = await alice.client.upload(lambda *_: data, content_type="image/png",
                                          filename="dot.png", filesize=len(data))
    await alice.send(room, {"msgtype": "m.image", "body": "look", "filename": "dot.png",
                            "url": upload.content_uri,
                            "info": {"mimetype": "image/png", "size": len(data)}})
    await alice.wait_for(room, from_bot(bot.id))
    request = provider.requests[-1].messages[-1]
    assert request.content.startswith("look") and request.parts[0].kind == "image"
    assert await bot.channel.download(Attachment("photo", url=upload.content_uri), 1000) \
        == data
    with pytest.raises(MediaTooLarge):
        await bot.channel.download(Attachment("photo", url=upload.content_uri), 10)

    chart = tmp_path / "chart.png"
    Image.new("RGB", (8, 8), "blue").save(chart)
    sent = await bot.channel.send(OutboundMessage(
        "matrix", room, "here it is", files=(OutboundFile(
            str(chart), "chart.png", "image/png", chart.stat().st_size),)))
    [_, text, image] = await alice.wait_for(room, from_bot(bot.id), count=3)
    assert sent == text["event_id"] and text["content"]["body"] == "here it is"
    assert image["content"]["msgtype"] == "m.image"
    assert image["content"]["info"]["mimetype"] == "image/png"
    media = await alice.client.download(image["content"]["url"])
    assert media.body == chart.read_bytes()

    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (3 * 1024 * 1024))  # over the test server's 2 MB upload limit
    with pytest.raises(MediaTooLarge):
        await bot.channel.send(OutboundMessage("matrix", room, "too big", files=(OutboundFile(
            str(big), "big.bin", "application/octet-stream", big.stat().st_size),)))


# -- policies and commands ---------------------------------------------------------------------


async def test_pairing_applies_in_a_dm_and_a_refused_invite_is_declined(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "should not run"}, loop=True)
    bot = await start(make_app, synapse, people, provider, dm_policy="pairing",
                      group_policy="off")
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)  # pairing: the invite is accepted, the code comes there
    await alice.say(room, "hi")
    [answer] = await alice.wait_for(room, from_bot(bot.id))
    assert "/pair approve " in answer["content"]["body"]
    assert provider.requests == []

    group = await alice.group(bot.id, (await person(synapse, people)).user_id)
    left = await alice.wait_for(group, lambda e: e["type"] == "m.room.member" and e.get(
        "state_key") == bot.id and e["content"].get("membership") == "leave")
    assert left and group not in bot.channel.api.client.rooms


async def test_stop_cancels_the_running_reply(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "too late", "delay": 30})
    bot = await start(make_app, synapse, people, provider)
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    await alice.say(room, "take your time")
    async with asyncio.timeout(20):
        while not provider.requests:
            await bot.channel.sync.wait_batches(bot.channel.sync.batches + 1)
    await alice.say(room, "/stop")
    [stopped] = await alice.wait_for(room, from_bot(bot.id))
    assert stopped["content"]["body"] == "Stopped."
    await settle(bot.app)
    assert [text_of(e) for e in await alice.wait_for(room, from_bot(bot.id))] == ["Stopped."]


async def test_without_encryption_an_encrypted_room_is_told_once_that_the_bot_cannot_read_it(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "unreachable"}, loop=True)
    bot = await start(make_app, synapse, people, provider, table={"encryption": False})
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    await alice.send(room, {"algorithm": "m.megolm.v1.aes-sha2"}, "m.room.encryption")
    sealed = {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnAc", "device_id": "D",
              "sender_key": "k", "session_id": "s"}
    await alice.send(room, sealed, "m.room.encrypted")
    await alice.send(room, sealed, "m.room.encrypted")
    [notice] = await alice.wait_for(room, lambda e: e.get("sender") == bot.id
                                    and e["content"].get("msgtype") == "m.notice")
    assert "can't read end-to-end encrypted messages" in notice["content"]["body"]
    await alice.say(room, "plain again")  # still answered where it can read
    await alice.wait_for(room, lambda e: text_of(e) == "unreachable")
    assert len(await alice.wait_for(room, lambda e: e.get("sender") == bot.id and e[
        "content"].get("msgtype") == "m.notice")) == 1
    assert provider.requests and all("AwgAEnAc" not in str(r.messages)
                                     for r in provider.requests)


async def test_synapse_rate_limit_answers_are_waited_out_and_every_piece_arrives_in_order(
    make_app: AppFactory, synapse: Synapse, people: list[User],
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = await start(make_app, synapse, people, scripted({"reply": "x"}))
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    # One message per half second: the second of three sent at once is refused for sure.
    await synapse.limit_messages(bot.id, per_second=2, burst=1)
    with caplog.at_level("WARNING", "roost.channels.delivery"):
        for n in range(3):
            await bot.channel.send(OutboundMessage("matrix", room, f"piece {n}",
                                                   delivery_id=f"roost-rl{n}"))
    assert any("rate limited, retrying" in r.getMessage() for r in caplog.records)
    sent = await alice.wait_for(room, from_bot(bot.id), count=3)
    assert [text_of(e) for e in sent] == [f"piece {n}" for n in range(3)]


async def test_a_password_login_is_done_once_and_its_device_kept(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    bot = await start(make_app, synapse, people, scripted({"reply": "hello"}), password=True)
    kept = json.loads(await bot.channel.state.get("login") or "{}")
    assert kept["device_id"] == bot.channel.api.client.device_id != bot.account.device_id
    again = MatrixChannel(bot.app.settings, bot.channel.config, policy=FAST)
    await again.api.open(bot.channel.state)
    assert again.api.client.device_id == kept["device_id"]
    assert again.api.client.access_token == kept["access_token"]
    await again.api.close()
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    await alice.say(room, "hi")
    await alice.wait_for(room, lambda e: text_of(e) == "hello")


def test_without_matrix_nio_the_channel_says_in_one_line_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bot.app.cli.serve import missing_sdk
    from bot.config.settings import Settings
    from plugins.matrix import roost_channels

    for name in [n for n in sys.modules if n == "nio" or n.startswith(("nio.",
                                                                      "plugins.matrix."))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nio", None)  # as if matrix-nio were not installed
    settings = Settings(plugins={"plugins.matrix": {
        "homeserver": "http://127.0.0.1:9", "user_id": "@b:x", "access_token": "t"}})
    [spec] = roost_channels(settings)
    assert spec.configured(settings)
    with pytest.raises(ModuleNotFoundError) as missing:
        spec.create(settings)
    assert missing_sdk("matrix", missing.value) == \
        "the matrix channel needs matrix-nio: pip install 'roost[matrix]'"


async def test_an_encrypted_dm_is_read_and_answered_encrypted(
    make_app: AppFactory, synapse: Synapse, people: list[User], tmp_path: Any,
) -> None:
    provider = scripted({"reply": "a **secret** answer to {message}"})
    bot = await start(make_app, synapse, people, provider)
    assert bot.channel.api.encrypting
    plain = await person(synapse, people, "Alice")
    alice = nio.AsyncClient(synapse.url, plain.user_id, plain.device_id,
                            store_path=str(tmp_path),
                            config=nio.AsyncClientConfig(encryption_enabled=True))
    alice.restore_login(plain.user_id, plain.device_id, plain.token)
    try:
        await alice.keys_upload()
        created = await alice.room_create(is_direct=True, invite=[bot.id], initial_state=[{
            "type": "m.room.encryption", "state_key": "",
            "content": {"algorithm": "m.megolm.v1.aes-sha2"}}])
        room = created.room_id
        await joined(bot, room)
        async with asyncio.timeout(20):  # a hang guard: until Alice sees the bot in the room
            while bot.id not in (alice.rooms.get(room).users if room in alice.rooms else {}):
                await alice.sync(timeout=1000)
        await alice.keys_query()
        sent = await alice.room_send(room, "m.room.message", {"msgtype": "m.text",
                                     "body": "between us"}, ignore_unverified_devices=True)
        assert isinstance(sent, nio.RoomSendResponse), sent
        async with asyncio.timeout(20):
            while True:
                answer = await alice.sync(timeout=1000)
                events = answer.rooms.join[room].timeline.events \
                    if room in answer.rooms.join else []
                found = [e for e in events if getattr(e, "sender", "") == bot.id
                         and isinstance(e, nio.RoomMessageText)]
                if found:
                    break
        [reply] = found
        assert reply.decrypted and reply.body == "a **secret** answer to between us"
        assert reply.formatted_body == "<p>a <strong>secret</strong> answer to between us</p>"
        raw = await plain.events(room)
        assert all(e["type"] != "m.room.message" for e in raw if e["sender"] == bot.id)
        assert provider.requests[-1].messages[-1].content == "between us"
        # The device's keys are kept under the data dir.
        assert any((bot.app.settings.data_dir / "matrix").iterdir())
    finally:
        await alice.close()


# -- hostile events -------------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
_keys = st.sampled_from(["msgtype", "body", "url", "info", "filename", "m.relates_to",
                         "m.new_content", "m.mentions", "formatted_body", "redacts", "key",
                         "rel_type", "event_id", "m.in_reply_to", "is_falling_back", "size"])
_content = st.recursive(st.dictionaries(_keys, _json, max_size=6),
                        lambda inner: st.dictionaries(_keys, inner | _json, max_size=5),
                        max_leaves=20)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["m.room.message", "m.sticker", "m.reaction", "m.room.redaction",
                             "m.room.member", 7]),
       content=_content, sender=st.sampled_from(["@eve:x", "", None, 3]),
       redacts=_json, direct=st.booleans())
def test_whatever_a_room_member_writes_into_an_event_never_raises(
    kind: Any, content: Any, sender: Any, redacts: Any, direct: bool,
) -> None:
    from plugins.matrix.inbound import Recent, Room, Translator

    async def nobody(room: str, event: str) -> str | None:
        return None

    translator = Translator("@bot:x", lambda: "Bot", Recent(), nobody)
    event = {"type": kind, "sender": sender, "event_id": "$e", "content": content,
             "redacts": redacts}
    translated = asyncio.run(translator.translate(event, Room("!r:x", direct, lambda _: "")))
    if translated is not None:
        assert translated.channel == "matrix"


async def test_events_the_core_could_not_record_are_synced_again_not_skipped(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "got {message}"}, loop=True)
    bot = await start(make_app, synapse, people, provider)
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    receive = bot.channel.sync.handler
    assert receive is not None
    failures: list[str] = []

    async def flaky(event: Any) -> None:
        if getattr(event, "text", "") == "fragile" and not failures:
            failures.append(event.text)
            raise RuntimeError("the inbox is unavailable")  # as a failed commit would
        await receive(event)

    bot.channel.sync.handler = flaky
    await alice.say(room, "fragile")
    [reply] = await alice.wait_for(room, from_bot(bot.id))
    assert text_of(reply) == "got fragile" and failures == ["fragile"]


async def test_a_refused_token_stops_the_start_with_one_line_that_does_not_show_it(
    synapse: Synapse,
) -> None:
    from bot.config.settings import Settings
    from roost.channels import MemoryState, SetupError

    table = {"homeserver": synapse.url, "user_id": "@nobody:localhost",
             "access_token": "syt_not_a_real_token"}
    channel = MatrixChannel(Settings(plugins={"plugins.matrix": table}),
                            MatrixConfig.model_validate(table), policy=FAST)
    with pytest.raises(SetupError) as refused:
        await channel.api.open(MemoryState())
    await channel.api.close()
    assert "refused the Matrix token of @nobody:localhost (M_UNKNOWN_TOKEN)" in str(refused.value)
    assert "syt_not" not in str(refused.value)


async def test_more_missed_messages_than_one_sync_carries_are_all_answered_after_a_restart(
    make_app: AppFactory, synapse: Synapse, people: list[User],
) -> None:
    provider = scripted({"reply": "re:{message}"}, loop=True)
    bot = await start(make_app, synapse, people, provider, table={"timeline_limit": 2})
    alice = await person(synapse, people, "Alice")
    room = await dm(alice, bot)
    await bot.channel.stop()  # down: nothing syncs
    for n in range(6):
        await alice.say(room, f"m{n}")
    again = MatrixChannel(bot.app.settings, bot.channel.config, policy=FAST, timeout=10)
    await bot.app.add_channel(again)  # the same database: the position kept in its notes
    answers = await alice.wait_for(room, from_bot(bot.id), count=6)
    await settle(bot.app)
    assert sorted(text_of(e) for e in answers) == [f"re:m{n}" for n in range(6)]
    assert len(await alice.wait_for(room, from_bot(bot.id))) == 6
