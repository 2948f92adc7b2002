"""``roost run`` with the email channel, against Dovecot and aiosmtpd: answered, ready,
counted, and a reply cut off by ``kill -9`` in the middle of its SMTP transaction sent
once after the restart (with the same ``Message-ID``)."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from bot.testing.mail import Dovecot, Held, SmtpSink
from tests.roost_processes import start_roost, until_logged
from tests.test_cli import clean_env
from tests.test_email import ALICE, BOT, Mail
from tests.test_http_health import until
from tests.test_run_all_channels import free_port

pytestmark = pytest.mark.e2e

SCRIPT = "turns:\n  - reply: 'hello from roost'\nloop: true\n"


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def test_roost_run_answers_mail_is_ready_and_a_reply_cut_by_kill_9_is_sent_once(
        tmp_path: Path, dovecot: Dovecot) -> None:
    user = dovecot.add_user()
    sink = await SmtpSink(user=user).start()
    mail = Mail(dovecot, sink, user)
    (tmp_path / "script.yaml").write_text(SCRIPT)
    port = free_port()
    env = clean_env(
        ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
        ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open", ROOST_HTTP_PORT=str(port),
        EMAIL_IMAP_URL=f"imap://127.0.0.1:{dovecot.port}", EMAIL_SMTP_URL=sink.url,
        EMAIL_ADDRESS=BOT, EMAIL_USERNAME=user, EMAIL_PASSWORD="secret")
    work = tmp_path / "run"
    # The first start exec'd: the real entry path stays covered.
    proc = await start_roost(work, env, fork=False)
    try:
        line = (await until_logged(proc, b"roost ready"))[-1]
        assert b"channels=email" in line
        await until_logged(proc, b"email: first start on this mailbox")
        status, body = await get(f"http://127.0.0.1:{port}/readyz")
        assert (status, body) == (200, "ready\n")

        mail.write("hello")
        [reply] = await sink.wait_for(1)
        assert reply["To"] == ALICE and reply["Subject"] == "Re: Plans"
        # Counted once the SMTP server's answer is back.
        await until(get, f"http://127.0.0.1:{port}/metrics", lambda _, text:
                    'roost_deliveries_total{channel="email",outcome="ok"} 1.0' in text)

        # The next reply is committed and its mail is in SMTP DATA when Roost is killed.
        held = sink.hold = Held()
        mail.write("and again", subject="Second")
        async with asyncio.timeout(20):  # a hang guard
            await held.arrived.wait()
        proc.kill()
        await proc.wait()
        held.release("451 4.3.0 connection gone")  # the server never took it
        assert held.mail is not None

        proc = await start_roost(work, env)
        await until_logged(proc, b"roost ready")
        [_, again] = await sink.wait_for(2)
        assert again["Message-ID"] == held.mail["Message-ID"]
        assert again["Subject"] == "Re: Second"
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await sink.close()
    # Everything was sent once: two mails accepted, every reply delivered.
    assert len(sink.accepted) == 2
    with sqlite3.connect(work / "data" / "roost.db") as db:
        states = [r[0] for r in db.execute("SELECT state FROM outbox ORDER BY id")]
    assert states == ["delivered", "delivered"]
