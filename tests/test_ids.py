"""Run and span ids (bot.observability.tracing.hex_id): random hex, unique, new after a fork."""

from __future__ import annotations

import multiprocessing
import re

from bot.observability.tracing import hex_id


def test_ids_are_lowercase_hex_of_the_asked_length_and_do_not_repeat() -> None:
    ids = {hex_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert re.fullmatch(r"[0-9a-f]{16}", hex_id(16))


def _child_id(conn: multiprocessing.connection.Connection) -> None:
    conn.send(hex_id())
    conn.close()


def test_a_forked_child_does_not_hand_out_the_parents_next_ids() -> None:
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_id, args=(child_end,))
    child.start()
    from_child = parent_end.recv()
    child.join()
    assert from_child != hex_id()
