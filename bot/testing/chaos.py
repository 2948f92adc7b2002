"""Kill -9 a real ``roost run`` while people chat with it, and count what was lost.

:class:`ChaosRun` starts ``roost run`` as a separate process against a
:class:`~bot.testing.telegram.FakeTelegram` (long polling) and a
:class:`ChaosModel` (the Messages API, answering from the user's text), lets
simulated users chat continuously, kills the process with SIGKILL at chosen
moments (right after an acknowledgement, during a streamed answer, right after
the model asked for a tool, or at a random time), restarts it on the same data
dir, and finally lets the last process settle and stops it with SIGTERM.

The :class:`ChaosReport` says how many messages Telegram saw acknowledged, how
many were answered, lost (acknowledged, never answered, not given up with a
notice), answered more than once, left as a frozen draft, whose tool ran more
than once, plus the database's ``integrity_check`` and restart-to-ready times.
``bench/bench_chaos.py`` runs it at scale; ``tests/test_crash_recovery.py``
runs a few kills in the suite.

Message texts carry a number (``plain #12``, ``slow #13``, ``tool #14``); the
model answers ``ok #12 … end`` (``slow``: streamed over about a second;
``tool``: first a ``cron add`` whose message names the number, then
``done #14 end``), so every answer can be matched to what it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sqlite3
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from bot.testing._server import DropConnection
from bot.testing.anthropic import FakeAnthropic, Reply, ToolUse
from bot.testing.telegram import Call, FakeTelegram, user

__all__ = ["ChaosConfig", "ChaosModel", "ChaosReport", "ChaosRun", "KillMode", "RoostProcess",
           "Spawn", "exec_roost_run"]

KillMode = Literal["after_ack", "streaming", "tool", "random"]
KILL_MODES: tuple[KillMode, ...] = ("after_ack", "streaming", "tool", "random")

_TAG = re.compile(r"#(\d+)")
_END = " end"


class RoostProcess(Protocol):
    """What the session does with a running ``roost run`` (``asyncio.subprocess.Process``
    offers it)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


Spawn = Callable[[Mapping[str, str], IO[bytes]], Awaitable[RoostProcess]]
"""Starts ``roost run`` with an environment, its stdout and stderr going to a file."""


async def exec_roost_run(env: Mapping[str, str], log: IO[bytes]) -> RoostProcess:
    """``python -m bot run`` exec'd with ``env``, its output to ``log``."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=dict(env), stdout=log, stderr=log,
        stdin=asyncio.subprocess.DEVNULL)


class ChaosModel(FakeAnthropic):
    """A fake Messages API that answers from the conversation instead of a script."""

    def __init__(self, *, slow_delay: float = 0.08) -> None:
        super().__init__()
        self.slow_delay = slow_delay
        self.tool_served = asyncio.Event()
        """Set whenever an answer asking for a tool was served."""

    def _next_item(self) -> Reply | DropConnection | None:
        # The request being answered is the latest recorded one: nothing awaits
        # between recording it and asking for its answer.
        messages: Sequence[Mapping[str, Any]] = self.requests[-1].body.get("messages", [])
        text = _last_user_text(messages)
        tag = " ".join(f"#{n}" for n in _TAG.findall(text)) or "#?"
        if _is_tool_result(messages[-1] if messages else {}):
            return Reply(blocks=(f"done {tag}{_END}",))
        if "tool" in text:
            self.tool_served.set()
            return Reply(blocks=(ToolUse("cron", {
                "action": "add", "schedule": "0 0 1 1 *", "message": f"tool {tag}"}),))
        if "slow" in text:
            return Reply(blocks=(f"ok {tag} " + "lorem ipsum " * 6 + _END.strip(),),
                         chunk_delay=self.slow_delay)
        return Reply(blocks=(f"ok {tag}{_END}",))


@dataclass(slots=True)
class ChaosConfig:
    """How hard to shake: users, kills, how long each process lives, the mix of turns."""

    users: int = 8
    kills: int = 200
    min_alive: float = 0.2
    max_alive: float = 2.5
    slow_share: float = 0.3
    tool_share: float = 0.3
    settle: float = 60.0
    """Seconds the last process may take to answer everything acknowledged."""
    catch_up: float = 5.0
    """Seconds a restarted process may spend on its backlog before the next kill is armed."""
    answer_wait: float = 6.0
    """Seconds a user waits for an answer before writing again anyway."""
    seed: int = 1
    modes: Sequence[KillMode] = KILL_MODES
    platform_faults: float = 0.0
    """Share of Bot API calls failing, in every way the fake knows (500, HTML 502,
    429 per chat, resets before and after the call took effect, stalls)."""
    llm_faults: float = 0.0
    """Share of Messages API calls failing (529, 500, 429, a stream cut mid-answer)."""
    duration: float = 0.0
    """With ``kills=0``: how long the users chat with one process."""


@dataclass(slots=True)
class ChaosReport:
    """What happened to every message (see the module docstring)."""

    kills: int = 0
    sent: int = 0
    acknowledged: int = 0
    answered: int = 0
    lost: list[int] = field(default_factory=list)
    given_up: list[int] = field(default_factory=list)
    duplicated: list[int] = field(default_factory=list)
    frozen_drafts: list[str] = field(default_factory=list)
    tools_twice: list[int] = field(default_factory=list)
    tools_run: int = 0
    integrity: str = ""
    restart_to_ready: list[float] = field(default_factory=list)
    window_violations: int = 0
    """Bot API calls made inside an open 429 window of their chat (or the bot)."""
    platform_faults: dict[str, int] = field(default_factory=dict)
    llm_faults: dict[str, int] = field(default_factory=dict)
    kills_by_mode: dict[str, int] = field(default_factory=dict)
    exit_code: int | None = None
    elapsed: float = 0.0

    def lines(self) -> list[str]:
        """The report as printable lines."""
        ready = self.restart_to_ready
        median = statistics.median(ready) if ready else float("nan")
        modes = ", ".join(f"{k} {v}" for k, v in sorted(self.kills_by_mode.items()))
        slowest = max(ready, default=0)
        return [
            f"kills                {self.kills} ({modes})",
            f"messages sent        {self.sent}",
            f"acknowledged         {self.acknowledged}",
            f"answered             {self.answered}",
            f"lost                 {len(self.lost)} {self.lost[:10]}",
            f"given up (told)      {len(self.given_up)} {self.given_up[:10]}",
            f"answered twice       {len(self.duplicated)} {self.duplicated[:10]}",
            f"frozen drafts        {len(self.frozen_drafts)}",
            f"tools run            {self.tools_run}",
            f"tools run twice      {len(self.tools_twice)} {self.tools_twice[:10]}",
            f"integrity_check      {self.integrity}",
            f"calls in 429 window  {self.window_violations}",
            f"platform faults      {sum(self.platform_faults.values())} {self.platform_faults}",
            f"LLM faults           {sum(self.llm_faults.values())} {self.llm_faults}",
            f"restart to ready     median {median * 1000:.0f} ms, max {slowest * 1000:.0f} ms",
            f"final SIGTERM exit   {self.exit_code}",
            f"elapsed              {self.elapsed:.1f} s",
        ]


@dataclass(slots=True)
class _Sent:
    number: int
    chat_id: int
    update_id: int


class ChaosRun:
    """One chaos session in ``workdir`` (the data dir and process logs go there); each
    ``roost run`` is started by ``spawn`` (exec'd unless told otherwise)."""

    def __init__(self, workdir: Path, config: ChaosConfig | None = None,
                 env: Mapping[str, str] | None = None,
                 spawn: Spawn = exec_roost_run) -> None:
        self.workdir = workdir
        self._spawn = spawn
        self.config = config or ChaosConfig()
        self.extra_env = dict(env or {})
        self.rng = random.Random(self.config.seed)
        self.sent: list[_Sent] = []
        self.report = ChaosReport()
        self._numbers = iter(range(1, 10**9))
        self._stop_users = asyncio.Event()
        self._acked = asyncio.Event()
        self._edited = asyncio.Event()
        self._polls = asyncio.Event()
        self._offset = 0
        self._counts: dict[tuple[int, int], int] = {}
        self._counted_at = 0.0
        self.telegram = FakeTelegram()
        self.telegram.on_call = self._on_call
        self.model = ChaosModel()

    # -- the session -------------------------------------------------------

    async def run(self) -> ChaosReport:
        """Chat, kill and restart as configured; returns the report."""
        started = time.monotonic()
        async with self.telegram, self.model:
            cfg = self.config
            if cfg.platform_faults:
                self.telegram.inject_faults(cfg.platform_faults, seed=cfg.seed)
            if cfg.llm_faults:
                self.model.faults.inject(cfg.llm_faults, seed=cfg.seed)
            users = [asyncio.ensure_future(self._user(i)) for i in range(self.config.users)]
            try:
                if not cfg.kills:
                    proc = await self.spawn(0)
                    await asyncio.sleep(cfg.duration)
                    await self._stop(users)
                    await self._settle()
                    proc.send_signal(signal.SIGTERM)
                    self.report.exit_code = await proc.wait()
                for life in range(self.config.kills):
                    proc = await self.spawn(life)
                    mode = self.config.modes[life % len(self.config.modes)]
                    await self._wait_moment(mode)
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                    self.report.kills += 1
                    self.report.kills_by_mode[mode] = self.report.kills_by_mode.get(mode, 0) + 1
                if cfg.kills:
                    await self._stop(users)
                    proc = await self.spawn(self.config.kills)
                    await self._settle()
                    proc.send_signal(signal.SIGTERM)
                    self.report.exit_code = await proc.wait()
            finally:
                self._stop_users.set()
                for task in users:
                    task.cancel()
                await asyncio.gather(*users, return_exceptions=True)
                with contextlib.suppress(ProcessLookupError):
                    if "proc" in locals() and proc.returncode is None:
                        proc.kill()
                        await proc.wait()
        self.count()
        self.report.elapsed = time.monotonic() - started
        return self.report

    async def _stop(self, users: Sequence[asyncio.Future[None]]) -> None:
        """Users stop writing; faults stop, so what is left can settle."""
        self._stop_users.set()
        async with self.telegram.call_cond:  # users waiting for an answer see it at once
            self.telegram.call_cond.notify_all()
        await asyncio.gather(*users)
        self.telegram.inject_faults(0)
        self.model.faults.clear()

    async def spawn(self, life: int) -> RoostProcess:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("ROOST_", "TELEGRAM_",
                                                                       "ANTHROPIC_"))},
            "TELEGRAM_BOT_TOKEN": self.telegram.token,
            "TELEGRAM_API_BASE": self.telegram.base_url,
            "ANTHROPIC_API_KEY": "chaos-key",
            "ANTHROPIC_BASE_URL": self.model.base_url,
            "ROOST_DATA_DIR": str(self.workdir / "data"),
            "ROOST_LOAD_PLUGINS": "",
            "ROOST_LOG_LEVEL": "INFO",
            "ROOST_MEMORY_FLUSH": "false",
            # The simulated users are strangers to the bot: DMs open, not paired.
            "ROOST_DM_POLICY": "open",
            **self.extra_env,
        }
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = (logs / f"life-{life:03d}.log").open("wb")
        polls = len(self.telegram.calls_of("getUpdates"))
        spawned = time.monotonic()
        try:
            proc = await self._spawn(env, out)
        finally:
            out.close()

        def ready() -> bool:
            return len(self.telegram.calls_of("getUpdates")) > polls

        waiting = asyncio.ensure_future(self.telegram.wait_until(ready, limit=60))
        ended = asyncio.ensure_future(proc.wait())
        await asyncio.wait([waiting, ended], return_when=asyncio.FIRST_COMPLETED)
        if not ready():
            waiting.cancel()
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            log = (logs / f"life-{life:03d}.log").read_text(errors="replace")
            raise RuntimeError(f"roost run (life {life}) never polled; exit {proc.returncode}; "
                               f"its log ends:\n{log[-3000:]}")
        ended.cancel()
        self.report.restart_to_ready.append(time.monotonic() - spawned)
        return proc

    async def _wait_moment(self, mode: KillMode) -> None:
        """Wait for the kind of moment ``mode`` kills at (at most ``max_alive`` seconds).

        The process first gets to catch up with what the last one left: every
        message sent before it was ready answered or given up (at most ``catch_up``
        seconds): the moments are those of a service at work, not only of one busy
        recovering, where every kill would hit the same runs.
        """
        cfg = self.config
        left = len(self.sent)
        deadline = time.monotonic() + cfg.catch_up
        # Polled: part of the state is the other process's database.
        while time.monotonic() < deadline and not self._done(self.sent[:left]):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        alive = self.rng.uniform(cfg.min_alive, cfg.max_alive)
        trigger = {"after_ack": self._acked, "streaming": self._edited,
                   "tool": self.model.tool_served}.get(mode)
        if trigger is None:
            await asyncio.sleep(alive)
            return
        trigger.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(cfg.max_alive):
                await trigger.wait()

    def _on_call(self, call: Call) -> None:
        if call.method == "getUpdates":
            offset = int(call.params.get("offset") or 0)
            self._offset = max(self._offset, offset)
            if offset > 1:
                self._acked.set()
        elif call.method == "editMessageText":
            self._edited.set()

    def say(self, index: int, kind: str) -> int:
        """User ``index`` sends a ``plain``, ``slow`` or ``tool`` message; its number."""
        sender = user(5000 + index, f"User{index}")
        number = next(self._numbers)
        update = self.telegram.private_message(f"{kind} #{number}", sender=sender)
        self.sent.append(_Sent(number, sender["id"], update["update_id"]))
        return number

    def all_answered(self) -> bool:
        """Whether every message sent so far was acknowledged and has its answer in its chat."""
        counts = self._answer_counts()
        return len(self._acknowledged()) == len(self.sent) and all(
            counts.get((s.chat_id, s.number)) for s in self.sent)

    def _caught_up(self) -> bool:
        """Whether every acknowledged message is answered or was given up."""
        return self._done(self._acknowledged())

    def _done(self, messages: Sequence[_Sent]) -> bool:
        """Whether each of ``messages`` is answered or was given up."""
        counts, given_up = self._answer_counts(), self._given_up()
        return all(counts.get((s.chat_id, s.number)) or s.update_id in given_up
                   for s in messages)

    async def _user(self, index: int) -> None:
        cfg = self.config
        while not self._stop_users.is_set():
            roll = self.rng.random()
            kind = "slow" if roll < cfg.slow_share else \
                "tool" if roll < cfg.slow_share + cfg.tool_share else "plain"
            number = self.say(index, kind)
            chat_id = 5000 + index

            def answered(n: int = number, c: int = chat_id) -> bool:
                return self._answers(c, n) > 0 or self._stop_users.is_set()

            with contextlib.suppress(AssertionError):
                await self.telegram.wait_until(answered, limit=cfg.answer_wait)
            await asyncio.sleep(self.rng.uniform(0, 0.2))

    async def _settle(self) -> None:
        deadline = time.monotonic() + self.config.settle
        # Polled: part of the state is the other process's database.
        while time.monotonic() < deadline and not self._caught_up():  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # let late duplicates show, if any

    # -- counting ----------------------------------------------------------

    def _confirmed_below(self) -> int:
        return self._offset

    def _acknowledged(self) -> list[_Sent]:
        below = self._confirmed_below()
        return [s for s in self.sent if s.update_id < below]

    def _answers(self, chat_id: int, number: int) -> int:
        # Users check on every Bot API call: a count at most 50 ms old will do.
        now = time.monotonic()
        if now - self._counted_at > 0.05:
            self._counts, self._counted_at = self._answer_counts(), now
        return self._counts.get((chat_id, number), 0)

    def _answer_counts(self) -> dict[tuple[int, int], int]:
        """How many final answers each (chat, message number) has, in one pass."""
        counts: dict[tuple[int, int], int] = {}
        for (chat_id, _), message in self.telegram.messages.items():
            text = message.get("text", "")
            if text.endswith(_END.strip()):
                for n in set(_TAG.findall(text)):
                    key = (int(chat_id), int(n))
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def count(self) -> ChaosReport:
        """Fill in the report from what the fakes and the database show now."""
        r = self.report
        r.sent = len(self.sent)
        r.window_violations = len(self.telegram.violations)
        r.platform_faults = {k: v for k, v in self.telegram.faults.items() if k != "window"}
        r.llm_faults = {}
        for kind in self.model.faults.served:
            r.llm_faults[kind] = r.llm_faults.get(kind, 0) + 1
        acked = self._acknowledged()
        r.acknowledged = len(acked)
        given_up = self._given_up()
        counts = self._answer_counts()
        for s in acked:
            count = counts.get((s.chat_id, s.number), 0)
            if count:
                r.answered += 1
            if count > 1:
                r.duplicated.append(s.number)
            if not count:
                (r.given_up if s.update_id in given_up else r.lost).append(s.number)
        for chat_id in {s.chat_id for s in self.sent}:
            for text in self.telegram.visible(chat_id):
                if not text.endswith(_END.strip()) and not text.startswith(
                        ("I could not answer", "The AI service", "Sorry")):
                    r.frozen_drafts.append(text)
        db = sqlite3.connect(self.workdir / "data" / "roost.db")
        try:
            r.integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
            runs: dict[int, int] = {}
            for (message,) in db.execute("SELECT message FROM jobs WHERE kind = 'cron'"):
                for n in _TAG.findall(message):
                    runs[int(n)] = runs.get(int(n), 0) + 1
            r.tools_run = sum(runs.values())
            r.tools_twice = sorted(n for n, c in runs.items() if c > 1)
        finally:
            db.close()
        return r

    def _given_up(self) -> set[int]:
        db = sqlite3.connect(self.workdir / "data" / "roost.db")
        try:
            return {int(row[0]) for row in db.execute(
                "SELECT event_id FROM inbox WHERE state = 'given_up'")
                if str(row[0]).isdigit()}
        finally:
            db.close()


def _tags(text: str) -> set[str]:
    return {f"#{n}" for n in _TAG.findall(text)}


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        # A tool result message can carry the request's volatile note (time, tool
        # summary) after its results: that is not what the person said.
        if message.get("role") != "user" or _is_tool_result(message):
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or () if isinstance(b, Mapping)
                 and b.get("type") == "text"]
        if any(texts):
            return "\n".join(texts)
    return ""


def _is_tool_result(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
