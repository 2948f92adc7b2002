"""Durability under fire: ``roost run`` killed, faulted and starved of its model.

Each scenario runs ``roost run`` as a separate process against the fake
Telegram Bot API (long polling) and the fake Messages API, through the real
aiogram and anthropic SDKs (see :mod:`bot.testing.chaos`):

* ``kills``: users chat continuously (plain, slowly streamed and tool-using
  turns) while the process is killed with SIGKILL 200 times, at four kinds of
  moment in turn: right after an acknowledgement, during a streamed answer,
  right after the model asked for a tool, at a random time; restarted on the
  same data dir each time. Target: 0 lost, 0 answered twice, 0 tools run twice.
* ``faults``: 20 % of Bot API calls and 20 % of model calls fail in every way
  the fakes know, for 60 s. Target: every message answered exactly once, no
  call inside a 429 window, no frozen draft.
* ``outage``: every model call answers 529 for 60 s while 20 messages wait.
  Target: at most 2 model requests/s in all, every message answered after the
  model is back.

    .venv/bin/python bench/bench_chaos.py                # all three, ~15 min
    .venv/bin/python bench/bench_chaos.py kills --kills 20
    .venv/bin/python bench/bench_chaos.py faults --users 300 --seconds 30   # 300 DMs
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.testing.anthropic import busiest
from bot.testing.chaos import ChaosConfig, ChaosRun


async def kills(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = await ChaosRun(Path(tmp), ChaosConfig(kills=count, users=8)).run()
    print(f"\n## kills: {count} x SIGKILL, 8 users chatting")
    print("\n".join(report.lines()))


async def faults(seconds: float, share: float, users: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = await ChaosRun(Path(tmp), ChaosConfig(
            kills=0, duration=seconds, users=users, platform_faults=share,
            llm_faults=share)).run()
    print(f"\n## faults: {share:.0%} of Bot API and model calls failing for {seconds:g} s, "
          f"{users} users chatting")
    print("\n".join(report.lines()))


async def outage(seconds: float, waiting: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = ChaosRun(Path(tmp), env={"ROOST_RUN_TIMEOUT": str(seconds + 120)})
        async with run.telegram, run.model:
            proc = await run.spawn(0)
            run.model.faults.start_outage(seconds)
            began = time.monotonic()
            for i in range(waiting):
                run.say(i, "plain")
            await asyncio.sleep(seconds)
            during = [t for t in run.model.arrivals if began <= t < began + seconds]
            await run.telegram.wait_until(run.all_answered, limit=180)
            recovered = time.monotonic() - began - seconds
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        report = run.count()
    notices = sum(1 for s in run.sent for t in run.telegram.visible(s.chat_id)
                  if t.startswith("The AI service"))
    print(f"\n## outage: every model call 529 for {seconds:g} s, {waiting} messages waiting")
    print(f"model requests during the outage  {len(during)} "
          f"({len(during) / seconds:.2f}/s average, busiest second {busiest(during, 1.0)})")
    print(f"requests per waiting message      {len(during) / waiting:.1f}")
    print(f"held notices shown                {notices}")
    print(f"answered after recovery           {report.answered}/{report.acknowledged} "
          f"(last one {recovered:.1f} s after the model came back)")
    print(f"lost                              {len(report.lost)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", default=["kills", "faults", "outage"])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--share", type=float, default=0.2)
    parser.add_argument("--users", type=int, default=8, help="users chatting in `faults`")
    args = parser.parse_args()
    for name in args.scenarios:
        if name == "kills":
            asyncio.run(kills(args.kills))
        elif name == "faults":
            asyncio.run(faults(args.seconds, args.share, args.users))
        elif name == "outage":
            asyncio.run(outage(args.seconds, 20))
        else:
            parser.error(f"unknown scenario {name!r}")


if __name__ == "__main__":
    main()
