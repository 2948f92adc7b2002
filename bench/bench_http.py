"""HTTP port benchmark: ``/healthz`` and a signed webhook under a sustained slow-loris.

Run with ``.venv/bin/python bench/bench_http.py`` (about 25 s). ``--connections`` and
``--seconds`` shrink or grow the attack.

``roost run`` starts with a 1,024 soft and hard open-file limit (systemd's default),
serving ``/healthz`` and Slack's Events endpoint (a local fake Slack) on one port with
the default settings. Then, from this process, on loopback only:

1. baseline: 200 ``/healthz`` requests, one connection each, one after another;
2. attack: ``--connections`` slow-loris clients from 40 ``127.0.0.x`` addresses, each
   sending an endless header and reconnecting as soon as Roost closes it; after 2 s
   200 more ``/healthz`` requests (10 ms apart) and 5 signed Slack events, each timed
   until Roost's reply reaches the fake Slack;
3. the log's growth from the attack's start to its end (``--seconds``, past the 10 s
   header timeout), and SIGTERM's exit code.

Every ``/healthz`` answer that is not ``200 ok`` counts as a failure (a refusal, a
reset, a 10 s hang guard).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import ms, percentile, print_table, progress, verdict
from bot.testing.hostile_http import (
    close_all,
    get,
    hold,
    outcome,
    raise_own_open_files,
    request,
    status,
)
from bot.testing.slack import FakeSlack

SCRIPT = "turns:\n  - reply: 'still here'\nloop: true\n"
ADDRESSES = [f"127.0.0.{i}" for i in range(10, 50)]
GIVE_UP = 5
"""Failed ``/healthz`` requests after which a series stops (each may take its 10 s guard)."""


def limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


async def healthz_series(port: int, count: int, gap: float) -> tuple[list[float], int]:
    """``count`` timed ``/healthz`` requests (fewer after :data:`GIVE_UP` failures); their
    latencies and how many failed."""
    times: list[float] = []
    failed = 0
    for _ in range(count):
        if failed >= GIVE_UP:
            break
        try:
            answer, seconds = await request(port, get("/healthz"), limit=10)
        except (OSError, TimeoutError) as exc:
            progress(f"healthz failed: {exc!r}")
            failed += 1
            continue
        if status(answer) == 200 and answer.endswith(b"ok\n"):
            times.append(seconds)
            if seconds > 0.05:
                progress(f"slow /healthz: {seconds * 1000:.0f} ms at {time.monotonic():.2f}")
        else:
            progress(f"healthz answered {answer[:60]!r} in {seconds:.3f}s")
            failed += 1
        await asyncio.sleep(gap)
    return times, failed


async def attacker(port: int, address: str, pause: float, opened: list[int]) -> None:
    """One slow-loris client: an endless header; ``pause`` seconds after Roost closes it (or
    refuses it), again."""
    while True:
        held = await hold(port, address)
        if held is not None:
            opened[0] += 1
            try:
                await outcome(held, 3600)
            finally:
                close_all([held])
        await asyncio.sleep(pause)


async def attack(port: int, connections: int, pause: float, seconds: float) -> None:
    """The attacking process: ``connections`` clients for ``seconds``; prints how many
    connections it made."""
    raise_own_open_files(connections + 500)
    opened = [0]
    tasks = [asyncio.create_task(attacker(port, ADDRESSES[i % len(ADDRESSES)], pause, opened))
             for i in range(connections)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(opened[0], flush=True)


async def main(connections: int, seconds: float, pause: float) -> int:
    raise_own_open_files(connections + 2000)
    began = time.perf_counter()
    slack = FakeSlack()
    await slack.start()
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        cwd = Path(tmp)
        (cwd / "script.yaml").write_text(SCRIPT)
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOST_", "SLACK_"))}
        env.update(PYTHONUNBUFFERED="1", ROOST_PROVIDER="scripted",
                   ROOST_SCRIPT=str(cwd / "script.yaml"), ROOST_STREAM_REPLIES="false",
                   ROOST_MERGE_WINDOW_MS="0", ROOST_DM_POLICY="open",
                   SLACK_BOT_TOKEN=slack.bot_token, SLACK_SIGNING_SECRET=slack.signing_secret,
                   SLACK_API_BASE=slack.base_url, ROOST_SLACK_PORT=str(port),
                   ROOST_HTTP_PORT=str(port))
        log = cwd / "roost.log"
        with log.open("wb") as sink:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "run", cwd=cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, preexec_fn=limit_open_files)
        try:
            deadline = time.monotonic() + 60
            while "roost ready" not in log.read_text(errors="replace"):
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError("roost run never got ready:\n" + log.read_text()[-2000:])
                await asyncio.sleep(0.1)
            progress("ready; baseline")
            baseline, baseline_failed = await healthz_series(port, 200, 0.0)
            progress("attack")

            size_before = log.stat().st_size
            attack_began = time.monotonic()
            # The attacker is a process of its own: its event loop, busy with thousands of
            # sockets, must not delay this one's timings.
            attacking = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--attack", str(port), "--connections",
                str(connections), "--seconds", str(seconds), "--pause", str(pause),
                stdout=asyncio.subprocess.PIPE)
            await asyncio.sleep(3)
            progress("/healthz under attack")
            under, under_failed = await healthz_series(port, 200, 0.01)
            progress(f"{under_failed} failed; webhook")
            slack.events_url = f"http://127.0.0.1:{port}/slack/events"
            webhook: list[float] = []
            for n in range(5):
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(15):  # a hang guard
                        delivery = await slack.post_event(slack.direct_message(f"ping {n}"))
                except (OSError, TimeoutError) as exc:
                    progress(f"event {n} failed: {exc!r}")
                    continue
                if delivery.status == 200:
                    await slack.wait_for("chat.postMessage", len(webhook) + 1, limit=30)
                    webhook.append(time.perf_counter() - started)
            made, _ = await attacking.communicate()
            attack_seconds = time.monotonic() - attack_began
            grown = log.stat().st_size - size_before
            proc.send_signal(signal.SIGTERM)
            try:
                code: int | None = await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                code = None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await slack.stop()

    p99_under = percentile(under, 99) if under else float("inf")
    rows = [
        ["/healthz, idle: p50 / p99", f"{ms(percentile(baseline, 50))} / "
         f"{ms(percentile(baseline, 99))}", f"{baseline_failed} of 200 failed", ""],
        [f"/healthz under {connections:,} slow-loris: p50 / p99",
         f"{ms(percentile(under, 50)) if under else '-'} / "
         f"{ms(p99_under) if under else '-'}",
         f"{under_failed} of {len(under) + under_failed} failed",
         verdict(under_failed == 0 and p99_under < 0.1)],
        ["signed Slack event to reply, median", ms(sorted(webhook)[len(webhook) // 2])
         if webhook else "-", f"{len(webhook)} of 5 answered", verdict(len(webhook) == 5)],
        [f"log growth in {attack_seconds:.0f} s of attack", f"{grown:,} bytes",
         f"{int(made or 0):,} slow-loris connections made", verdict(grown < 1 << 20)],
        ["SIGTERM exit code", str(code), "", verdict(code == 0)],
    ]
    print_table(["measurement", "value", "detail", "target"], rows)
    print(f"({time.perf_counter() - began:.0f} s; targets: /healthz p99 < 100 ms with none "
          "failed, 5 of 5 events answered, log < 1 MiB, exit 0)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--pause", type=float, default=1.0,
                        help="seconds an attacker waits after a closed connection")
    parser.add_argument("--attack", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        asyncio.run(attack(args.attack, args.connections, args.pause, args.seconds))
        sys.exit(0)
    sys.exit(asyncio.run(main(args.connections, args.seconds, args.pause)))
