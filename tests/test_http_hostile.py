"""`roost run`'s public port against hostile clients, at systemd's 1,024-descriptor limit.

One `roost run` process serves `/healthz` and Slack's Events endpoint on one port with a
1,024 soft and hard open-file limit; the test holds thousands of connections to it from
``127.0.0.x`` addresses and checks what the README promises (connection caps, refusals,
timeouts, body limits, a quiet log).
"""

from __future__ import annotations

import asyncio
import resource
import signal
import socket
from pathlib import Path

import pytest

from bot.testing.app import create_app, scripted
from bot.testing.hostile_http import (
    Held,
    close_all,
    flood,
    get,
    hold,
    outcome,
    raise_own_open_files,
    request,
    status,
)
from bot.testing.slack import FakeSlack
from bot.testing.telegram import FakeTelegram
from channels.delivery import DeliveryPolicy
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from tests.roost_forks import spawn
from tests.roost_processes import RoostProcess
from tests.test_cli import clean_env

SCRIPT = "turns:\n  - reply: 'still here'\nloop: true\n"
HEADER_TIMEOUT = 3
CAP = 256
"""A quarter of 1,024 descriptors: the derived connection cap."""
PER_ADDRESS = 64
SLOW_BODY = (b"POST /slack/events HTTP/1.1\r\nHost: roost\r\nContent-Length: 100\r\n"
             b"Expect: 100-continue\r\n\r\n")
"""Headers whose body never comes: the request is being read, not waiting for headers."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until_in_log(log: Path, text: str, proc: RoostProcess) -> str:
    async with asyncio.timeout(60):  # a hang guard, not a measurement
        while True:
            content = await asyncio.to_thread(log.read_text, errors="replace")
            if text in content:
                return content
            assert proc.returncode is None, content[-3000:]
            await asyncio.sleep(0.1)


async def until_healthy(port: int) -> None:
    async with asyncio.timeout(30):  # a hang guard, not a measurement
        while True:
            answer, _ = await request(port, get("/healthz"))
            if status(answer) == 200:
                return
            await asyncio.sleep(0.05)


async def held_body(port: int, address: str) -> Held:
    """A POST whose headers the server has taken (it said ``100 Continue``), body held back."""
    held = await hold(port, address, SLOW_BODY)
    assert held is not None
    async with asyncio.timeout(30):  # a hang guard
        assert (await held.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
    return held


async def first_cut(held: list[Held | None], limit: float) -> None:
    """Return when the server has closed one of ``held`` (a hang guard of ``limit`` s)."""
    ends = [asyncio.ensure_future(outcome(h, limit)) for h in held if h]
    try:
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for end in ends:
            end.cancel()
        await asyncio.gather(*ends, return_exceptions=True)


def roost_env(tmp_path: Path, port: int, fake_slack: FakeSlack, **extra: str) -> dict[str, str]:
    (tmp_path / "script.yaml").write_text(SCRIPT)
    return clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
        ROOST_STREAM_REPLIES="false", ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
        SLACK_BOT_TOKEN=fake_slack.bot_token, SLACK_SIGNING_SECRET=fake_slack.signing_secret,
        SLACK_API_BASE=fake_slack.base_url, ROOST_SLACK_PORT=str(port),
        ROOST_HTTP_PORT=str(port), ROOST_HTTP_HEADER_TIMEOUT=str(HEADER_TIMEOUT), **extra)


async def start_limited(tmp_path: Path, env: dict[str, str],
                        soft: int = 1024) -> RoostProcess:
    """``roost run`` with ``soft`` and 1,024 descriptors (soft and hard limits), its log in
    ``roost.log``."""
    with (tmp_path / "roost.log").open("wb") as sink:
        return await spawn(["run"], cwd=tmp_path, env=env, stdout=sink, stderr=sink,
                           rlimits={resource.RLIMIT_NOFILE: (soft, 1024)})


@pytest.mark.e2e
async def test_roost_run_at_1024_descriptors_holds_against_2000_slow_loris_connections(
        tmp_path: Path, fake_slack: FakeSlack) -> None:
    raise_own_open_files(6000)
    port = free_port()
    log = tmp_path / "roost.log"
    held: list[Held | None] = []
    proc = await start_limited(tmp_path, roost_env(tmp_path, port, fake_slack))
    try:
        started = await until_in_log(log, "roost ready", proc)
        assert "open files: up to 1024\n" in started
        assert f"HTTP: at most {CAP} connections ({PER_ADDRESS} per address), headers " \
               f"within {HEADER_TIMEOUT}s, bodies within 30s and 1048576 bytes" in started

        # Per-address cap: 64 requests from one address are being read; the 65th and
        # later ones from it are refused at once (none of the 64 waits for headers).
        held += [await held_body(port, "127.0.0.2") for _ in range(PER_ADDRESS)]
        extra = await flood(port, 8, ["127.0.0.2"], head=SLOW_BODY)
        held += extra
        # Taken on, they would get "100 Continue" and be held 30 s for their bodies; refused,
        # they are closed (429, or a reset as their request was never read).
        ends = [await outcome(h, 15) for h in extra if h]
        assert len(ends) == 8 and {status(end) if end is not None else None
                                   for end in ends} <= {429, 0}
        # The connection cap: three more addresses fill it; a fifth address is refused.
        for address in ("127.0.0.3", "127.0.0.4", "127.0.0.5"):
            held += [await held_body(port, address) for _ in range(PER_ADDRESS)]
        answer, _ = await request(port, get("/healthz"), address="127.0.0.6")
        assert status(answer) in (503, 0)
        close_all(held)
        held.clear()
        await until_healthy(port)  # the server has seen them go

        # Body limits per route: GET takes none, the webhook at most 1 MiB.
        too_big = (b"POST /slack/events HTTP/1.1\r\nHost: roost\r\nConnection: close\r\n"
                   b"Content-Length: 1048577\r\n\r\n")
        answer, _ = await request(port, too_big)
        assert status(answer) == 413
        body_on_get = (b"GET /healthz HTTP/1.1\r\nHost: roost\r\nConnection: close\r\n"
                       b"Content-Length: 5\r\n\r\nhello")
        answer, _ = await request(port, body_on_get)
        assert status(answer) == 413
        answer, _ = await request(port, get("/healthz"))
        assert status(answer) == 200 and answer.endswith(b"\r\n\r\nok\n")

        # 2,000 slow-loris connections from 40 addresses (50 each, under the address cap).
        size_before = log.stat().st_size
        addresses = [f"127.0.0.{i}" for i in range(10, 50)]
        held = await flood(port, 2000, addresses)
        answer, seconds = await request(port, get("/healthz"))
        print(f"/healthz under 2,000 slow-loris connections: {seconds * 1000:.1f} ms")
        assert status(answer) == 200 and answer.endswith(b"\r\n\r\nok\n")
        answer, _ = await request(port, get("/readyz"))
        assert status(answer) == 200 and answer.endswith(b"\r\n\r\nready\n")
        fake_slack.events_url = f"http://127.0.0.1:{port}/slack/events"
        delivery = await fake_slack.post_event(fake_slack.direct_message("are you there?"))
        assert delivery.status == 200
        (posted,) = await fake_slack.wait_for("chat.postMessage", limit=30)
        assert posted.params["text"] == "still here"

        # Every slow-loris connection ends: refused, closed for room, or cut at the
        # header timeout (a hang guard well past it).
        ends = await asyncio.gather(*(outcome(h, HEADER_TIMEOUT + 20) for h in held if h))
        assert ends.count(None) == 0
        assert {status(end) for end in ends if end} <= {503}
        grown = log.stat().st_size - size_before
        print(f"log grew {grown} bytes")
        assert grown < 1 << 20
        content = log.read_text(errors="replace")
        assert "Traceback" not in content, content[-3000:]

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        close_all(held)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.e2e
async def test_accept_failing_for_lack_of_descriptors_is_logged_once_a_minute(
        tmp_path: Path, fake_slack: FakeSlack) -> None:
    # A connection cap set above the descriptor limit: accept() runs out of descriptors.
    raise_own_open_files(6000)
    port = free_port()
    log = tmp_path / "roost.log"
    proc = await start_limited(tmp_path, roost_env(tmp_path, port, fake_slack,
                                                   ROOST_HTTP_MAX_CONNECTIONS="3000"))
    held: list[Held | None] = []
    try:
        await until_in_log(log, "roost ready", proc)
        size_before = log.stat().st_size
        held = await flood(port, 1500, [f"127.0.0.{i}" for i in range(10, 40)])
        # asyncio tries accept() again every second while descriptors lack: it fails from
        # now until the header timeout cuts the first held connections and frees some.
        await until_in_log(log, "accept() failed", proc)
        await first_cut(held, HEADER_TIMEOUT + 20)
        close_all(held)
        held.clear()
        await until_healthy(port)
        content = (await asyncio.to_thread(log.read_bytes))[size_before:].decode(errors="replace")
        assert content.count("accept() failed") == 1, content[-3000:]
        assert "Too many open files" in content
        assert "socket.accept() out of system resource" not in content
        assert log.stat().st_size - size_before < 1 << 20
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        close_all(held)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_slacks_and_telegrams_own_listeners_cut_slow_clients_and_cap_bodies_and_addresses(
        tmp_path: Path, fake_slack: FakeSlack, fake_telegram: FakeTelegram) -> None:
    hook_port = free_port()
    app, _ = await create_app(
        scripted({"reply": "ok"}, loop=True), data_dir=tmp_path,
        **fake_slack.settings(port=0), telegram_bot_token=fake_telegram.token,
        telegram_api_base=fake_telegram.base_url,
        telegram_webhook_url=f"http://127.0.0.1:{hook_port}/hook",
        telegram_webhook_port=hook_port, telegram_webhook_secret="s3cret",
        http_header_timeout=0.5, http_max_per_address=2, http_max_body=1000)
    held: list[Held | None] = []
    try:
        slack = SlackChannel(app.settings, host="127.0.0.1")
        await app.add_channel(slack)
        telegram = TelegramChannel(app.settings, policy=DeliveryPolicy(attempts=2))
        await app.add_channel(telegram)
        assert slack.port is not None and slack.port != hook_port  # two listeners of their own
        for port, path in ((slack.port, "/slack/events"), (hook_port, "/hook")):
            # A slow-loris is cut after the header timeout (the hang guard is far past it).
            slow = await hold(port, "127.0.0.7")
            assert slow is not None and await outcome(slow, 20) == b""
            # Two requests from one address are being read: a third is refused at once.
            head = (f"POST {path} HTTP/1.1\r\nHost: roost\r\nContent-Length: 10\r\n"
                    "Expect: 100-continue\r\n\r\n").encode()
            for _ in range(2):
                held.append(one := await hold(port, "127.0.0.8", head))
                assert one is not None
                async with asyncio.timeout(20):  # a hang guard
                    assert (await one.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            answer, _ = await request(port, get(path), address="127.0.0.8")
            assert status(answer) in (429, 0)
            answer, _ = await request(port, get(path), address="127.0.0.9")
            assert status(answer) == 405  # another address gets in (GET: not allowed)
            close_all(held)
            held.clear()
            # A body over http_max_body: 413 before the route's own checks.
            big = (f"POST {path} HTTP/1.1\r\nHost: roost\r\nConnection: close\r\n"
                   f"Content-Length: 1001\r\n\r\n").encode() + b"x" * 1001
            answer, _ = await request(port, big, address="127.0.0.10")
            assert status(answer) == 413
    finally:
        close_all(held)
        await app.close()


async def test_a_body_slower_than_the_body_timeout_gets_408_and_the_connection_closes(
        tmp_path: Path, fake_slack: FakeSlack) -> None:
    app, _ = await create_app(scripted({"reply": "ok"}, loop=True), data_dir=tmp_path,
                              **fake_slack.settings(port=0), http_body_timeout=0.5)
    try:
        slack = SlackChannel(app.settings, host="127.0.0.1")
        await app.add_channel(slack)
        assert slack.port is not None
        head = (b"POST /slack/events HTTP/1.1\r\nHost: roost\r\nContent-Length: 10\r\n\r\n"
                b"12345")  # half the body, the rest never
        slow = await hold(slack.port, "127.0.0.11", head)
        assert slow is not None
        end = await outcome(slow, 20)  # a hang guard far past the body timeout
        assert end is not None and status(end) == 408, end
    finally:
        await app.close()


async def test_unsigned_slack_requests_cannot_flood_the_log(
        tmp_path: Path, fake_slack: FakeSlack, caplog: pytest.LogCaptureFixture) -> None:
    app, _ = await create_app(scripted({"reply": "ok"}, loop=True), data_dir=tmp_path,
                              **fake_slack.settings(port=0))
    try:
        slack = SlackChannel(app.settings, host="127.0.0.1")
        await app.add_channel(slack)
        fake_slack.events_url = slack.events_url
        caplog.set_level("WARNING")
        for n in range(200):
            forged = await fake_slack.post_event(fake_slack.direct_message(f"x{n}"), forge=True)
            assert forged.status == 401
        lines = [r.getMessage() for r in caplog.records if "bad signature" in r.getMessage()]
        assert lines == ["Slack: refused a request with a bad signature from 127.0.0.1"]
    finally:
        await app.close()


@pytest.mark.e2e
async def test_roost_run_raises_its_open_file_soft_limit_to_the_hard_one_and_says_so(
        tmp_path: Path, fake_slack: FakeSlack) -> None:
    port = free_port()
    log = tmp_path / "roost.log"
    proc = await start_limited(tmp_path, roost_env(tmp_path, port, fake_slack), soft=512)
    try:
        started = await until_in_log(log, "roost ready", proc)
        assert "open files: up to 1024 (soft limit raised from 512)\n" in started
        # The connection cap is derived from the raised limit (a quarter of 1,024).
        assert f"HTTP: at most {CAP} connections" in started
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
