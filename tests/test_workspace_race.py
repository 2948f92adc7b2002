"""The workspace race: a hostile loop flips paths between real files or directories and
links to outside (a host directory, ``/proc/self/environ``) while reads, uploads and
system-prompt builds run. Not one outside byte may reach a tool result, the prompt or
the platform.

The flipper is a process of its own (tests/race_flipper.py), as a model's ``exec``
loop would be, so it runs truly alongside the reads on another core.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bot.contracts.messages import InboundMessage
from bot.contracts.prompt import PromptContext
from bot.contracts.tools import SendFunc, ToolContext, ToolError
from bot.testing.app import scripted
from bot.testing.telegram import ALICE, FakeTelegram
from bot.testing.telegram import fake_telegram as _fake_telegram  # noqa: F401  (the fixture)
from plugins import file_tools, media_tools, prompt_sections
from plugins.memory.notes import daily_notes
from roost import Settings
from tests.conftest import AppFactory
from tests.test_telegram import TgFactory, answered
from tests.test_telegram import make_tg as _make_tg  # noqa: F401  (the fixture)
from tests.test_telegram_intake import Inbox, StartTg
from tests.test_telegram_intake import start_tg as _start_tg  # noqa: F401  (the fixture)
from workspaces import beneath, read_cached, workspace_dir

FLIPPER = Path(__file__).with_name("race_flipper.py")
MB = 1024 * 1024
BIG = 11 * MB
"""Over Telegram's 10 MB for photos: the upload streams (it used to reopen the path)."""


def today_note() -> str:
    return f"memory/{dt.datetime.now(dt.UTC).date().isoformat()}.md"


@dataclass
class Race:
    """The workspace under attack, what is inside it, and how to spot outside bytes."""

    workspace: Path
    inside: dict[str, bytes]
    secret: bytes
    environ: list[bytes]
    flips: int = 0
    seen: list[str] = field(default_factory=list)

    def leaked(self, data: bytes | str, where: str) -> int:
        """Outside bytes in ``data``: the host secret or a line of Roost's environment."""
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        found = raw.count(self.secret) * len(self.secret) + sum(
            raw.count(entry) * len(entry) for entry in self.environ)
        if found:
            self.seen.append(f"{where}: {raw[:120]!r}")
        return found


@contextlib.contextmanager
def flipping(tmp_path: Path, workspace: Path) -> Iterator[Race]:
    """A workspace whose files and directory ``d`` flip to links to outside meanwhile."""
    secret = f"OUTSIDE-{uuid.uuid4().hex}".encode()
    keep, outside = tmp_path / "keep", tmp_path / "outside"
    (outside / "d").mkdir(parents=True)
    keep.mkdir()
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / "d").mkdir()
    (workspace / "d" / "f").write_bytes(b"inside d/f\n")
    (outside / "d" / "f").write_bytes(secret + b" host directory\n")
    inside = {"d/f": b"inside d/f\n"}
    for name in ("USER.md", "AGENTS.md", "MEMORY.md", today_note(), "file.txt", "big.bin"):
        data = (b"i" * BIG) if name == "big.bin" else f"inside {name}\n".encode()
        flat = name.replace("/", "%2F")
        (keep / flat).write_bytes(data)
        (outside / flat).write_bytes(secret * (BIG // len(secret)) if name == "big.bin"
                                     else secret + b"\n")
        (workspace / name).write_bytes(data)
        inside[name] = data
    with open("/proc/self/environ", "rb") as fh:  # what a link to it would show Roost
        environ = [e for e in fh.read().split(b"\0") if len(e) >= 12]
    assert environ
    stop = tmp_path / "stop"
    flipper = subprocess.Popen([sys.executable, str(FLIPPER), str(workspace), str(keep),
                                str(outside), str(stop)], stdout=subprocess.PIPE)
    race = Race(workspace, inside, secret, environ)
    try:
        # Running before the first read: its first flip makes ``d`` a link.
        deadline = time.monotonic() + 30  # a hang guard
        while not (workspace / "d").is_symlink():
            assert flipper.poll() is None and time.monotonic() < deadline, "no flip"
            time.sleep(0.002)
        yield race
    finally:
        stop.touch()
        out, _ = flipper.communicate(timeout=60)
        race.flips = int(out or 0)


def context(workspace: Path, send: SendFunc | None = None) -> ToolContext:
    return ToolContext(user_id=str(ALICE["id"]), channel="telegram", chat_id=str(ALICE["id"]),
                       session_key="main:telegram:direct:42", run_id="race",
                       workspace=workspace, deadline=time.monotonic() + 600,
                       send=send)


def system_prompt(workspace: Path) -> str:
    """The workspace parts of a full-mode system prompt, read as a run reads them."""
    prompt = PromptContext(
        message=InboundMessage("telegram", str(ALICE["id"]), "direct", str(ALICE["id"]), "hi"),
        session_key="main:telegram:direct:42", workspace=workspace,
        tool_names=["read_file"], model="m", provider="p", agent="main")
    sections = [*prompt_sections.roost_prompt_sections(prompt), daily_notes(prompt)]
    user = read_cached(workspace / "USER.md", 8_000, within=workspace)  # as the run loop
    return "\n".join([*(s.text for s in sections if s is not None), user])


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture
def ws(settings: Settings) -> Path:
    path = workspace_dir(settings.workspaces_dir, "telegram", str(ALICE["id"]))
    path.mkdir(parents=True)
    return path


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest) -> Iterator[str]:
    """openat2(2), or the O_NOFOLLOW walk of kernels without it (forced)."""
    beneath.use_openat2(request.param == "openat2")
    yield str(request.param)
    beneath.use_openat2(True)


READS = 3000
PROMPTS = 3000
UPLOADS = 300
BIG_UPLOADS = 12
"""The most calls of each kind; each kind stops after a tenth of them once it met the links
MET times (and an 11 MB upload went through), however fast the flipper runs."""
MET = 5


async def test_no_outside_byte_reaches_a_tool_result_the_prompt_or_telegram(
        tmp_path: Path, settings: Settings, ws: Path, start_tg: StartTg,
        fake_telegram: FakeTelegram, resolver: str) -> None:
    read_file = next(t for t in file_tools.roost_tools(settings) if t.name == "read_file")
    [send_file] = media_tools.roost_tools(settings)
    channel = await start_tg(Inbox())
    counts = {"read": 0, "read_refused": 0, "prompt": 0, "prompt_unlinked": 0, "upload": 0,
              "upload_refused": 0, "big": 0}
    leaked = 0
    foreign: list[str] = []  # results that are not the workspace's own bytes

    with flipping(tmp_path, ws) as race:

        async def reads() -> None:
            nonlocal leaked
            ctx = context(ws)
            paths = ("d/f", "file.txt", "USER.md", today_note())
            for n in range(READS):
                if n >= READS // 10 and counts["read_refused"] >= MET:
                    break
                path = paths[n % len(paths)]
                try:
                    text = await read_file.execute(ctx, {"path": path})
                except ToolError as exc:
                    counts["read_refused"] += 1
                    leaked += race.leaked(str(exc), f"read_file {path} error")
                    continue
                counts["read"] += 1
                leaked += race.leaked(text, f"read_file {path}")
                if text.encode() != race.inside[path] and not text.endswith("is empty)"):
                    foreign.append(f"read_file {path}")

        async def prompts() -> None:
            nonlocal leaked
            for n in range(PROMPTS):
                if n >= PROMPTS // 10 and counts["prompt_unlinked"] >= MET:
                    break
                text = await asyncio.to_thread(system_prompt, ws)
                counts["prompt"] += 1
                counts["prompt_unlinked"] += "inside USER.md" not in text
                leaked += race.leaked(text, "system prompt")

        async def uploads() -> None:
            nonlocal leaked
            ctx = context(ws, channel.send)
            for n in range(UPLOADS + BIG_UPLOADS):
                if n >= UPLOADS // 10 and counts["upload_refused"] >= MET and counts["big"]:
                    break
                path = "big.bin" if n % (UPLOADS // BIG_UPLOADS + 1) == 0 else "file.txt"
                try:
                    result = await send_file.execute(ctx, {"path": path})
                except ToolError as exc:
                    counts["upload_refused"] += 1
                    leaked += race.leaked(str(exc), f"send_file {path} error")
                    continue
                counts["upload"] += 1
                counts["big"] += path == "big.bin"
                leaked += race.leaked(result, f"send_file {path}")

        await asyncio.gather(reads(), prompts(), uploads())

    for upload in fake_telegram.uploads:
        leaked += race.leaked(upload.data, f"uploaded {upload.name}")
        if upload.data != race.inside[upload.name]:
            foreign.append(f"uploaded {upload.name}")
    big = sum(1 for u in fake_telegram.uploads if u.name == "big.bin")
    print(f"\nworkspace race ({resolver}): {race.flips} flips; {counts}; {big} uploads of 11 MB; "
          f"{leaked} outside bytes in {len(race.seen)} results "
          f"{dict(Counter(w.split(':')[0] for w in race.seen))}; foreign: "
          f"{sorted(set(foreign))} ({len(foreign)})")
    assert leaked == 0, race.seen[:5]
    assert foreign == []
    assert race.flips > 0
    # The race was real: every kind of call met the links at least once.
    assert counts["read_refused"] > 0 and counts["upload_refused"] > 0
    assert counts["read"] > 0 and counts["upload"] > 0 and big > 0
    assert counts["prompt_unlinked"] > 0


PROMPT_ONLY = 5000


async def test_no_outside_byte_reaches_the_system_prompt_of_concurrent_builds(
        tmp_path: Path, ws: Path) -> None:
    """USER.md, AGENTS.md and today's note flipping to /proc/self/environ (Roost's tokens)
    while prompts are built in two threads at once, as a user's concurrent runs would."""
    with flipping(tmp_path, ws) as race:

        def builds() -> tuple[int, int]:
            found = missed = 0
            # At least PROMPT_ONLY / 10 builds each, and on until USER.md was met as a link
            # a few times (the flipper shares two cores with everything else).
            for n in range(2 * PROMPT_ONLY):
                if n >= PROMPT_ONLY // 10 and missed >= 5:
                    break
                text = system_prompt(ws)
                found += race.leaked(text, "system prompt")
                missed += "inside USER.md" not in text
            return found, missed

        done = await asyncio.gather(asyncio.to_thread(builds), asyncio.to_thread(builds))
    leaked = sum(found for found, _ in done)
    missed = sum(m for _, m in done)
    print(f"\nprompt race: {race.flips} flips; >= {PROMPT_ONLY // 5} prompt builds, {missed} "
          f"without USER.md (a link then); {leaked} outside bytes in {len(race.seen)} prompts")
    assert leaked == 0, race.seen[:3]
    assert race.flips > 0 and missed > 0


MEMORY_CALLS = 1500


async def test_no_outside_byte_reaches_memory_get_or_memory_search(
        tmp_path: Path, make_app: AppFactory) -> None:
    """memory_get and memory_search (whose index reads the files) through a running app."""
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    ws = workspace_dir(app.settings.workspaces_dir, "test", "u1")
    ws.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(user_id="u1", channel="test", chat_id="u1",
                      session_key="default:test:direct:u1", run_id="r", workspace=ws,
                      deadline=time.monotonic() + 600)
    tools = app.engine.tools
    leaked = refused = answered = 0
    with flipping(tmp_path, ws) as race:
        for n in range(10 * MEMORY_CALLS):
            if n >= MEMORY_CALLS // 3 and refused >= 5:
                break  # on until the links were met a few times, however slow the flipper
            path = ("MEMORY.md", today_note())[n % 2]
            try:
                if n % 5 == 4:
                    text = await tools["memory_search"].execute(ctx, {"query": "OUTSIDE inside"})
                else:
                    text = await tools["memory_get"].execute(ctx, {"path": path})
            except ToolError as exc:
                refused += 1
                leaked += race.leaked(str(exc), "memory error")
                continue
            answered += 1
            leaked += race.leaked(str(text), "memory_get" if n % 5 != 4 else "memory_search")
    print(f"\nmemory race: {race.flips} flips; {answered + refused} calls ({answered} answered, "
          f"{refused} refused); {leaked} outside bytes in {len(race.seen)} results")
    assert leaked == 0, race.seen[:3]
    assert race.flips > 0 and refused > 0 and answered > 0


TURNS = 60


async def test_through_roost_on_telegram_no_outside_byte_reaches_the_model_or_the_chat(
        tmp_path: Path, make_tg: TgFactory, fake_telegram: FakeTelegram) -> None:
    """Whole turns of a running Roost on the real Telegram channel: each one builds the
    system prompt (USER.md, AGENTS.md, today's note), calls read_file twice and send_file
    once; every request the model gets and every file the chat gets is checked."""
    turn = {"steps": [{"tool_calls": [
        {"name": "read_file", "arguments": {"path": "file.txt"}},
        {"name": "read_file", "arguments": {"path": "d/f"}},
        {"name": "send_file", "arguments": {"path": "file.txt"}}]}, {"reply": "done"}]}
    provider = scripted(turn, loop=True)
    app, _, _ = await make_tg(provider)
    ws = workspace_dir(app.settings.workspaces_dir, "telegram", str(ALICE["id"]))
    ws.mkdir(parents=True)
    with flipping(tmp_path, ws) as race:
        for n in range(TURNS):
            await answered(fake_telegram, app, fake_telegram.private_message(f"turn {n}"))
    leaked = 0
    for request in provider.requests:
        leaked += race.leaked(request.system + request.note, "system prompt")
        for message in request.messages:
            leaked += race.leaked(str(message.content), f"{message.role} message")
    for upload in fake_telegram.uploads:
        leaked += race.leaked(upload.data, "upload")
    print(f"\nroost race: {race.flips} flips; {TURNS} turns, {len(provider.requests)} model "
          f"requests, {len(fake_telegram.uploads)} uploads; {leaked} outside bytes in "
          f"{dict(Counter(w.split(':')[0] for w in race.seen))}")
    assert leaked == 0, race.seen[:3]
    assert fake_telegram.visible(ALICE["id"]).count("done") == TURNS
