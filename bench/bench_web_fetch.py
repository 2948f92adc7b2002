"""web_fetch memory benchmark: what fetching 3.9 MB pages adds to a ``roost run``.

Run with ``.venv/bin/python bench/bench_web_fetch.py`` (about a minute on 2 cores);
``--code DIR`` runs ``roost run`` from another checkout of Roost (the same bench
against older code: ``git archive <commit> | tar -x -C DIR``).

A local site on 127.0.0.1 serves 3.9 MB article pages (``bot.testing.web_pages``);
the fake Anthropic API scripts the model: one turn that fetches one small page
(the imports and parsers warm), then one turn that calls ``web_fetch`` on 1 page,
or on 4 pages in one answer (the executor runs them at once). Each case runs in a
fresh ``roost run`` (console channel). Reported: RSS once warm (before), the peak
(``VmHWM``) during the big turn, and RSS 2 s after its reply (after).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import print_table, roost_process, verdict
from bot.testing.anthropic import FakeAnthropic
from bot.testing.anthropic_script import ToolUse
from bot.testing.web import FakeSite
from bot.testing.web_pages import article

PAGE_SIZE = 3_900_000
PEAK_TARGET = 64.0  # MiB added by one fetch
RETURN_TARGET = 10.0  # MiB kept after it


def vm(pid: int, field: str) -> float:
    """``VmRSS``/``VmHWM`` of ``pid`` in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


async def wait_requests(fake: FakeAnthropic, count: int, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while len(fake.requests) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the model got {len(fake.requests)} of {count} requests")
        await asyncio.sleep(0.05)


async def one_case(pages: int, code: Path | None) -> tuple[float, float, float, float]:
    """(RSS ready, RSS warm, peak, RSS after) in MiB for one turn fetching ``pages``."""
    async with FakeSite() as site, FakeAnthropic() as fake:
        site.page("/small", "<html><head><title>Small</title></head><body><article><h1>Hi"
                  "</h1>" + "<p>A small page to warm the parsers up.</p>" * 30
                  + "</article></body></html>")
        for i in range(pages):
            site.page(f"/big{i}", article(PAGE_SIZE, seed=i))
        fake.reply_tool_calls(ToolUse("web_fetch", {"url": site.url("/small")}))
        fake.reply_text("warm")
        fake.reply_tool_calls(*(ToolUse("web_fetch", {"url": site.url(f"/big{i}")})
                                for i in range(pages)))
        fake.reply_text("read")
        with tempfile.TemporaryDirectory() as tmp:
            drop = ("ROOST_", "TELEGRAM_", "DISCORD_", "SLACK_", "ANTHROPIC_", "OPENAI_")
            env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
            env.update(ROOST_DATA_DIR=str(Path(tmp) / "data"), ROOST_CONSOLE="1",
                       ROOST_LOG_LEVEL="INFO", ROOST_PROVIDER="anthropic",
                       ANTHROPIC_API_KEY="x", ANTHROPIC_BASE_URL=fake.base_url,
                       ROOST_WEB_ALLOW_PRIVATE="127.0.0.1/32", ROOST_STREAM_REPLIES="false")
            if code is not None:
                env["PYTHONPATH"] = str(code)
            with roost_process(env, Path(tmp), stdin_pipe=True) as roost:
                await asyncio.to_thread(roost.wait_ready, 60.0)
                pid = roost.proc.pid
                ready = vm(pid, "VmRSS")
                stdin = roost.proc.stdin
                assert stdin is not None
                stdin.write("read the small page\n")
                stdin.flush()
                await wait_requests(fake, 2)
                await asyncio.sleep(2.0)
                warm = vm(pid, "VmRSS")
                stdin.write("read the big pages\n")
                stdin.flush()
                await wait_requests(fake, 4)
                await asyncio.sleep(2.0)
                peak, after = vm(pid, "VmHWM"), vm(pid, "VmRSS")
                code_, _ = roost.stop()
                if code_ != 0:
                    raise RuntimeError(f"roost run exited {code_}: {roost.stderr_tail()}")
        return ready, warm, peak, after


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, help="run roost run from this checkout")
    args = parser.parse_args()
    rows = []
    verdicts = []
    for pages in (1, 4):
        ready, warm, peak, after = await one_case(pages, args.code)
        ok = peak - warm <= PEAK_TARGET * (1 if pages == 1 else 1.5) \
            and after - warm <= RETURN_TARGET
        verdicts.append(verdict(ok))
        rows.append([f"{pages} x 3.9 MB", f"{ready:.0f}", f"{warm:.0f}", f"{peak:.0f}",
                     f"+{peak - warm:.0f}", f"{after:.0f}", f"{after - warm:+.0f}",
                     verdicts[-1]])
    print_table(["turn", "RSS ready", "RSS warm (before)", "peak", "added",
                 "RSS after", "kept", "verdict"], rows)
    print(f"targets: one fetch adds <= {PEAK_TARGET:.0f} MiB, 4 at once <= "
          f"{PEAK_TARGET * 1.5:.0f} MiB (one conversion at a time); <= {RETURN_TARGET:.0f} MiB "
          "kept after the turn")


if __name__ == "__main__":
    asyncio.run(main())
