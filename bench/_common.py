"""What every bench shares: figures, the report table, a Roost app or a ``roost run`` process.

Benches import it as ``bench._common`` after putting the repository root on
``sys.path`` (they run as scripts: ``.venv/bin/python bench/bench_core.py``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
from aiohttp import web

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.llm import LLMRequest, LLMResponse, OnRetry, OnText
from bot.pluginhost.manager import get_plugin_manager
from bot.testing._server import DropConnection
from bot.testing.anthropic import FakeAnthropic, Reply
from bot.testing.telegram import FakeTelegram
from plugins.scripted_provider import ScriptedProvider, _turn

# -- figures --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    """``seconds`` as milliseconds with two decimals."""
    return f"{seconds * 1000:.2f} ms"


def verdict(ok: bool) -> str:
    """The result column of a target: ``PASS`` or ``MISS``."""
    return "PASS" if ok else "MISS"


# -- the report -----------------------------------------------------------------------------


def _numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,.]+( KB| B|%)?", text))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "",
                numbers_right: bool = False,
                details: Sequence[Sequence[str]] | None = None) -> None:
    """Print ``rows`` under ``headers`` in aligned columns.

    ``numbers_right`` right-aligns numeric cells (not the first column);
    ``details[i]`` are lines printed under row ``i``, outside the columns.
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        cells = [v.rjust(w) if numbers_right and i and _numeric(v) else v.ljust(w)
                 for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return indent + "  ".join(cells).rstrip()

    print(line(headers))
    print(line(["-" * w for w in widths]))
    for n, row in enumerate(rows):
        print(line(row))
        for detail in details[n] if details else ():
            print(f"{indent}    - {detail}")


@dataclass(slots=True)
class Row:
    """One line of a report: what was measured, the figure, the target and the verdict."""

    metric: str
    measured: str
    target: str = ""
    verdict: str = ""
    details: list[str] = field(default_factory=list)
    """Printed under the row, outside the columns."""


def print_rows(rows: Sequence[Row]) -> None:
    """The usual report: Metric, Measured, Target, Result, and each row's details."""
    print_table(("Metric", "Measured", "Target", "Result"),
                [(r.metric, r.measured, r.target, r.verdict) for r in rows],
                details=[r.details for r in rows])


def targets_line(verdicts: Sequence[str], began: float) -> str:
    """``"n/m targets met; total bench time 12.3s"`` (rows without a verdict have no target)."""
    targets = sum(bool(v) for v in verdicts)
    misses = sum(v == "MISS" for v in verdicts)
    return (f"{targets - misses}/{targets} targets met; total bench time "
            f"{time.perf_counter() - began:.1f}s")


def progress(text: str) -> None:
    """A progress line on stderr, so it stays out of the report."""
    print(f"[{text}]", file=sys.stderr, flush=True)


def quiet_logging(*names: str) -> None:
    """Warnings only, from Roost (``roost`` and ``names``): per-run INFO lines cost time."""
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("roost", *names):
        logging.getLogger(name).setLevel(logging.WARNING)


# -- an app in this process -----------------------------------------------------------------


class InstantProvider(ScriptedProvider):
    """The scripted provider, answering at once, without keeping its request log.

    ``ScriptedProvider`` records every request (for tests); over thousands of
    turns that log would dominate memory, so it is dropped after each call.
    """

    def __init__(self, script: Sequence[Mapping[str, Any]]) -> None:
        super().__init__([_turn(dict(t), i, Path("<bench>")) for i, t in enumerate(script)],
                         loop=True)

    async def complete(self, request: LLMRequest, *, on_text: OnText | None = None,
                       on_retry: OnRetry | None = None) -> LLMResponse:
        try:
            return await super().complete(request, on_text=on_text, on_retry=on_retry)
        finally:
            self.requests.clear()


@contextlib.asynccontextmanager
async def roost_app(provider: ScriptedProvider, *plugins: object, data_dir: Path | None = None,
                    clock: Callable[[], datetime] | None = None,
                    **settings: Any) -> AsyncIterator[Roost]:
    """A Roost app with the built-in plugins and ``plugins``, closed on exit.

    Its data dir is ``data_dir``, or a fresh temporary one. ``clock`` freezes the
    scheduler's time; ``settings`` are :class:`Settings` fields (messages are
    not merged unless ``merge_window_ms`` says so; direct chats are open).
    """
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="roost-bench-"))) / "data"
        settings.setdefault("merge_window_ms", 0)
        settings.setdefault("dm_policy", "open")  # the benches' users are made up
        host = get_plugin_manager(load_entry_points=False)
        for i, plugin in enumerate(plugins):
            host.register(plugin, f"bench-plugin-{i}")
        app = await Roost.create(Settings(data_dir=data_dir, **settings), host=host,
                                 provider=provider, scheduler_clock=clock)
        try:
            yield app
        finally:
            await app.close()


# -- a `roost run` process ------------------------------------------------------------------


def roost_command() -> list[str]:
    """``roost run`` through the module: an installed ``roost`` script can be stale."""
    return [sys.executable, "-m", "bot", "run"]


class InstantAnthropic(FakeAnthropic):
    """The fake Messages API answering every request at once, keeping no request log."""

    async def _receive(self, request: web.Request, api_key: str | None) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        return body

    def _next_item(self) -> Reply | DropConnection | None:
        return Reply(blocks=("ok",), ping=False)


def telegram_env(data_dir: Path, telegram: FakeTelegram, anthropic: FakeAnthropic | None,
                 *, streaming: bool | None = False) -> dict[str, str]:
    """``roost run`` on ``telegram`` (long polling) and ``anthropic``.

    Without ``anthropic`` the provider is the shipped demo script. Platform and
    provider variables of this environment are left out; direct chats are open.
    ``streaming`` sets ``ROOST_STREAM_REPLIES`` (``None``: Roost's default).
    """
    drop = ("ROOST_", "TELEGRAM_", "DISCORD_", "SLACK_", "ANTHROPIC_", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(ROOST_DATA_DIR=str(data_dir), ROOST_LOG_LEVEL="INFO", ROOST_DM_POLICY="open",
               TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE=telegram.base_url)
    # The fake enforces no send limits, and the bench measures Roost's own cost: the
    # proactive budget (1 message/s per chat) would hold every closed loop at Telegram's pace.
    env["ROOST_TELEGRAM_RATE_LIMITS"] = "false"
    if streaming is not None:
        env["ROOST_STREAM_REPLIES"] = "true" if streaming else "false"
    if anthropic is not None:
        env.update(ROOST_PROVIDER="anthropic", ANTHROPIC_API_KEY="x",
                   ANTHROPIC_BASE_URL=anthropic.base_url)
    else:
        env.update(ROOST_PROVIDER="scripted")
    return env


@dataclass(slots=True)
class RoostProcess:
    """A running ``roost run``; its stderr is read all the time (a full pipe blocks logging)."""

    proc: subprocess.Popen[str]
    started: float
    lines: queue.Queue[str | None]
    reader: threading.Thread
    tail: list[str] = field(default_factory=list)

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Seconds from launch to the ``roost ready`` log line; raises if it never comes."""
        return self.wait_line("roost ready", timeout)

    def wait_line(self, text: str, timeout: float = 30.0) -> float:
        """Seconds from launch to a stderr line containing ``text``; raises if none comes."""
        deadline = self.started + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                line = None
            if line is None:
                raise RuntimeError(f"roost run never logged {text!r}; stderr tail:\n"
                                   + "".join(self.tail[-20:]))
            self.tail.append(line)
            if text in line:
                return time.perf_counter() - self.started

    def rss(self) -> int:
        """Resident memory in bytes."""
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far, from ``/proc/<pid>/stat``."""
        with open(f"/proc/{self.proc.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        """Resident memory in MiB."""
        return self.rss() / 2**20

    def stop(self, timeout: float = 10.0) -> tuple[int | None, float | None]:
        """SIGTERM; the exit code and how long the exit took (``None``, ``None``: it hung)."""
        began = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None, None
        return code, time.perf_counter() - began

    def stderr_tail(self, chars: int = 300) -> str:
        """The last ``chars`` characters of stderr (after the exit: all that was written)."""
        if self.proc.poll() is not None:
            self.reader.join(timeout=1)
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.tail.append(line)
        return "".join(self.tail)[-chars:]


@contextlib.contextmanager
def roost_process(env: dict[str, str], cwd: Path, *,
                  stdin_pipe: bool = False) -> Iterator[RoostProcess]:
    """Launch ``roost run`` in ``cwd`` with ``env``; killed on exit if still running.

    ``stdin_pipe`` gives it an open, silent stdin (the console channel reads it).
    """
    lines: queue.Queue[str | None] = queue.Queue()
    started = time.perf_counter()
    proc = subprocess.Popen(roost_command(), cwd=cwd, env=env,
                            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None

    def pump(stream: io.TextIOBase) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, args=(proc.stderr,), daemon=True)
    reader.start()
    try:
        yield RoostProcess(proc, started, lines, reader)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        reader.join(timeout=2)


# -- the Control UI -------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def add_ui_admin(cwd: Path, env: dict[str, str], name: str = "bench") -> str:
    """``roost ui user add NAME --role admin --password-stdin`` in ``cwd``; the password."""
    password = secrets.token_urlsafe(12)
    result = subprocess.run(
        [sys.executable, "-m", "bot", "ui", "user", "add", name, "--role", "admin",
         "--password-stdin"], cwd=cwd, env=env, input=password + "\n",
        capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"roost ui user add failed: {result.stderr.strip()}")
    return password
