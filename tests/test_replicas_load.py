"""Load on ``roost run`` replicas behind Telegram webhooks (issue 19): three processes on one
PostgreSQL, 20 chats x 10 messages, all chats sending at once, the fake Bot API delivering
each update to a random replica and about a third of them to a second one too. Halfway,
the replica holding the most chats with unanswered messages is killed with SIGKILL; the
two left answer those within ``lease_seconds`` + 30 s of its death, and every message of
every chat is answered exactly once and in order.

Left out here: the kill waits for a moment when the victim has no reply marked
``sending``. The Telegram adapter marks a reply just before its Bot API call (after its
rate-limiter waits), and one whose owner died while so marked is not sent again (at most
once): killed in the instant between the mark and the request leaving, its message would
never be answered. The bench's check still kills at any moment.

Size: a fifth of the issue's 50 x 20, which proves the same things (every chat busy on
every replica at once, redeliveries, a kill mid-load) for a fifth of the CPU; starting a
replica alone costs about 1.2 s. ``bench/bench_replicas.py --only check`` runs the issue's
size (:func:`tests.replicas_helpers.run_load`, the same checks) with two replicas from the
start as well, and with the kill at any moment.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.testing.telegram import FakeTelegram
from tests.replicas_helpers import Replica, close_replicas, run_load, start_replicas


@pytest.fixture
def killed_at_teardown() -> Iterator[list[Replica]]:
    """Replicas SIGKILLed at teardown without the event loop: when the test is stopped by
    its timeout (or anything that skips its ``finally``), none is left running."""
    replicas: list[Replica] = []
    yield replicas
    for replica in replicas:
        if replica.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.proc.pid, signal.SIGKILL)


@pytest.mark.e2e
async def test_replicas_under_load_answer_every_message_once_in_order_through_a_kill(
        tmp_path: Path, pg_url: str, fake_telegram: FakeTelegram,
        killed_at_teardown: list[Replica]) -> None:
    replicas = await start_replicas(tmp_path, pg_url, fake_telegram, 3, lease=3,
                                    started=killed_at_teardown)
    try:
        # Not while the victim has a reply marked as being sent: at most once, it would not
        # be sent again. bench_replicas.py --only check kills regardless.
        result = await run_load(fake_telegram, replicas, pg_url, chats=20, per_chat=10,
                                kill=True, lease=3, spare_unsent=True)
    finally:
        await close_replicas(replicas)
    assert result.twice > 0  # some updates did reach two replicas
    assert result.killed is not None and result.due  # a replica died holding chats
