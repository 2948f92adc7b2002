"""DM pairing end to end: the real aiogram against the fake Bot API, Roost behind it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.storage.access import (
    CODE_ALPHABET,
    KEEP_REQUESTS,
    REMIND_AFTER,
    new_code,
    normalize_code,
)
from bot.testing.app import closing_apps, create_app, scripted, settle
from bot.testing.discord import DM_CHANNEL_ID, USER_ID, FakeDiscord
from bot.testing.discord import fake_discord as _fake_discord  # noqa: F401  (the fixture)
from bot.testing.telegram import BOB, FakeTelegram, user
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from channels.delivery import DeliveryPolicy, Limits
from channels.discord import DiscordChannel
from channels.telegram import TelegramChannel
from plugins.scripted_provider import ScriptedProvider

ADMIN = user(99, "Ada", "ada")
CAROL = user(44, "Carol", "carol")
FAST = DeliveryPolicy(attempts=3, base_delay=0.05, max_delay=0.1)
CODE = re.compile(r"/pair approve ([A-Z2-9]{6,8})\b")
START = 1_800_000_000.0  # 2027-01-15 08:00 UTC

App = tuple[Roost, ScriptedProvider, list[float]]
Factory = Callable[..., Awaitable[App]]


@pytest.fixture(name="make_app")
async def make_app(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[Factory]:
    """``make_app(**settings)``: Roost on the fake Telegram under the pairing policy, with
    Ada as admin and a clock (``clock[0]``, seconds) the pairing store reads."""
    async with closing_apps() as apps:

        async def factory(**settings: Any) -> App:
            settings.setdefault("dm_policy", "pairing")
            settings.setdefault("admins", ["telegram:99"])
            provider = scripted({"reply": "answer to {message}"}, loop=True)
            app, _ = await create_app(
                provider, data_dir=tmp_path / "data", stream_replies=False,
                telegram_bot_token=fake_telegram.token,
                telegram_api_base=fake_telegram.base_url, **settings)
            apps.append(app)
            clock = [START]
            assert app.services.access is not None
            app.services.access.clock = lambda: clock[0]
            # No proactive budget (3 calls per 3 s in a chat): not what is tested here.
            await app.add_channel(TelegramChannel(app.settings, polling_timeout=1,
                                                  policy=FAST, limits=Limits()))
            return app, provider, clock

        yield factory


async def handled(fake: FakeTelegram, app: Roost, update: dict[str, Any]) -> None:
    """Wait until the bot took ``update`` and everything it started is over."""
    await fake.wait_confirmed(update["update_id"])
    await settle(app)


async def dm(fake: FakeTelegram, app: Roost, text: str,
             sender: dict[str, Any] = BOB) -> list[str]:
    """Send ``text`` in ``sender``'s private chat; the texts the bot sent there meanwhile."""
    before = len(fake.sent_texts(sender["id"]))
    await handled(fake, app, fake.private_message(text, sender=sender))
    return fake.sent_texts(sender["id"])[before:]


async def admin_says(fake: FakeTelegram, app: Roost, args: str, command: str = "/pair",
                     sender: dict[str, Any] = ADMIN) -> str:
    """Send ``/pair args`` (or ``command``) as ``sender``; the reply in their chat."""
    before = len(fake.sent_texts(sender["id"]))
    await handled(fake, app, fake.command(command, args, sender=sender))
    [reply] = fake.sent_texts(sender["id"])[before:]
    return reply


async def code_for(fake: FakeTelegram, app: Roost, sender: dict[str, Any] = BOB) -> str:
    [reply] = await dm(fake, app, "hello?", sender)
    found = CODE.search(reply)
    assert found is not None, reply
    return found.group(1)


# -- codes -------------------------------------------------------------------------


def test_codes_are_8_characters_of_a_to_z_and_2_to_9() -> None:
    codes = {new_code() for _ in range(200)}
    assert len(codes) == 200
    assert all(len(c) == 8 and set(c) <= set(CODE_ALPHABET) for c in codes)
    assert not set("01") & set(CODE_ALPHABET)
    assert normalize_code(" abcd-2345 ") == "ABCD2345"


def test_pairing_is_the_default_dm_policy() -> None:
    assert Settings().dm_policy == "pairing"
    assert Settings().pairing_code_ttl == 3600


# -- the gate ------------------------------------------------------------------------


async def test_unknown_user_gets_a_code_and_nothing_reaches_the_model(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await make_app()
    [reply] = await dm(fake_telegram, app, "hi, what's the weather?")
    assert "/pair approve " in reply and CODE.search(reply)
    assert "60 minutes" in reply
    assert provider.requests == []
    # Recorded and closed: not answered later (no open inbox entry), nothing in a session.
    assert await app.inbox.unfinished() == []
    async with app.store.lock, app.store.db.execute("SELECT state, kind FROM inbox") as cur:
        assert await cur.fetchall() == [("done", "message")]
    assert (await app.store.get("default:telegram:direct:43")).messages == []


async def test_unknown_users_commands_are_refused_too(make_app: Factory,
                                                     fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await make_app()
    before = len(fake_telegram.sent_texts(43))
    await handled(fake_telegram, app, fake_telegram.command("/whoami", sender=BOB))
    [reply] = fake_telegram.sent_texts(43)[before:]
    assert CODE.search(reply)
    # Approving yourself is not a way in either: /pair is for admins once you are paired.
    code = CODE.search(reply)
    assert code is not None
    await handled(fake_telegram, app, fake_telegram.command("/pair", f"approve {code.group(1)}",
                                                            sender=BOB))
    assert not await app.services.access.is_paired("telegram", "43")  # type: ignore[union-attr]
    assert provider.requests == []


async def test_admin_approves_and_the_users_next_message_is_answered(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await make_app()
    code = await code_for(fake_telegram, app)
    reply = await admin_says(fake_telegram, app, f"approve {code.lower()}")
    assert reply == "Approved Bob (telegram:43). They can talk to me now."
    # Bob is told, in his own chat.
    assert "approved you" in fake_telegram.sent_texts(43)[-1]
    assert await dm(fake_telegram, app, "now?") == ["answer to now?"]
    assert len(provider.requests) == 1
    # The message sent before the approval was never run.
    assert "hello?" not in str(provider.requests[0].messages)


async def test_a_used_wrong_or_expired_code_approves_nobody(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, provider, clock = await make_app()
    code = await code_for(fake_telegram, app)
    assert (await admin_says(fake_telegram, app, f"approve {code}")).startswith("Approved")
    again = await admin_says(fake_telegram, app, f"approve {code}")
    assert again == (f"No pending request has the code {code} (it is wrong, expired or "
                     "already used).")
    assert (await admin_says(fake_telegram, app, "approve ZZZZ2222")).startswith(
        "No pending request has the code ZZZZ2222")
    # Expiry: Carol's code is past pairing_code_ttl (the default, 1 h) when approved.
    carols = await code_for(fake_telegram, app, CAROL)
    clock[0] += 3600 + 1
    assert (await admin_says(fake_telegram, app, f"approve {carols}")).startswith(
        f"No pending request has the code {carols}")
    assert not await app.services.access.is_paired("telegram", "44")  # type: ignore[union-attr]
    # Writing again after expiry gives her a new code, which works.
    fresh = await code_for(fake_telegram, app, CAROL)
    assert fresh != carols
    assert (await admin_says(fake_telegram, app, f"approve {fresh}")).startswith("Approved")
    assert provider.requests == []


async def test_a_user_who_keeps_writing_gets_the_same_code_at_most_every_10_minutes(
        make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, _, clock = await make_app(pairing_code_ttl=7200)
    code = await code_for(fake_telegram, app)
    assert await dm(fake_telegram, app, "hello??") == []
    clock[0] += REMIND_AFTER - 1
    assert await dm(fake_telegram, app, "anyone?") == []
    clock[0] += 1
    [reminder] = await dm(fake_telegram, app, "HELLO")
    assert CODE.search(reminder) and code in reminder
    assert await dm(fake_telegram, app, "...") == []
    [pending] = await app.services.access.pending()  # type: ignore[union-attr]
    assert (pending.code, pending.refused) == (code, 5)
    listing = await admin_says(fake_telegram, app, "list")
    assert f"{code}  telegram:43 Bob" in listing and "5 message(s) refused" in listing


async def test_a_redelivered_update_is_not_refused_twice(make_app: Factory,
                                                         fake_telegram: FakeTelegram) -> None:
    app, _, clock = await make_app()
    update = fake_telegram.private_message("hi", sender=BOB)
    await handled(fake_telegram, app, update)
    clock[0] += REMIND_AFTER  # a reminder would be due, were it a new message
    fake_telegram.redeliver(update)
    await handled(fake_telegram, app, fake_telegram.private_message("x", sender=CAROL))
    assert len(fake_telegram.sent_texts(43)) == 1
    [pending, _] = await app.services.access.pending()  # type: ignore[union-attr]
    assert pending.refused == 1


async def test_old_requests_are_deleted_as_new_ones_come(make_app: Factory,
                                                         fake_telegram: FakeTelegram) -> None:
    app, _, clock = await make_app()
    await code_for(fake_telegram, app)
    clock[0] += 3600 + KEEP_REQUESTS + 1
    await code_for(fake_telegram, app, CAROL)
    async with app.store.lock, app.store.db.execute(
            "SELECT user_id FROM pairing_requests") as cur:
        assert await cur.fetchall() == [("44",)]


async def test_revoked_user_needs_a_new_code(make_app: Factory,
                                             fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await make_app()
    code = await code_for(fake_telegram, app)
    await admin_says(fake_telegram, app, f"approve {code}")
    assert await admin_says(fake_telegram, app, "revoke 43") == (
        "Revoked telegram:43: their next DM gets a new pairing code.")
    assert (await admin_says(fake_telegram, app, "revoke telegram:43")).startswith(
        "No approved user telegram:43")
    fresh = await code_for(fake_telegram, app)
    assert fresh != code
    assert provider.requests == []


async def test_pair_is_for_admins_only(make_app: Factory, fake_telegram: FakeTelegram) -> None:
    app, _, _ = await make_app()
    code = await code_for(fake_telegram, app)
    await admin_says(fake_telegram, app, f"approve {code}")
    carols = await code_for(fake_telegram, app, CAROL)
    reply = await admin_says(fake_telegram, app, f"approve {carols}", sender=BOB)
    assert reply == "/pair is for admins only."
    assert (await admin_says(fake_telegram, app, "list", sender=BOB)) == \
        "/pair is for admins only."
    assert (await admin_says(fake_telegram, app, "")).startswith("Usage: /pair approve CODE")


async def test_admins_and_allowlisted_users_skip_pairing(make_app: Factory,
                                                         fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await make_app(dm_allowlist=["telegram:44"])
    assert await dm(fake_telegram, app, "hi", ADMIN) == ["answer to hi"]
    assert await dm(fake_telegram, app, "hey", CAROL) == ["answer to hey"]
    assert len(provider.requests) == 2
    assert await app.services.access.pending() == []  # type: ignore[union-attr]


async def test_group_policy_is_unchanged(make_app: Factory,
                                         fake_telegram: FakeTelegram) -> None:
    app, provider, _ = await make_app()
    update = fake_telegram.mention("what time is it?", sender=BOB)
    await handled(fake_telegram, app, update)
    assert len(provider.requests) == 1
    assert fake_telegram.sent_texts() == ["answer to [Bob (id 43)]: what time is it?"]


async def test_open_policy_lets_anyone_in(make_app: Factory,
                                          fake_telegram: FakeTelegram) -> None:
    app, _, _ = await make_app(dm_policy="open")
    assert await dm(fake_telegram, app, "hi") == ["answer to hi"]


async def test_a_refused_dm_recorded_before_a_crash_is_not_run_after_it(
        tmp_path: Path) -> None:
    """The inbox entry of a refused DM is closed; were it left open by a crash, recovery
    closes it instead of running it."""
    provider = scripted({"reply": "should not happen"}, loop=True)
    app, _ = await create_app(provider, data_dir=tmp_path, dm_policy="pairing")
    try:
        from bot.contracts.messages import InboundMessage
        message = InboundMessage(channel="telegram", chat_id="zed", chat_type="direct",
                                 sender_id="zed", text="hi", message_id="1")
        entry = await app.inbox.add(message, app.dispatcher.key_for(message))
        assert entry is not None
        await app.dispatcher.recover(([], await app.inbox.unfinished()))
        await settle(app)
        assert provider.requests == []
        assert await app.inbox.unfinished() == []
    finally:
        await app.close()


async def test_pairing_works_the_same_on_discord(fake_discord: FakeDiscord,
                                                tmp_path: Path) -> None:
    provider = scripted({"reply": "answer to {message}"}, loop=True)
    app, _ = await create_app(provider, data_dir=tmp_path / "data", dm_policy="pairing",
                              **fake_discord.settings())
    try:
        await app.add_channel(DiscordChannel(app.settings, guild_ready_timeout=0.05,
                                             delivery=FAST))
        await fake_discord.dm("hello")
        await fake_discord.wait_for_call("POST", r"/channels/\d+/messages$")
        await settle(app)
        [refusal] = fake_discord.posted(DM_CHANNEL_ID)
        code = CODE.search(refusal.content)
        assert code is not None and provider.requests == []
        store = app.services.access
        assert store is not None
        request = await store.approve(code.group(1), "test")
        assert request is not None and request.user == f"discord:{USER_ID}"
        await fake_discord.dm("and now?")
        await fake_discord.wait_for_call("POST", r"/channels/\d+/messages$", count=2)
        await settle(app)
        assert fake_discord.posted(DM_CHANNEL_ID)[-1].content == "answer to and now?"
        assert len(provider.requests) == 1
    finally:
        await app.close()


# -- the command line --------------------------------------------------------------


async def test_roost_pairing_approve_and_list_from_the_command_line(
        make_app: Factory, fake_telegram: FakeTelegram, tmp_path: Path) -> None:
    app, provider, _ = await make_app()
    code = await code_for(fake_telegram, app)
    env = {"ROOST_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}

    def roost(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bot", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)

    listed = roost("pairing", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"{code}  telegram:43  Bob" in listed.stdout
    wrong = roost("pairing", "approve", "WRONG222")
    assert wrong.returncode == 1
    assert "no pending request has the code WRONG222" in wrong.stderr
    # The service keeps running meanwhile: the approval is in the shared database.
    approved = roost("pairing", "approve", code)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.strip() == "approved telegram:43 (Bob)"
    assert await dm(fake_telegram, app, "and now?") == ["answer to and now?"]
    assert len(provider.requests) == 1
    assert "approved:\n  telegram:43  Bob  by cli" in roost("pairing", "list").stdout


async def test_a_revoked_user_who_was_answered_before_is_refused_again(
        make_app: Factory) -> None:
    app, _, _ = await make_app()
    access = app.services.access
    assert access is not None
    refusal = await access.refuse("telegram", "43", "43")
    assert await access.approve(refusal.code, "admin") is not None
    assert await access.is_paired("telegram", "43")  # answered once: remembered
    assert await access.revoke("telegram", "43")
    assert not await access.is_paired("telegram", "43")
