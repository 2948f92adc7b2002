"""Control UI operations pages (usage, access, outbox, jobs, plugins, approvals): page times
on a big store.

Run with ``.venv/bin/python bench/bench_ui_ops.py`` (about two minutes: seeding, then
``--repeat`` fetches of each page). ``--scale 0.1`` shrinks every table.

1. A store seeded straight into Roost's migrated SQLite schema: 10,000 sessions with
   1,000,000 messages, 100,000 runs, 10,000 tool errors, a year of usage counters
   (per day and month: 300 users, 30 groups, 3 agents, 3 models and 50 jobs a day),
   10,000 paired users and 5,000 pairing requests (50 pending), 100,000 delivered
   replies and 2,500 open ones (500 given up), 2,000 cron jobs with 50 fires each
   (100,000 ``job_runs`` rows, each naming a run), 100,000 approvals (20 pending).
2. ``roost run`` on it (a separate process: the fake Telegram, the demo script,
   ``ROOST_HTTP_PORT``), one admin added by ``roost ui user add``.
3. Logged in, each page is fetched ``--repeat`` times one after another (two
   warm-ups first): p50/p95 of the time to the last byte on loopback, which bounds
   the server time from above (target: p95 <= 100 ms), and the CPU time ``roost run``
   spent per request (its ``/proc/<pid>/stat`` over all the fetches of the page, so
   what the page costs apart from waiting for a CPU on a loaded machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import percentile, print_table, progress, roost_process, telegram_env, verdict
from bot.storage.sessions import SessionStore
from bot.testing.telegram import FakeTelegram
from bot.testing.ui import UiClient

TARGET = 0.100
DAY = 86_400.0


def _ids(n: int) -> list[str]:
    return [secrets.token_hex(16) for _ in range(n)]


async def _migrate(path: Path) -> None:
    store = await SessionStore.open(path)
    await store.close()


def seed(path: Path, scale: float) -> dict[str, str]:
    """Fill a migrated database at ``path``; returns cursors for paged fetches."""
    asyncio.run(_migrate(path))
    rng = random.Random(29)
    now = time.time()
    n = {k: max(10, int(v * scale)) for k, v in dict(
        sessions=10_000, messages=1_000_000, runs=100_000, errors=10_000, paired=10_000,
        requests=5_000, delivered=100_000, open=2_500, jobs=2_000,
        approvals=100_000).items()}
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("BEGIN")
    db.execute(
        "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < ?)"
        " INSERT INTO sessions (id, key, created_at, updated_at) SELECT n,"
        " 'default:telegram:direct:' || n, ? - n * 60, ? - n * 30 FROM i",
        (n["sessions"], now, now))
    db.execute(
        "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < ?)"
        " INSERT INTO messages (session_id, run_id, role, content, created_at)"
        " SELECT 1 + n % ?, 'r' || (n / 10), CASE n % 2 WHEN 0 THEN 'user' ELSE 'assistant'"
        " END, 'message number ' || n || ' about the invoice and the deploy', ? - n FROM i",
        (n["messages"], n["sessions"], now))
    run_ids = _ids(n["runs"])
    models = ("claude-sonnet-4-5", "claude-haiku-4-5", "gpt-4.1")
    db.executemany(
        "INSERT INTO runs (id, session_key, status, started_at, ended_at, iterations,"
        " input_tokens, output_tokens, model, cache_read_tokens) VALUES (?, ?, ?, ?, ?, 1,"
        " ?, ?, ?, ?)",
        [(rid, f"default:telegram:direct:{rng.randrange(n['sessions'])}",
          "failed" if i % 50 == 0 else "completed", now - i * 20, now - i * 20 + 3,
          rng.randrange(500, 5000), rng.randrange(50, 800), models[i % 3],
          rng.randrange(0, 400)) for i, rid in enumerate(run_ids)])
    db.executemany(
        "INSERT INTO agent_errors (id, timestamp, session_id, tool_name, raw_error,"
        " short_summary) VALUES (?, ?, ?, 'exec', 'Traceback ...', 'exit 1')",
        [(f"err_{i:08x}", now - i * 200, f"s{i % 500}") for i in range(n["errors"])])
    # A year of usage counters, per day, and per month.
    rows: dict[tuple[str, str, str], list[float]] = {}
    users = max(10, int(300 * scale))
    for d in range(365):
        moment = now - d * DAY
        day = time.strftime("%Y-%m-%d", time.gmtime(moment))
        month = day[:7]
        subjects = ([("user", f"telegram:{rng.randrange(n['sessions'])}") for _ in range(users)]
                    + [("group", f"telegram:-{g}") for g in range(max(3, int(30 * scale)))]
                    + [("agent", a) for a in ("default", "research", "coder")]
                    + [("model", m) for m in models]
                    + [("job", f"cron:j{j:05d}") for j in range(max(5, int(50 * scale)))])
        for scope, subject in subjects:
            spent = [rng.randrange(100, 20_000), rng.randrange(10, 4000),
                     rng.random() / 10, rng.randrange(0, 5000)]
            for period in (day, month):
                counter = rows.setdefault((scope, subject, period), [0, 0, 0.0, 0, 0])
                counter[0] += spent[0]
                counter[1] += spent[1]
                counter[2] += spent[2]
                counter[3] += spent[3]
                counter[4] += 1
    db.executemany(
        "INSERT INTO usage (scope, subject, period, input_tokens, output_tokens, cost,"
        " cache_read_tokens, runs) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(*key, *values) for key, values in rows.items()])
    db.executemany(
        "INSERT INTO paired_users (channel, user_id, display_name, approved_by, approved_at)"
        " VALUES ('telegram', ?, ?, 'cli', ?)",
        [(str(i), f"user {i}", now - i * 300) for i in range(n["paired"])])
    db.executemany(
        "INSERT INTO pairing_requests (code, channel, user_id, chat_id, display_name, state,"
        " created_at, expires_at, notified_at) VALUES (?, 'telegram', ?, ?, ?, ?, ?, ?, ?)",
        [(f"C{i:07d}", f"9{i}", f"9{i}", f"stranger {i}",
          "pending" if i < 50 else "approved", now - i * 60,
          now + 3000 if i < 50 else now - i * 60 + 3600, now - i * 60)
         for i in range(n["requests"])])
    message = '{"channel": "telegram", "chat_id": "1", "text": "the answer"}'
    db.executemany(
        "INSERT INTO outbox (channel, chat_id, message, state, attempts, created_at,"
        " updated_at, last_error) VALUES ('telegram', ?, ?, ?, ?, ?, ?, ?)",
        [(str(i % 1000), message, "delivered", 1, now - (n["delivered"] - i) * 5,
          now - (n["delivered"] - i) * 5, None) for i in range(n["delivered"])]
        + [(str(i), message, "failed" if i % 5 == 0 else "pending", 1 + i % 5,
            now - (n["open"] - i), now - (n["open"] - i), "502 Bad Gateway")
           for i in range(n["open"])])
    db.executemany(
        "INSERT INTO jobs (id, kind, name, schedule, timezone, message, owner_id, channel,"
        " chat_id, created_at) VALUES (?, 'cron', ?, 'every 1h', 'UTC', 'report', ?,"
        " 'telegram', ?, ?)",
        [(f"j{j:05d}", f"job {j}", str(j), str(j), now - j * 100) for j in range(n["jobs"])])
    fires = min(50, max(1, n["runs"] // n["jobs"]))
    db.executemany(
        "INSERT INTO job_runs (job_id, fired_at, ended_at, run_id, status) VALUES"
        " (?, ?, ?, ?, 'completed')",
        [(f"j{j:05d}", now - f * 3600, now - f * 3600 + 5, run_ids[(j * fires + f) % len(run_ids)])
         for j in range(n["jobs"]) for f in range(fires)])
    arguments = '{"command": "rm -rf ./build && make release"}'
    db.executemany(
        "INSERT INTO approvals (id, inbox_id, call_id, run_id, session_key, session_id,"
        " channel, chat_id, chat_type, thread_id, requester, tool, arguments, state,"
        " decided_by, decided_at, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?,"
        " 'telegram', ?, 'direct', NULL, ?, 'exec', ?, ?, ?, ?, ?, ?)",
        [(secrets.token_hex(10), i, f"call{i}", run_ids[i % len(run_ids)],
          f"default:telegram:direct:{i % n['sessions']}", 1 + i % n["sessions"],
          str(i % n["sessions"]), str(i % n["sessions"]), arguments,
          "pending" if i < 20 else ("approved", "denied", "timeout")[i % 3],
          None if i < 20 else f"user {i % 50}", None if i < 20 else now - i * 30 + 20,
          now - i * 30, now - i * 30 + 300) for i in range(n["approvals"])])
    db.execute("COMMIT")
    db.execute("ANALYZE")
    middle = db.execute("SELECT id FROM outbox WHERE state IN ('pending', 'failed')"
                        " ORDER BY id LIMIT 1 OFFSET ?", (n["open"] // 2,)).fetchone()
    paired = db.execute("SELECT approved_at, channel, user_id FROM paired_users ORDER BY"
                        " approved_at DESC LIMIT 1 OFFSET ?", (n["paired"] // 2,)).fetchone()
    job = db.execute("SELECT created_at, id FROM jobs ORDER BY created_at, id LIMIT 1"
                     " OFFSET ?", (n["jobs"] // 2,)).fetchone()
    asked = db.execute("SELECT created_at, id FROM approvals WHERE state <> 'pending' ORDER BY"
                       " created_at DESC, id DESC LIMIT 1 OFFSET ?",
                       (n["approvals"] // 2,)).fetchone()
    db.close()
    return {"outbox": str(middle[0]), "access": quote(f"{paired[0]!r}~{paired[1]}:{paired[2]}"),
            "jobs": quote(f"{job[0]!r}~{job[1]}"), "approvals": quote(f"{asked[0]!r}~{asked[1]}")}


def add_admin(cwd: Path, env: dict[str, str]) -> str:
    """``roost ui user add bench --role admin --password-stdin``; the password."""
    password = secrets.token_urlsafe(12)
    result = subprocess.run(
        [sys.executable, "-m", "bot", "ui", "user", "add", "bench", "--role", "admin",
         "--password-stdin"], cwd=cwd, env=env, input=password + "\n",
        capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"roost ui user add failed: {result.stderr.strip()}")
    return password


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(work: Path, cursors: dict[str, str], repeat: int) -> bool:
    port = free_port()
    async with FakeTelegram() as telegram:
        env = telegram_env(work / "data", telegram, None)
        env.update(ROOST_HTTP_PORT=str(port))
        password = await asyncio.to_thread(add_admin, work, env)
        with roost_process(env, work) as roost:
            ready = await asyncio.to_thread(roost.wait_line, "roost ready", 300)
            progress(f"roost run ready after {ready:.1f}s")
            async with UiClient(f"http://127.0.0.1:{port}") as client:
                status, _ = await client.log_in("bench", password)
                if status != 200:
                    raise SystemExit(f"login failed: {status}")
                paths = ["/ui/usage", "/ui/usage?days=365", "/ui/access",
                         f"/ui/access?before={cursors['access']}", "/ui/outbox",
                         f"/ui/outbox?before={cursors['outbox']}", "/ui/jobs",
                         f"/ui/jobs?after={cursors['jobs']}", "/ui/plugins", "/ui/approvals",
                         f"/ui/approvals?before={cursors['approvals']}"]
                rows, ok = [], True
                for path in paths:
                    samples = []
                    for _ in range(2):
                        await client.get(path)
                    cpu = cpu_seconds(roost.proc.pid)
                    for _ in range(repeat):
                        began = time.perf_counter()
                        status, body = await client.get(path)
                        samples.append(time.perf_counter() - began)
                    cpu = (cpu_seconds(roost.proc.pid) - cpu) / repeat
                    p50, p95 = percentile(samples, 50), percentile(samples, 95)
                    ok = ok and status == 200 and p95 <= TARGET
                    rows.append([path, str(status), f"{len(body) // 1024} KB",
                                 f"{p50 * 1000:.1f} ms", f"{p95 * 1000:.1f} ms",
                                 f"{cpu * 1000:.1f} ms",
                                 verdict(status == 200 and p95 <= TARGET)])
                print_table(["Page", "Status", "Size", "p50", "p95", "CPU/request",
                             "<= 100 ms"], rows)
                print(f"load average during the run: {os.getloadavg()[0]:.1f} "
                      f"on {os.cpu_count()} CPUs")
                return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="roost-bench-ui-ops-") as tmp:
        work = Path(tmp)
        (work / "data").mkdir()
        began = time.perf_counter()
        cursors = seed(work / "data" / "roost.db", args.scale)
        progress(f"seeded in {time.perf_counter() - began:.1f}s")
        ok = asyncio.run(measure(work, cursors, args.repeat))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
