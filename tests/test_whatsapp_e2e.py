"""``roost run`` serving WhatsApp: one process, killed with SIGKILL and started again.

The webhook is on the process's own HTTP port; the fake Cloud API plays Meta. The
run shows what survives a crash: a reply committed but not yet taken by WhatsApp is
sent after the restart, once, and a webhook delivery WhatsApp repeats after the
restart is not answered twice.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from bot.testing.whatsapp import FakeWhatsApp
from bot.testing.whatsapp import fake_whatsapp as _fake_whatsapp  # noqa: F401  (the fixture)
from tests.roost_processes import start_roost, until_logged
from tests.test_cli import clean_env
from tests.test_run_all_channels import free_port

ALICE = "15551234567"
SCRIPT = "turns:\n  - reply: 'echo: {message}'\nloop: true\n"


def pending(data: Path) -> int:
    db = sqlite3.connect(data / "roost.db")
    try:
        return int(db.execute("SELECT count(*) FROM outbox WHERE state = 'pending'"
                              ).fetchone()[0])
    finally:
        db.close()


@pytest.mark.e2e
async def test_roost_run_answers_on_whatsapp_and_a_kill_9_loses_and_repeats_nothing(
        tmp_path: Path, fake_whatsapp: FakeWhatsApp) -> None:
    (tmp_path / "script.yaml").write_text(SCRIPT)
    port = free_port()
    env = clean_env(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(tmp_path / "script.yaml"),
                    ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
                    ROOST_HTTP_HOST="127.0.0.1", **fake_whatsapp.env(port))
    fake = fake_whatsapp
    # The first start exec'd: the real entry path stays covered.
    proc = await start_roost(tmp_path, env, fork=False)
    try:
        line = (await until_logged(proc, b"roost ready"))[-1]
        assert b"channels=whatsapp" in line
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as ready:
                assert ready.status == 200
            forged = fake.text(ALICE, "forged")
            assert await fake.post(forged, signature="sha256=00") == 401

            first = fake.text(ALICE, "one")
            assert await fake.deliver(first) == 200
            await fake.wait_until(lambda: fake.visible(ALICE) == ["echo: one"])
            # The typing indicator (with the read receipt) came before the reply.
            assert fake.calls[0].body.get("typing_indicator") == {"type": "text"}

            # WhatsApp takes the next reply's request but never applies it: the process
            # dies with the reply committed and not shown.
            fake.fail("hold")
            assert await fake.deliver(fake.text(ALICE, "two")) == 200
            await fake.wait_until(lambda: bool(fake.held))
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            assert pending(tmp_path / "data") == 1

            proc = await start_roost(tmp_path, env)
            await until_logged(proc, b"roost ready")
            # Meta delivers the first message again (its answer was lost, say): dropped.
            assert await fake.deliver(first) == 200
            assert await fake.deliver(fake.text(ALICE, "three")) == 200
            await fake.wait_until(lambda: len(fake.visible(ALICE)) >= 3)
            async with http.get(f"http://127.0.0.1:{port}/metrics") as metrics:
                assert 'roost_deliveries_total{channel="whatsapp",outcome="ok"}' \
                    in await metrics.text()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert sorted(fake.visible(ALICE)) == ["echo: one", "echo: three", "echo: two"]
    assert pending(tmp_path / "data") == 0
