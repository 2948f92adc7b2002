"""`roost run` with the Matrix channel against a real Synapse: readiness and metrics, a
restart that loses and repeats nothing, and replies that survive a kill -9 in mid-send.

One `roost run` at a time, through a forwarding proxy (tests/matrix_server.py) that can
hold the bot's post or answer with a gateway's HTML page, as a real server never would.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from tests.matrix_server import Proxy, Synapse, User, free_port, sends_a_message
from tests.roost_processes import RoostProcess, start_roost, until_logged
from tests.test_cli import clean_env


def replies(bot_id: str, events: list[dict[str, object]]) -> Counter[str]:
    """How often each text the bot posted is in the room."""
    return Counter(str(e["content"]["body"]) for e in events  # type: ignore[index]
                   if e.get("sender") == bot_id and e.get("type") == "m.room.message")


@pytest.mark.e2e
async def test_roost_run_on_matrix_survives_restarts_kill_9_and_a_bad_gateway(
    tmp_path: Path, synapse: Synapse,
) -> None:
    bot, alice = await synapse.register(displayname="Roosty"), await synapse.register()
    proxy = Proxy(synapse.url)
    await proxy.start()
    script = tmp_path / "script.yaml"
    script.write_text("turns:\n  - reply: 're:{message}'\nloop: true\n")
    port = free_port()
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script), ROOST_STREAM_REPLIES="false",
        ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open", ROOST_HTTP_PORT=str(port),
        MATRIX_HOMESERVER=proxy.url, MATRIX_USER_ID=bot.user_id,
        MATRIX_ACCESS_TOKEN=bot.token)
    workdir = tmp_path / "roost"
    workdir.mkdir()
    # Short long polls: a failing gateway shows within a second.
    (workdir / "roost.toml").write_text('[plugins."plugins.matrix"]\nsync_timeout = 1\n')
    # The first start exec'd: the real entry path stays covered.
    proc = await start_roost(workdir, env, fork=False)
    http = aiohttp.ClientSession(f"http://127.0.0.1:{port}")
    try:
        assert b"channels=matrix" in (await until_logged(proc, b"roost ready"))[-1]
        room = await alice.dm(bot.user_id)
        await alice.say(room, "one")
        await answered(alice, room, bot, "re:one")

        async with http.get("/readyz") as ready:
            assert ready.status == 200, await ready.text()
        async with http.get("/metrics") as metrics:
            text = await metrics.text()
        assert 'roost_deliveries_total{channel="matrix"' in text

        # A gateway in front of the homeserver fails: not ready, and ready again after.
        proxy.bad_gateway = True
        await until_ready(http, False, "matrix: sync failing")
        proxy.bad_gateway = False
        await until_ready(http, True)

        # Stopped, two messages arrive; the restart answers each once and nothing again.
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
        await alice.say(room, "two")
        await alice.say(room, "three")
        proc = await start_roost(workdir, env)
        await until_logged(proc, b"roost ready")
        await answered(alice, room, bot, "re:two", "re:three")

        # Killed after Synapse took the post but before the answer came back: the
        # restart posts again with the same transaction id, and it is shown once.
        proxy.hold, proxy.forward_held = sends_a_message, True
        await alice.say(room, "four")
        async with asyncio.timeout(30):
            await proxy.held.wait()
        proc.kill()
        await proc.wait()
        proxy.hold, proxy.forward_held = None, False
        proxy.held.clear()
        proc = await start_roost(workdir, env)
        await until_logged(proc, b"roost ready")
        await answered(alice, room, bot, "re:four")

        # Killed while the post was on its way (never reached Synapse): sent after restart.
        proxy.hold = sends_a_message
        await alice.say(room, "five")
        async with asyncio.timeout(30):
            await proxy.held.wait()
        proc.kill()
        await proc.wait()
        proxy.hold = None
        proc = await start_roost(workdir, env)
        await until_logged(proc, b"roost ready")
        await answered(alice, room, bot, "re:five")
        await alice.say(room, "six")
        await answered(alice, room, bot, "re:six")
        counts = replies(bot.user_id, await alice.events(room))
        assert counts == Counter({f"re:{n}": 1 for n in
                                  ("one", "two", "three", "four", "five", "six")})

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await http.close()
        await proxy.close()
        await alice.close()
        await bot.close()


async def answered(user: User, room: str, bot: User, *texts: str) -> None:
    """Wait until the bot posted each of ``texts`` in ``room``."""
    def done(event: dict[str, object]) -> bool:
        return event.get("sender") == bot.user_id and \
            event.get("content", {}).get("body") in texts  # type: ignore[union-attr]
    await user.wait_for(room, done, count=len(texts), limit=30)


async def until_ready(http: aiohttp.ClientSession, ready: bool, says: str = "") -> None:
    async with asyncio.timeout(30):  # a hang guard
        while True:
            async with http.get("/readyz") as answer:
                text = await answer.text()
                if (answer.status == 200) == ready and says in text:
                    return
            await asyncio.sleep(0.1)


@pytest.mark.e2e
async def test_replicas_on_postgresql_sync_on_the_leader_only_and_fail_over_after_kill_9(
    tmp_path: Path, synapse: Synapse, pg_url: str,
) -> None:
    bot, alice = await synapse.register(displayname="Roosty"), await synapse.register()
    script = tmp_path / "script.yaml"
    script.write_text("turns:\n  - reply: 're:{message}'\nloop: true\n")
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script), ROOST_STREAM_REPLIES="false",
        ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open", ROOST_DATABASE_URL=pg_url,
        ROOST_LEASE_SECONDS="3", MATRIX_HOMESERVER=synapse.url, MATRIX_USER_ID=bot.user_id,
        MATRIX_ACCESS_TOKEN=bot.token)
    first = await start_roost(tmp_path / "a", env)
    second: RoostProcess | None = None
    try:
        await until_logged(first, b"this replica leads: syncing")
        second = await start_roost(tmp_path / "b", env)
        await until_logged(second, b"another replica syncs")
        await until_logged(second, b"roost ready")
        room = await alice.dm(bot.user_id)
        await alice.say(room, "hi")
        await answered(alice, room, bot, "re:hi")

        first.kill()  # kill -9: its database connection, and the leadership, go with it
        await first.wait()
        await until_logged(second, b"this replica leads: syncing")
        await alice.say(room, "still there?")
        await answered(alice, room, bot, "re:still there?")
        assert replies(bot.user_id, await alice.events(room)) == Counter(
            {"re:hi": 1, "re:still there?": 1})
        second.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await second.wait() == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
        await alice.close()
        await bot.close()
