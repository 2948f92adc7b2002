"""Media benchmark: what a photo message costs Roost per turn, and whether memory comes back.

Run with ``.venv/bin/python bench/bench_media.py`` (about a minute on 2 cores);
``--photos N`` changes the count (default 100), ``--in-process-only`` skips part 1.

The photo is a 4000×3000 JPEG made on the spot (about 3 MB at quality 90, with
photo-like detail: smooth structure plus sensor-like noise), as phones send.

Part 1, ``roost run`` as a separate process, configured as in production: the
Telegram channel (aiogram, long polling) against :class:`bot.testing.telegram.FakeTelegram`,
which serves the photo through ``getFile`` and its file URL as the Bot API does,
and the Anthropic provider (the real SDK) against a fake Messages API that
answers at once. Each photo comes from a new chat (one photo per session, so
no turn re-sends earlier photos); so does each text message of the baseline.
The CPU time of the roost process (user + system, from ``/proc``) is read
around rounds of 20 photo turns and 20 text turns; the per-photo overhead of a
round is the difference divided by 20 (download, sniff, store, inspect, resize,
re-encode, base64, the larger request), and the median over the rounds is
reported. RSS is read at idle (median of 5 samples, once the provider has handed its
photo buffers back) after a warm-up of 20 photos and after every round, and compared
with a second process that gets text in place of photos.

Part 2, in this process, the same code path without the network: the intake
(:func:`bot.media.intake.receive`: sniff, store, inspect) and the provider's
preparation (:func:`plugins.anthropic_request.to_anthropic_messages`: resize,
re-encode, base64) and the request body's encoding as the provider does it
(:func:`plugins.anthropic_body.encode_messages`), per photo; CPU by
:func:`time.process_time` (all threads), median over the photos, and the split
between the steps.

Targets (issue 15): at most 60 ms CPU per photo; RSS back within 5 MB after 100 photos.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
from aiohttp import web
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import InstantAnthropic, roost_process, telegram_env, verdict  # noqa: E402
from bot.config.settings import Settings  # noqa: E402
from bot.contracts.llm import ChatMessage  # noqa: E402
from bot.contracts.messages import Attachment, InboundMessage  # noqa: E402
from bot.media.intake import receive  # noqa: E402
from bot.media.reader import (  # noqa: E402
    ANTHROPIC_MAX_PIXELS,
    RELEASE_AFTER_SECONDS,
    MediaReader,
)
from bot.testing.telegram import Call, FakeTelegram, user  # noqa: E402
from plugins.anthropic_body import encode_messages  # noqa: E402
from plugins.anthropic_request import to_anthropic_messages  # noqa: E402

TARGET_CPU_MS = 60.0
TARGET_RSS_MB = 5.0
ROUND = 20
WARMUP = 20
FIRST_CHAT = 50_000
READY_TIMEOUT_S = 60.0


def photo_jpeg(width: int = 4000, height: int = 3000, quality: int = 90) -> bytes:
    """A photo-like JPEG: smooth structure at several scales plus fine noise."""
    coarse = Image.effect_noise((width // 16, height // 16), 80).convert("L")
    green = coarse.resize((width, height), Image.Resampling.BICUBIC)
    red = Image.linear_gradient("L").resize((width, height))
    blue = Image.effect_noise((width // 4, height // 4), 60).resize(
        (width, height), Image.Resampling.BILINEAR)
    image = Image.merge("RGB", (red, green, blue))
    noise = Image.effect_noise((width, height), 12).convert("RGB")
    image = Image.blend(image, noise, 0.15)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


# -- part 1: roost run ---------------------------------------------------------------


class Replies:
    """Waits for the bot's sendMessage to each chat."""

    def __init__(self, fake: FakeTelegram) -> None:
        self.waiting: dict[int, asyncio.Future[None]] = {}
        fake.record = False
        fake.on_call = self._on_call

    def _on_call(self, call: Call) -> None:
        if call.method != "sendMessage":
            return
        chat = call.params.get("chat_id")
        future = self.waiting.pop(chat, None) if isinstance(chat, int) else None
        if future is not None and not future.done():
            future.get_loop().call_soon_threadsafe(future.set_result, None)

    def expect(self, chat: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[chat] = future
        return future


@contextlib.asynccontextmanager
async def fakes() -> AsyncIterator[tuple[FakeTelegram, SeeingAnthropic]]:
    async with FakeTelegram() as telegram, SeeingAnthropic() as anthropic:
        yield telegram, anthropic


class SeeingAnthropic(InstantAnthropic):
    """The instant Messages API fake, counting the requests whose last message holds an
    image block."""

    images = 0

    async def _receive(self, request: web.Request, api_key: str | None) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        content = (body.get("messages") or [{}])[-1].get("content")
        if isinstance(content, list) and any(b.get("type") == "image" for b in content):
            self.images += 1
        return body


@contextlib.asynccontextmanager
async def roost_run(env: dict[str, str], cwd: Path) -> AsyncIterator[psutil.Process]:
    """``roost run``, ready once it logs ``roost ready``; stopped with SIGTERM."""
    with roost_process(env, cwd) as roost:
        await asyncio.to_thread(roost.wait_ready, READY_TIMEOUT_S)
        try:
            yield psutil.Process(roost.proc.pid)
        finally:
            await asyncio.to_thread(roost.stop, 15)


async def idle_rss(process: psutil.Process) -> int:
    """RSS once the process is idle: the median of 5 samples over a second, taken after
    the provider handed its photo buffers back (``RELEASE_AFTER_SECONDS`` of quiet)."""
    await asyncio.sleep(RELEASE_AFTER_SECONDS + 0.5)
    samples = []
    for _ in range(5):
        samples.append(process.memory_info().rss)
        await asyncio.sleep(0.2)
    return int(statistics.median(samples))


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def bench_process(photo: bytes, photos: int, *, with_photos: bool = True
                        ) -> dict[str, Any]:
    """Rounds of text and photo turns; ``with_photos=False`` sends text instead of each
    photo after the warm-up (the baseline for what new sessions alone cost in RSS)."""
    rounds = max(1, photos // ROUND)
    async with fakes() as (telegram, anthropic):
        replies = Replies(telegram)
        with tempfile.TemporaryDirectory() as tmp:
            env = telegram_env(Path(tmp) / "data", telegram, anthropic)
            async with roost_run(env, Path(tmp)) as proc:
                chat = FIRST_CHAT

                async def turn(kind: str) -> None:
                    nonlocal chat
                    chat += 1
                    sender = user(chat, f"U{chat}")
                    done = replies.expect(chat)
                    if kind == "photo":
                        telegram.photo(photo, sender=sender)
                    else:
                        telegram.private_message("what is in the picture?", sender=sender)
                    await asyncio.wait_for(done, 30)

                for _ in range(WARMUP):
                    await turn("text")
                    await turn("photo")
                rss_start = await idle_rss(proc)
                overheads: list[float] = []
                photo_turns: list[float] = []
                text_turns: list[float] = []
                rss_rounds: list[int] = []
                for _ in range(rounds):
                    before = cpu_seconds(proc)
                    for _ in range(ROUND):
                        await turn("text")
                    mid = cpu_seconds(proc)
                    for _ in range(ROUND):
                        await turn("photo" if with_photos else "text")
                    after = cpu_seconds(proc)
                    text_turns.append((mid - before) / ROUND)
                    photo_turns.append((after - mid) / ROUND)
                    overheads.append(photo_turns[-1] - text_turns[-1])
                    rss_rounds.append(await idle_rss(proc))
                rss_end = rss_rounds[-1]
        expected = WARMUP + (rounds * ROUND if with_photos else 0)
        if anthropic.images != expected:
            raise RuntimeError(f"{anthropic.images} model requests carried an image, expected "
                               f"{expected}: photos did not reach the model")
    return {
        "photos": rounds * ROUND, "overhead": overheads, "photo_turn": photo_turns,
        "text_turn": text_turns, "rss_start": rss_start, "rss_end": rss_end,
        "rss_rounds": rss_rounds,
    }


# -- part 2: in process ----------------------------------------------------------------


async def bench_in_process(photo: bytes, photos: int) -> dict[str, Any]:
    settings = Settings()
    workspace = Path(tempfile.mkdtemp(prefix="bench-media-"))
    process = psutil.Process()

    async def download(attachment: Attachment, limit: int) -> bytes:
        return photo

    steps: dict[str, list[float]] = {"intake": [], "prepare": [], "json": [], "total": []}
    rss: list[int] = []
    try:
        for n in range(WARMUP + photos):
            if n == WARMUP:
                gc.collect()
                rss.append(process.memory_info().rss)
            message = InboundMessage(
                "telegram", str(n), "direct", str(n), "", message_id=str(n),
                attachments=(Attachment("photo", f"photo-{n}.jpg", f"file-{n}", "image/jpeg",
                                        len(photo), width=4000, height=3000),))
            reader = MediaReader(documents=True, max_pixels=ANTHROPIC_MAX_PIXELS)
            start = time.process_time()
            received = await receive(message, workspace, download, settings)
            took_in = time.process_time()
            history = [ChatMessage("user", received.text, parts=tuple(received.parts))]
            messages = to_anthropic_messages(history, media=reader)
            prepared = time.process_time()
            # The body as the provider puts it together (open_stream), base64 spliced in.
            body = b"".join((b'{"model":"m","max_tokens":1024,"messages":',
                             *encode_messages(messages), b',"stream":true}'))
            encoded = time.process_time()
            assert b'"type":"image"' in body, received.lines
            if n >= WARMUP:
                steps["intake"].append(took_in - start)
                steps["prepare"].append(prepared - took_in)
                steps["json"].append(encoded - prepared)
                steps["total"].append(encoded - start)
            for stored in received.stored:
                (workspace / stored).unlink(missing_ok=True)
            del received, history, messages, body, reader
        gc.collect()
        rss.append(process.memory_info().rss)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {"steps": steps, "rss_start": rss[0], "rss_end": rss[-1]}


def report_process(result: dict[str, Any], baseline: dict[str, Any]) -> None:
    overhead = median_ms(result["overhead"])
    growth = (result["rss_end"] - result["rss_start"]) / 2**20
    sessions = (baseline["rss_end"] - baseline["rss_start"]) / 2**20
    photos_only = growth - sessions
    print(f"\nPart 1: roost run (Telegram + Anthropic fakes), {result['photos']} photos "
          f"in rounds of {ROUND}")
    print(f"  CPU per photo turn       {median_ms(result['photo_turn']):7.1f} ms (median "
          "of rounds)")
    print(f"  CPU per text turn        {median_ms(result['text_turn']):7.1f} ms")
    print(f"  photo overhead per turn  {overhead:7.1f} ms   target <= {TARGET_CPU_MS:.0f} ms: "
          f"{verdict(overhead <= TARGET_CPU_MS)}")
    print("  rounds (ms)              " + ", ".join(f"{x * 1000:.0f}"
                                                    for x in result["overhead"]))
    print(f"  RSS after warm-up        {result['rss_start'] / 2**20:7.1f} MB")
    print("  RSS after each round     " + ", ".join(f"{x / 2**20:.0f}"
                                                    for x in result["rss_rounds"]) + " MB")
    print(f"  RSS after all photos     {result['rss_end'] / 2**20:7.1f} MB   growth "
          f"{growth:+.1f} MB ({2 * result['photos']} new chats: half text, half photo)")
    print(f"  same turns, text only    growth {sessions:+.1f} MB (new sessions, no photo; "
          "a second roost process)")
    print(f"  RSS growth due to photos {photos_only:+7.1f} MB   target within "
          f"{TARGET_RSS_MB:.0f} MB: {verdict(photos_only <= TARGET_RSS_MB)}")


def report_in_process(result: dict[str, Any], photos: int) -> None:
    steps = result["steps"]
    growth = (result["rss_end"] - result["rss_start"]) / 2**20
    total = median_ms(steps["total"])
    print(f"\nPart 2: in process, the same code path without the network, {photos} photos")
    print(f"  intake (sniff, store, inspect)          {median_ms(steps['intake']):7.1f} ms")
    print(f"  provider (resize, re-encode, base64)    {median_ms(steps['prepare']):7.1f} ms")
    print(f"  request JSON                            {median_ms(steps['json']):7.1f} ms")
    print(f"  total per photo (median)                {total:7.1f} ms   target <= "
          f"{TARGET_CPU_MS:.0f} ms: {verdict(total <= TARGET_CPU_MS)}")
    print(f"  RSS growth over {photos} photos            {growth:+7.1f} MB   target within "
          f"{TARGET_RSS_MB:.0f} MB: {verdict(growth <= TARGET_RSS_MB)}")


async def main_async(photos: int, in_process_only: bool) -> None:
    photo = photo_jpeg()
    print(f"photo: 4000x3000 JPEG, {len(photo) / 2**20:.2f} MB")
    if not in_process_only:
        with_photos = await bench_process(photo, photos)
        baseline = await bench_process(photo, photos, with_photos=False)
        report_process(with_photos, baseline)
    report_in_process(await bench_in_process(photo, photos), photos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=100)
    parser.add_argument("--in-process-only", action="store_true")
    args = parser.parse_args()
    asyncio.run(main_async(args.photos, args.in_process_only))


if __name__ == "__main__":
    main()
