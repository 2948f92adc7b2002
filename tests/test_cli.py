"""The ``roost`` command as a person runs it: real subprocesses, real files."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bot.storage.sessions import SessionStore
from tests.cli_forks import run_roost
from tests.roost_forks import popen

ROOST = [sys.executable, "-m", "bot"]
SECRET_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL",
               "TELEGRAM_BOT_TOKEN", "DISCORD_BOT_TOKEN", "SLACK_BOT_TOKEN")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ROOST_") and k not in SECRET_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def roost(*args: str, cwd: Path, input: str | None = None,
          **env: str) -> subprocess.CompletedProcess[str]:
    """``roost *args``, ``input`` piped to it, as a process of its own (:mod:`tests.cli_forks`)."""
    return run_roost(list(args), cwd=cwd, env=clean_env(**env), input=input, timeout=60)


def test_chat_demo_answers_one_message_and_exits(tmp_path: Path) -> None:
    result = roost("chat", "--demo", "-m", "hello", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("roost> Hello! I'm Roost in demo mode")
    assert (tmp_path / "data" / "roost.db").exists()


def test_chat_repl_streams_answers_to_piped_lines_in_order(tmp_path: Path) -> None:
    lines = "remember that I like tea\nwhat do you remember?\n/whoami\n"
    result = roost("chat", "--demo", cwd=tmp_path, input=lines, ROOST_MERGE_WINDOW_MS="0")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert 'Noted in MEMORY.md: "I like tea"' in out
    assert out.index("Noted in MEMORY.md") < out.index("From my memory (MEMORY.md):")
    assert "You are " in out and "on console" in out
    notes = tmp_path / "data/workspaces/console/local/MEMORY.md"
    assert "I like tea" in notes.read_text()


def test_run_without_llm_credentials_exits_2_naming_what_to_set(tmp_path: Path) -> None:
    result = roost("run", cwd=tmp_path)
    assert result.returncode == 2
    assert "ANTHROPIC_API_KEY" in result.stderr


def test_run_without_any_channel_exits_2(tmp_path: Path) -> None:
    result = roost("run", cwd=tmp_path, ROOST_PROVIDER="scripted")
    assert result.returncode == 2
    assert "no channel is configured" in result.stderr


def test_invalid_config_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text("max_iterations = 0\nfavourite_colour = 'red'\n")
    result = roost("chat", "--demo", "-m", "hi", cwd=tmp_path)
    assert result.returncode == 2
    assert "max_iterations" in result.stderr
    assert "favourite_colour: unknown setting" in result.stderr


def test_config_show_masks_secrets_and_reflects_env_over_file(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text('model = "from-file"\nmax_iterations = 7\n'
                                         '[plugins.weather]\napi_key = "file-secret"\n')
    result = roost("config", "show", cwd=tmp_path, ANTHROPIC_API_KEY="sk-ant-supersecret",
                   TELEGRAM_BOT_TOKEN="123:tg-secret", ROOST_MODEL="from-env")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for secret in ("supersecret", "tg-secret", "file-secret"):
        assert secret not in out
    assert 'anthropic_api_key = "********"' in out
    assert 'model = "from-env"' in out and "max_iterations = 7" in out


def test_version_and_plugin_listing(tmp_path: Path) -> None:
    assert roost("version", cwd=tmp_path).stdout.strip().startswith("roost ")
    listing = roost("plugins", "list", "--json", "--all", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert '"plugins.file_tools"' in listing.stdout and '"roost_tools"' in listing.stdout


def test_run_serves_the_console_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc = popen(
        ["run"], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=clean_env(ROOST_PROVIDER="scripted", ROOST_CONSOLE="1"),
    )
    try:
        assert proc.stderr is not None and proc.stdin is not None and proc.stdout is not None
        deadline = time.monotonic() + 30
        while "roost ready" not in (line := proc.stderr.readline()):
            assert line and time.monotonic() < deadline, "roost run never became ready"
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("roost> Hello!")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


CRASH_SCRIPT = """
turns:
  - match: "^hello$"
    reply: "hi back"
  - match: "crash"
    steps:
      - tool_calls: [{name: write_file, arguments: {path: marker.txt, content: "tool ran"}}]
      - {reply: "never delivered", delay: 60}
"""


def test_a_killed_process_leaves_a_loadable_session_without_orphan_tool_calls(
    tmp_path: Path,
) -> None:
    script = tmp_path / "crash.yaml"
    script.write_text(CRASH_SCRIPT)
    proc = popen(
        ["chat"], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=clean_env(ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script),
                      ROOST_MERGE_WINDOW_MS="0"),
    )
    marker = tmp_path / "data/workspaces/console/local/marker.txt"
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        assert "hi back" in proc.stdout.readline()
        proc.stdin.write("crash now\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the tool never ran"
            time.sleep(0.02)
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert asyncio.run(_history(tmp_path / "data/roost.db")) == [
        ("user", "hello"), ("assistant", "hi back")]


async def _history(db: Path) -> list[tuple[str, str]]:
    store = await SessionStore.open(db)
    try:
        session = await store.get("default:console:direct:local")
        return [(m.role, m.content) for m in session.messages]
    finally:
        await store.close()


def test_unknown_command_in_chat_gets_a_helpful_reply(tmp_path: Path) -> None:
    result = roost("chat", "--demo", "-m", "/nonsense", cwd=tmp_path)
    assert result.returncode == 0
    assert "Send /help" in result.stdout
