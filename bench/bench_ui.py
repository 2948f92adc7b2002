"""Control UI benchmark: every page's server time on a big store, and the live view's delay.

Run with ``.venv/bin/python bench/bench_ui.py`` (seeding about 30 s the first time
of a day, cached after; then about a minute of measuring). ``--sessions``, ``--runs``
and ``--errors`` shrink the store (messages are ten per run); ``--repeat`` sets how
often each page is fetched.

1. A store of 10,000 sessions, 1,000,000 messages, 100,000 runs with 10 spans each,
   10,000 tool errors, usage counters, inbox/outbox rows, pairing requests and cron
   jobs (``bench/ui_seed.py``; bulk inserts into Roost's own schema).
2. ``roost run`` on it (a separate process, the fake Telegram, a scripted model,
   ``ROOST_HTTP_PORT``), one admin account added by ``roost ui user add``.
3. Logged in through the login form, every page of the navigation, a text search, a
   long and a typical transcript, a run's trace and an error's detail are fetched
   ``--repeat`` times each, one after another: p50/p95 of the server's own time (its
   ``Server-Timing`` header when it sends one) and of the time to the last byte on
   loopback, and the CPU ``roost run`` spent per request (``/proc/<pid>/stat``: what the
   page costs whatever else the machine runs). Target: p95 <= 100 ms per page.
4. Live view: the ``/ui/sessions`` page's SSE stream is opened, then a DM is pushed to the
   fake Telegram; the delay from the moment Roost stored the message (its ``created_at``)
   and from the push, until the stream carries it. Target: <= 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import secrets
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import (
    add_ui_admin,
    free_port,
    percentile,
    print_table,
    progress,
    roost_process,
    telegram_env,
    verdict,
)
from bench.ui_seed import Seeded, Sizes, seeded_store
from bot.testing.telegram import ALICE, FakeTelegram

PAGE_TARGET = 0.100
LIVE_TARGET = 1.0
SCRIPT = "turns:\n  - reply: 'noted: {message}'\nloop: true\n"


@dataclass(slots=True)
class Timing:
    """One page's samples: the server's own time (``Server-Timing``, if sent) and the time
    to the last byte, in seconds."""

    path: str
    server: list[float]
    ttlb: list[float]
    status: int
    size: int
    cpu: float = 0.0
    """CPU seconds ``roost run`` spent per timed request (user + system)."""


def server_time(header: str | None) -> float | None:
    """The longest ``dur`` in a ``Server-Timing`` header, in seconds."""
    if not header:
        return None
    durations = [float(d) for d in re.findall(r"dur=([\d.]+)", header)]
    return max(durations) / 1000 if durations else None


def form_fields(page: str, name: str, password: str) -> dict[str, str]:
    """The login form's fields filled in: hidden ones as given, the password input with
    ``password``, the other text input with ``name``."""
    fields: dict[str, str] = {}
    for tag in re.findall(r"<input\b[^>]*>", page):
        field_name = re.search(r'\bname="([^"]+)"', tag)
        if not field_name:
            continue
        kind = re.search(r'\btype="([^"]+)"', tag)
        value = re.search(r'\bvalue="([^"]*)"', tag)
        kind_text = kind.group(1) if kind else "text"
        if kind_text == "password":
            fields[field_name.group(1)] = password
        elif kind_text == "hidden":
            fields[field_name.group(1)] = html.unescape(value.group(1)) if value else ""
        elif kind_text in ("text", "email"):
            fields[field_name.group(1)] = name
    return fields


async def log_in(http: aiohttp.ClientSession, base: str, name: str, password: str) -> None:
    async with http.get(f"{base}/ui/login") as reply:
        page = await reply.text()
    async with http.post(f"{base}/ui/login", data=form_fields(page, name, password),
                         allow_redirects=False) as reply:
        if reply.status not in (302, 303):
            raise SystemExit(f"login failed: {reply.status} {(await reply.text())[:300]}")


def nav_paths(page: str) -> list[str]:
    """Every ``/ui/...`` link of the navigation (the page's ``<nav>``)."""
    nav = re.search(r"<nav\b.*?</nav>", page, re.DOTALL)
    links = re.findall(r'href="(/ui/[^"#?]*)"', nav.group(0) if nav else page)
    seen: list[str] = []
    for link in links:
        if link not in seen and not link.startswith(("/ui/static", "/ui/logout")):
            seen.append(link)
    return seen


def search_path(page: str, word: str) -> str:
    """``/ui/sessions`` searched for ``word`` by the page's own search form (its text input)."""
    form = re.search(r'<form\b[^>]*method="get"[^>]*>.*?</form>', page, re.DOTALL | re.I) \
        or re.search(r"<form\b.*?</form>", page, re.DOTALL)
    names = re.findall(r'<input\b[^>]*\bname="([^"]+)"', form.group(0) if form else "")
    field = next((n for n in names if n in ("q", "query", "search", "text")),
                 names[0] if names else "q")
    return "/ui/sessions?" + urlencode({field: word})


async def time_page(http: aiohttp.ClientSession, base: str, path: str,
                    repeat: int) -> Timing:
    timing = Timing(path, [], [], 0, 0)
    for n in range(repeat + 2):
        began = time.perf_counter()
        async with http.get(base + path, allow_redirects=False) as reply:
            body = await reply.read()
            elapsed = time.perf_counter() - began
            own = server_time(reply.headers.get("Server-Timing"))
        timing.status, timing.size = reply.status, len(body)
        if n >= 2:  # two warm-ups (first request loads the UI code and templates)
            timing.ttlb.append(elapsed)
            if own is not None:
                timing.server.append(own)
    return timing


async def live_delay(http: aiohttp.ClientSession, base: str, telegram: FakeTelegram,
                     db_path: Path, rounds: int) -> list[tuple[float, float]]:
    """Per round (stored -> on the stream, pushed -> on the stream), in seconds."""
    async with http.get(f"{base}/ui/sessions") as reply:
        page = await reply.text()
    found = re.search(r'sse-connect="([^"]+)"', page)
    if not found:
        progress("/ui/sessions has no sse-connect stream")
        return []
    stream = html.unescape(found.group(1))
    delays = []
    for n in range(rounds):
        token = f"live{secrets.token_hex(6)}"
        async with http.get(base + stream, timeout=aiohttp.ClientTimeout(total=30)) as events:
            await asyncio.sleep(0.3)  # the stream is subscribed before the message comes
            pushed_at = time.time()
            telegram.private_message(f"{token} number {n}",
                                     sender={**ALICE, "id": 4242 + n % 3})
            seen = b""
            async with asyncio.timeout(15):
                while token.encode() not in seen:
                    seen = seen[-200:] + await events.content.readany()
            arrived = time.time()
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT created_at FROM messages WHERE content LIKE ?",
                             (f"{token}%",)).fetchone()
        stored = float(row[0]) if row else pushed_at
        delays.append((arrived - stored, arrived - pushed_at))
    return delays


async def measure(seeded: Seeded, work: Path, repeat: int, live_rounds: int,
                  only: list[str]) -> int:
    port = free_port()
    async with FakeTelegram() as telegram:
        env = telegram_env(work / "data", telegram, None)
        (work / "script.yaml").write_text(SCRIPT)
        env.update(ROOST_HTTP_PORT=str(port), ROOST_SCRIPT=str(work / "script.yaml"),
                   ROOST_LOG_LEVEL="INFO")
        name = "bench"
        password = await asyncio.to_thread(add_ui_admin, work, env, name)
        base = f"http://127.0.0.1:{port}"
        with roost_process(env, work) as roost:
            progress("roost run starting on the seeded store")
            ready = await asyncio.to_thread(roost.wait_line, "roost ready", 300)
            progress(f"ready after {ready:.1f}s; pid {roost.proc.pid} (for py-spy)")
            # unsafe: keep the cookies of an IP address (127.0.0.1).
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                await log_in(http, base, name, password)
                async with http.get(f"{base}/ui/") as reply:
                    overview = await reply.text()
                async with http.get(f"{base}/ui/sessions") as reply:
                    sessions_page = await reply.text()
                paths = nav_paths(overview)
                paths += [search_path(sessions_page, seeded.rare_word),
                          search_path(sessions_page, seeded.common_word),
                          f"/ui/sessions/{seeded.big_session_id}",
                          f"/ui/sessions/{seeded.small_session_id}",
                          f"/ui/runs/{quote(seeded.run_id)}",
                          f"/ui/errors/{quote(seeded.error_id)}"]
                if only:
                    paths = [p for p in paths if any(o in p for o in only)]
                timings = []
                for path in paths:
                    progress(f"GET {path}")
                    cpu = roost.cpu_seconds()
                    timing = await time_page(http, base, path, repeat)
                    # Over the warm-ups too (the first request of a page fills caches).
                    timing.cpu = (roost.cpu_seconds() - cpu) / (repeat + 2)
                    timings.append(timing)
                progress("live view")
                delays = await live_delay(http, base, telegram, work / "data" / "roost.db",
                                          live_rounds)
                rss = roost.rss_mb()
    return report(seeded, timings, delays, ready, rss)


def report(seeded: Seeded, timings: list[Timing], delays: list[tuple[float, float]],
           ready: float, rss: float) -> int:
    misses = 0
    rows = []
    for t in timings:
        basis = t.server or t.ttlb
        p95 = percentile(basis, 95)
        ok = t.status == 200 and p95 <= PAGE_TARGET
        misses += not ok
        server = (f"{percentile(t.server, 50) * 1000:.1f} / {percentile(t.server, 95) * 1000:.1f}"
                  if t.server else "-")
        last_byte = f"{percentile(t.ttlb, 50) * 1000:.1f} / {percentile(t.ttlb, 95) * 1000:.1f}"
        rows.append((t.path[:60], str(t.status), f"{t.size:,}", server, last_byte,
                     f"{t.cpu * 1000:.1f}", verdict(ok)))
    print_table(("page", "status", "bytes", "server p50 / p95 ms", "last byte p50 / p95 ms",
                 "CPU ms/request", "<= 100 ms"), rows)
    print()
    stored = [d[0] for d in delays] or [float("inf")]
    pushed = [d[1] for d in delays] or [float("inf")]
    live_ok = max(stored) <= LIVE_TARGET
    misses += not live_ok
    print(f"live view, {len(delays)} DMs: stored -> on the SSE stream p50 "
          f"{percentile(stored, 50) * 1000:.0f} ms, max {max(stored) * 1000:.0f} ms; pushed to "
          f"Telegram -> on the stream p50 {percentile(pushed, 50) * 1000:.0f} ms, max "
          f"{max(pushed) * 1000:.0f} ms  [{verdict(live_ok)} <= 1 s]")
    print(f"seeding {seeded.seconds:.1f}s ({'cached' if not seeded.seconds else 'fresh'}), "
          f"roost ready after {ready:.1f}s, RSS after the run {rss:.0f} MiB, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    full = Sizes()
    parser.add_argument("--sessions", type=int, default=full.sessions)
    parser.add_argument("--runs", type=int, default=full.runs)
    parser.add_argument("--errors", type=int, default=full.errors)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--live", type=int, default=10, help="DMs timed on the live view")
    parser.add_argument("--only", action="append", default=[],
                        help="time only the pages whose path contains this (repeatable)")
    args = parser.parse_args()
    sizes = Sizes(args.sessions, args.runs, args.errors)
    with tempfile.TemporaryDirectory(prefix="roost-bench-ui-") as tmp:
        work = Path(tmp)
        progress(f"seeding {sizes.sessions:,} sessions, {sizes.messages:,} messages, "
                 f"{sizes.runs:,} runs, {sizes.errors:,} errors (cached per day and schema)")
        seeded = seeded_store(work / "data" / "roost.db", sizes)
        misses = asyncio.run(measure(seeded, work, args.repeat, args.live, args.only))
    raise SystemExit(1 if misses else 0)


if __name__ == "__main__":
    main()
