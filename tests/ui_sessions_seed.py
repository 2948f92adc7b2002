"""A seeded store for the Control UI's session, run and error pages (tests and
``bench/bench_ui_sessions.py``): sessions with messages, runs with spans and
deliveries, and tool errors, written in batches straight into the tables.

Deterministic for a given ``seed``: keys, senders, words and times follow from it.
Every session key is ``agent:channel:direct:user`` or ``agent:channel:group:chat``;
messages cycle user → assistant (a tool call every third turn) → tool result.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from bot.storage import db as dbmod

WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "invoice", "shipping", "refund",
    "password", "printer", "calendar", "weather", "deploy", "backup", "database", "migration",
    "kernel", "router", "cache", "budget", "report", "summary", "travel", "booking",
)
AGENTS = ("default", "support")
CHANNELS = ("telegram", "discord", "slack")
KINDS = ("timeout", "connection_error", "permission_denied", "resource_not_found", "unknown")
TOOLS = ("shell", "web_fetch", "read_file", "sql", "memory_search")
SPAN = 7 * 86_400.0
"""How far back the first seeded session was created (inside every retention period)."""


@dataclass(frozen=True, slots=True)
class Seeded:
    """What was written: counts, and a few rows tests and the bench look up."""

    sessions: int
    messages: int
    runs: int
    errors: int
    session_ids: list[int]
    run_ids: list[str]
    error_ids: list[str]
    rare_word: str
    """A word in exactly one message (the newest session's first user message)."""


def session_key(i: int) -> str:
    """The key of the ``i``-th seeded session."""
    agent = AGENTS[i % len(AGENTS)]
    channel = CHANNELS[i % len(CHANNELS)]
    if i % 5 == 4:
        return f"{agent}:{channel}:group:g{i}"
    return f"{agent}:{channel}:direct:u{i % 1000}_{i}"


_INSERT_SESSION = ("INSERT INTO sessions (id, key, created_at, updated_at, model, provider,"
                   " input_tokens, output_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


async def _batches(db: aiosqlite.Connection, lock: asyncio.Lock, sql: str,
                   rows: Sequence[tuple[Any, ...]], size: int = 5000) -> None:
    for start in range(0, len(rows), size):
        chunk = rows[start:start + size]

        async def body(db: aiosqlite.Connection, chunk: Sequence[tuple[Any, ...]] = chunk
                       ) -> None:
            await db.executemany(sql, chunk)

        await dbmod.transaction(db, lock, body)


async def seed(db: aiosqlite.Connection, lock: asyncio.Lock, *, sessions: int = 100,
               messages: int = 3000, runs: int = 1000, errors: int = 100,
               seed: int = 1) -> Seeded:
    """Write ``sessions`` sessions holding ``messages`` messages in all, ``runs`` runs
    (two spans each; the first ``messages // 2`` runs answered the messages) and
    ``errors`` tool errors, into a migrated, empty database."""
    rnd = random.Random(seed)
    t0 = time.time() - SPAN
    session_ids: list[int] = []
    per = max(1, messages // sessions)
    rare = "zanzibarquux"
    session_rows = []
    message_rows: list[tuple[Any, ...]] = []
    run_rows: list[tuple[Any, ...]] = []
    span_rows: list[tuple[Any, ...]] = []
    run_ids: list[str] = []
    msg_id = 0
    insert_message = (
        "INSERT INTO messages (id, session_id, run_id, role, content, sender_id, sender_name,"
        " tool_calls, tool_call_id, tool_name, is_error, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    step = SPAN / 2 / max(1, sessions)
    for i in range(sessions):
        created = t0 + i * step
        count = per if i < sessions - 1 else messages - per * (sessions - 1)
        key = session_key(i)
        updated = created + count * 2.0
        session_rows.append((i + 1, key, created, updated, "model-a", "scripted",
                             count * 10, count * 5))
        user = key.rsplit(":", 1)[1] if ":direct:" in key else f"u{(i * 7) % 1000}_{i}"
        run_id = ""
        for j in range(count):
            msg_id += 1
            at = created + j * 2.0
            role = ("user", "assistant", "tool")[j % 3]
            if role == "user":
                run_id = f"run{len(run_ids):07d}"
                run_ids.append(run_id)
            text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(5, 30)))
            if i == sessions - 1 and j == 0:
                text += f" {rare}"
            calls = None
            if role == "assistant":
                calls = json.dumps([{"id": f"c{msg_id}", "name": "shell",
                                     "arguments": {"command": f"echo {text[:20]}"}}])
            message_rows.append((
                msg_id, i + 1, run_id, role, text, user if role == "user" else None,
                user if role == "user" else None, calls,
                f"c{msg_id - 1}" if role == "tool" else None,
                "shell" if role == "tool" else None, 0, at))
        if len(message_rows) >= 50_000 or i == sessions - 1:
            await _batches(db, lock, _INSERT_SESSION, session_rows)
            await _batches(db, lock, insert_message, message_rows)
            session_ids.extend(r[0] for r in session_rows)
            session_rows, message_rows = [], []
    while len(run_ids) < runs:
        run_ids.append(f"run{len(run_ids):07d}")
    run_ids = run_ids[:runs]
    for n, run_id in enumerate(run_ids):
        i = min(sessions - 1, n * sessions // max(1, runs))
        started = t0 + i * step + (n % 50) * 2.0
        status = "failed" if n % 97 == 0 else "completed"
        run_rows.append((run_id, session_key(i), status, started, started + 1.5, 2, 1000, 200,
                         "model-a", "boom" if status == "failed" else "", 600, 100))
        span_rows.append((f"{run_id}-root", run_id, None, "agent", "run", started, 1500.0, 0,
                          json.dumps({"agent": AGENTS[i % 2], "status": status})))
        span_rows.append((f"{run_id}-llm", run_id, f"{run_id}-root", "llm", "model-a",
                          started + 0.1, 900.0, 0,
                          json.dumps({"input_tokens": 1000, "output_tokens": 200,
                                      "cache_read_tokens": 600, "model": "model-a"})))
    error_rows = []
    error_ids = []
    for n in range(errors):
        i = n * sessions // max(1, errors)
        at = t0 + i * step + n * 0.001
        error_id = f"err_seed_{n:06d}"
        error_ids.append(error_id)
        kind = KINDS[n % len(KINDS)]
        raw = {"message": f"{TOOLS[n % len(TOOLS)]} failed: {rnd.choice(WORDS)}",
               "error_type": kind, "traceback": "Traceback ...\n" * 5}
        error_rows.append((error_id, at, session_key(i), TOOLS[n % len(TOOLS)],
                           json.dumps(raw, ensure_ascii=False), raw["message"][:100]))

    await _batches(db, lock, "INSERT INTO runs (id, session_key, status, started_at, ended_at,"
                   " iterations, input_tokens, output_tokens, model, error, cache_read_tokens,"
                   " cache_write_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", run_rows)
    await _batches(db, lock, "INSERT INTO spans (id, run_id, parent_id, kind, name, started_at,"
                   " duration_ms, error, attributes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   span_rows)
    await _batches(db, lock, "INSERT INTO agent_errors (id, timestamp, session_id, tool_name,"
                   " raw_error, short_summary) VALUES (?, ?, ?, ?, ?, ?)", error_rows)
    if dbmod.dialect_of(db) == "postgresql":
        for table in ("sessions", "messages"):
            await db.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                             f" (SELECT MAX(id) FROM {table}))")
    return Seeded(sessions, msg_id, len(run_rows), len(error_rows), session_ids,
                  run_ids, error_ids, rare)
