"""How many of Roost's own files one plain text reply passes through, Telegram update to reply.

A warmed-up app on the fake Bot API answers one direct message with a scripted model; a
profile hook records every Roost source file (``bot/``, ``channels/``, ``plugins/``,
``workspaces/``, ``roost/``; not ``bot/testing/``) whose code runs between the update and
the settled reply, in every thread. Run it against another tree with ``PYTHONPATH=<tree>``
to compare (``--list`` prints the files).

    .venv/bin/python bench/bench_message_path.py [--list]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from bot.testing.app import create_app, scripted, settle
from bot.testing.telegram import FakeTelegram
from channels.telegram import TelegramChannel

PACKAGES = ("bot", "channels", "plugins", "workspaces", "roost")


def roost_file(filename: str, root: Path) -> str | None:
    """``filename`` relative to the tree when it is Roost's own code, else None."""
    try:
        relative = Path(filename).resolve().relative_to(root)
    except ValueError:
        return None
    parts = relative.parts
    if not parts or parts[0] not in PACKAGES or parts[:2] == ("bot", "testing"):
        return None
    return str(relative)


async def measure(root: Path) -> set[str]:
    """Roost's files (relative to ``root``) that run for the traced message."""
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = roost_file(frame.f_code.co_filename, root)
            if name is not None:
                seen.add(name)

    with tempfile.TemporaryDirectory() as data:
        async with FakeTelegram() as fake:
            app, _ = await create_app(scripted({"reply": "Hi, {message}!"}, loop=True),
                                      data_dir=Path(data), stream_replies=False,
                                      telegram_bot_token=fake.token,
                                      telegram_api_base=fake.base_url,
                                      telegram_rate_limits=False)
            try:
                channel = TelegramChannel(app.settings, polling_timeout=1)
                await app.add_channel(channel)
                for text, traced in (("warm up", False), ("hello", True)):
                    if traced:
                        threading.setprofile(profile)
                        sys.setprofile(profile)
                    fake.private_message(text)
                    await fake.wait_for("sendMessage", 2 if traced else 1, limit=30)
                    await settle(app)
                    sys.setprofile(None)
                    threading.setprofile(None)  # type: ignore[arg-type]
            finally:
                await app.close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the files too")
    args = parser.parse_args()
    import bot

    files = asyncio.run(measure(Path(bot.__file__).resolve().parent.parent))
    packages = {f.split("/")[0] + ("/" + f.split("/")[1] if f.startswith("bot/") else "")
                for f in files}
    print(f"{len(files)} files in {len(packages)} packages run for one plain text reply")
    if args.list:
        print("\n".join(sorted(files)))


if __name__ == "__main__":
    main()
