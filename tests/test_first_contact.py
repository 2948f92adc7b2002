"""A first run that explains itself: roost init, .env, --version/-h, one-line startup errors,
config show's masking and JSON logs. Real subprocesses in a scratch directory."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from bot.app.init import PLUGIN_CHANNELS, credential_names, env_name
from bot.config.settings import ConfigError, Settings, load_settings
from tests.cli_forks import run_roost

ROOST = [sys.executable, "-m", "bot"]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any Roost setting or credential, plus ``extra``."""
    names = {env_name(n) for n in credential_names()} | {
        "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "TELEGRAM_API_BASE"} | {
        v for _, variables in PLUGIN_CHANNELS for v in variables}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROOST_", "OTEL_")) and k not in names}
    env.update(PYTHONUNBUFFERED="1", ROOST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.update(extra)
    return env


def roost(*args: str, cwd: Path, input: str | None = None,
          **env: str) -> subprocess.CompletedProcess[str]:
    """``roost *args`` as a process of its own (:mod:`tests.cli_forks`); stdin ``/dev/null``,
    or a pipe that holds ``input``."""
    return run_roost(list(args), cwd=cwd, env=clean_env(**env), input=input)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- roost init -----------------------------------------------------------------------


def test_init_writes_a_config_that_loads_and_prints_the_next_two_commands(
        tmp_path: Path) -> None:
    result = roost("init", cwd=tmp_path)  # stdin is not a TTY: nothing is asked
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "roost.toml").is_file() and (tmp_path / ".env.example").is_file()
    assert "cp .env.example .env" in result.stdout and "roost chat" in result.stdout
    settings = load_settings(tmp_path / "roost.toml")
    assert settings.provider == "anthropic" and settings.data_dir == Path("data")
    shown = roost("config", "show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert 'provider = "anthropic"' in shown.stdout


def test_every_commented_setting_in_the_template_is_a_real_one(tmp_path: Path) -> None:
    roost("init", cwd=tmp_path)
    text = (tmp_path / "roost.toml").read_text()
    setting = re.compile(r"# (\[|[a-z_]+ = )")
    uncommented = "\n".join(line[2:] if setting.match(line) else line
                            for line in text.splitlines())
    (tmp_path / "all.toml").write_text(uncommented)
    load_settings(tmp_path / "all.toml")  # raises on an unknown or invalid key


def test_env_example_has_one_empty_line_per_credential(tmp_path: Path) -> None:
    roost("init", cwd=tmp_path)
    lines = [line for line in (tmp_path / ".env.example").read_text().splitlines()
             if line and not line.startswith("#")]
    secrets = [name for name, field in Settings.model_fields.items()
               if SecretStr in (field.annotation, *getattr(field.annotation, "__args__", ()))]
    # The web and transcribe plugins' keys.
    plugins = ["BRAVE_API_KEY=", "TAVILY_API_KEY=", "ROOST_TRANSCRIBE_API_KEY="]
    # The channels of built-in plugins (WhatsApp, email).
    channels = ["WHATSAPP_PHONE_NUMBER_ID=", "WHATSAPP_ACCESS_TOKEN=", "WHATSAPP_APP_SECRET=",
                "WHATSAPP_VERIFY_TOKEN=", "EMAIL_IMAP_URL=", "EMAIL_SMTP_URL=",
                "EMAIL_ADDRESS=", "EMAIL_USERNAME=", "EMAIL_PASSWORD=", "MATRIX_HOMESERVER=",
                "MATRIX_USER_ID=", "MATRIX_ACCESS_TOKEN=", "MATRIX_PASSWORD="]
    assert sorted(lines) == sorted([f"{env_name(n)}=" for n in secrets] + plugins + channels)
    assert "TELEGRAM_BOT_TOKEN=" in lines and "ANTHROPIC_API_KEY=" in lines


def test_config_show_succeeds_after_copying_the_example_and_reads_env(tmp_path: Path) -> None:
    roost("init", cwd=tmp_path)
    example = (tmp_path / ".env.example").read_text()
    (tmp_path / ".env").write_text(example)
    shown = roost("config", "show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "# telegram_bot_token = (unset)" in shown.stdout  # NAME= means unset
    (tmp_path / ".env").write_text(example + "TELEGRAM_BOT_TOKEN=123:from-dot-env\n"
                                   "ROOST_MODEL=from-dot-env\n")
    shown = roost("config", "show", cwd=tmp_path, ROOST_MODEL="from-environment")
    assert shown.returncode == 0, shown.stderr
    assert 'telegram_bot_token = "********"' in shown.stdout
    assert "from-dot-env" not in shown.stdout.replace('"from-environment"', "")
    assert 'model = "from-environment"' in shown.stdout  # the real environment wins


def test_a_misspelt_roost_name_in_env_is_reported(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("ROOST_MODLE=x\nOTEL_SERVICE_NAME=roost\n")
    shown = roost("config", "show", cwd=tmp_path)
    assert shown.returncode == 2
    assert "roost_modle: unknown setting" in shown.stderr
    assert "otel" not in shown.stderr.lower()  # other names are not Roost's


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text("model = 'mine'\n")
    result = roost("init", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("roost: roost.toml already exists")
    assert (tmp_path / "roost.toml").read_text() == "model = 'mine'\n"
    assert not (tmp_path / ".env.example").exists()
    assert roost("init", "--force", cwd=tmp_path).returncode == 0
    assert "model = 'mine'" not in (tmp_path / "roost.toml").read_text()


# -- version and help ----------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flags_print_the_version(tmp_path: Path, flag: str) -> None:
    from bot import __version__

    result = roost(flag, cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"roost {__version__}"


def test_short_help_flag_works_on_the_group_and_commands(tmp_path: Path) -> None:
    top = roost("-h", cwd=tmp_path)
    assert top.returncode == 0 and top.stdout.startswith("Usage: roost ")
    assert "init" in top.stdout
    chat = roost("chat", "-h", cwd=tmp_path)
    assert chat.returncode == 0 and "--quiet" in chat.stdout


# -- one-line startup errors ---------------------------------------------------------


def blocked_sdk_run(module: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``roost run`` in a process where ``module`` cannot be imported (as if not installed)."""
    return run_roost(["run"], cwd=tmp_path, blocked=[module],
                     env=clean_env(ROOST_PROVIDER="scripted", ROOST_LOG_LEVEL="WARNING", **env))


def test_a_missing_platform_sdk_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    result = blocked_sdk_run("aiogram", tmp_path, TELEGRAM_BOT_TOKEN="123:abc")
    assert result.returncode == 2
    assert result.stderr == ("roost: the telegram channel needs aiogram: "
                             "pip install 'roost[telegram]'\n")


def test_a_missing_slack_sdk_names_slack_bolt_not_aiohttp(tmp_path: Path) -> None:
    result = blocked_sdk_run("slack_bolt", tmp_path, SLACK_BOT_TOKEN="xoxb-1",
                             SLACK_APP_TOKEN="xapp-1")
    assert result.returncode == 2
    assert result.stderr == ("roost: the slack channel needs slack-bolt: "
                             "pip install 'roost[slack]'\n")


@pytest.mark.e2e
def test_an_unreachable_telegram_api_is_retried_then_one_line(tmp_path: Path) -> None:
    # Tried twice (one retry), not five times.
    result = roost("run", cwd=tmp_path, ROOST_PROVIDER="scripted",
                   TELEGRAM_BOT_TOKEN="123:abc", ROOST_TELEGRAM_CONNECT_ATTEMPTS="2",
                   TELEGRAM_API_BASE=f"http://127.0.0.1:{closed_port()}")
    assert result.returncode == 1  # worth restarting later, unlike a setup error (2)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert any("telegram getMe failed" in line and "retrying in" in line for line in lines)
    assert lines[-1].startswith("roost: the telegram channel could not start: ")
    assert "gave up after retrying" in lines[-1]


def test_an_unwritable_data_dir_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = roost("chat", "--demo", "-m", "hi", cwd=tmp_path,
                   ROOST_DATA_DIR=str(tmp_path / "file" / "data"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("roost: ")


# -- config show masking -------------------------------------------------------------


def test_config_show_masks_credentials_in_urls_and_marks_masked_lines(tmp_path: Path) -> None:
    shown = roost("config", "show", cwd=tmp_path, ANTHROPIC_API_KEY="sk-ant-secret-1",
                  OPENAI_BASE_URL="http://bob:hunter22@127.0.0.1:11434/v1",
                  ROOST_SEARXNG_URL="https://search.example/?token=abc123&q=x")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "hunter22" not in out and "abc123" not in out and "sk-ant-secret-1" not in out
    assert ('openai_base_url = "http://bob:********@127.0.0.1:11434/v1"'
            "  # masked: not the real value") in out
    assert '"searxng_url": "https://search.example/?token=********&q=x"' in out
    assert 'anthropic_api_key = "********"  # masked: not the real value' in out
    assert 'model = "claude' in out and "# masked" not in out.split("model =")[1].split("\n")[0]


def test_a_masked_value_pasted_back_is_refused(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text('[plugins.weather]\napi_key = "********"\n')
    with pytest.raises(ConfigError, match=r"plugins\.weather\.api_key holds '\*{8}'"):
        load_settings(tmp_path / "roost.toml")
    result = roost("config", "show", cwd=tmp_path, TELEGRAM_BOT_TOKEN="********")
    assert result.returncode == 2 and "the mask" in result.stderr


# -- JSON logs -----------------------------------------------------------------------


def test_json_logs_make_every_line_one_object_with_library_lines_and_warnings(
        tmp_path: Path) -> None:
    code = """if True:
        import logging, warnings
        from bot.observability import logformat, redact
        redact.install(["sk-secret-value"])
        logformat.configure("INFO", fmt="json")
        logging.getLogger("roost.app").info("started with %s", "sk-secret-value")
        logging.getLogger("aiogram.dispatcher").warning("a library line\\nover two lines")
        warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)
        try:
            1 / 0
        except ZeroDivisionError:
            logging.getLogger("roost.engine").exception("it failed")
        raise RuntimeError("uncaught")
    """
    result = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=tmp_path,
                            env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    assert [r["logger"] for r in records] == [
        "roost.app", "aiogram.dispatcher", "py.warnings", "roost.engine", "roost"]
    assert records[0]["message"] == "started with ********"
    assert records[0]["ts"].endswith("Z")
    assert "deprecated thing" in records[2]["message"]
    assert "ZeroDivisionError" in records[3]["exc_info"]
    assert records[4]["level"] == "CRITICAL" and "RuntimeError" in records[4]["exc_info"]


def test_roost_run_with_json_logs_writes_its_startup_error_as_json(tmp_path: Path) -> None:
    result = roost("run", cwd=tmp_path, ROOST_PROVIDER="scripted", ROOST_LOG_FORMAT="json")
    assert result.returncode == 2
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert records and records[-1]["level"] == "ERROR"
    assert records[-1]["message"].startswith("no channel is configured")


# -- the otel extra ------------------------------------------------------------------


def test_the_otel_extra_exports_spans_over_otlp_http(tmp_path: Path) -> None:
    import http.server
    import threading

    paths: list[str] = []
    received = threading.Event()

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            paths.append(self.path)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()
            received.set()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = roost("chat", "--demo", "-m", "hello", cwd=tmp_path,
                       OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}")
        assert result.returncode == 0, result.stderr
        assert received.wait(30)  # spans are flushed when the chat closes
    finally:
        server.shutdown()
        server.server_close()
    assert "/v1/traces" in paths


# -- plugins_dir ---------------------------------------------------------------------


def fake_plugin(directory: Path, name: str = "roost-weather") -> None:
    """An installed distribution in ``directory`` as ``pip --target`` leaves it."""
    module = name.replace("-", "_")
    info = directory / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (directory / f"{module}.py").write_text(
        "from roost import hookimpl\n\n@hookimpl\ndef roost_tools(settings):\n    return []\n")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[roost]\nweather = {module}\n")
    (info / "RECORD").write_text(f"{module}.py,,\n{info.name}/METADATA,,\n"
                                 f"{info.name}/entry_points.txt,,\n{info.name}/RECORD,,\n")


def test_plugins_in_plugins_dir_are_loaded_at_start(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    fake_plugin(plugins)
    env = clean_env(ROOST_PLUGINS_DIR=str(plugins))
    env.pop("ROOST_DISABLE_PLUGIN_AUTOLOAD")
    env["ROOST_LOAD_PLUGINS"] = "roost-weather"
    listed = run_roost(["plugins", "list"], cwd=tmp_path, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:4] == ["weather", "roost-weather", "1.0", "enabled"]
    without = run_roost(["plugins", "list"], cwd=tmp_path,
                        env={**env, "ROOST_PLUGINS_DIR": ""}, timeout=60)
    assert "weather" not in without.stdout


def test_plugins_install_targets_plugins_dir_and_uninstall_removes_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import click.testing

    from bot.app import cli

    plugins = tmp_path / "plugins"
    commands: list[list[str]] = []
    monkeypatch.setattr("bot.app.cli.plugins.run_pip",
                        lambda command: commands.append(command) or 0)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the directory is added to it
    monkeypatch.setenv("ROOST_PLUGINS_DIR", str(plugins))
    runner = click.testing.CliRunner()
    result = runner.invoke(cli.cli, ["plugins", "install", "roost-weather"], obj={})
    assert result.exit_code == 0, result.output
    assert commands[-1][-4:] == ["roost-weather", "--target", str(plugins), "--upgrade"]
    assert commands[-1][1:4] == ["-m", "pip", "install"]
    fake_plugin(plugins)
    result = runner.invoke(cli.cli, ["plugins", "uninstall", "roost-weather"], obj={})
    assert result.exit_code == 0, result.output
    assert len(commands) == 1  # removed from the directory, pip not asked
    assert not (plugins / "roost_weather.py").exists()
    assert not list(plugins.glob("*.dist-info"))


def test_a_corrupt_database_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "roost.db").write_bytes(b"this is not a database" * 100)
    result = roost("run", cwd=tmp_path, ROOST_PROVIDER="scripted", ROOST_CONSOLE="1",
                   ROOST_LOG_LEVEL="WARNING")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("roost: cannot open the data directory data: ")
    assert len(result.stderr.strip().splitlines()) == 1


# -- roost chat -m with the model away -------------------------------------------------


def test_chat_m_gives_up_in_one_line_when_the_model_is_unreachable(tmp_path: Path) -> None:
    result = roost("chat", "-m", "hi", cwd=tmp_path, ROOST_PROVIDER="openai",
                   OPENAI_API_KEY="sk-test",
                   OPENAI_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1")
    assert result.returncode == 1
    assert "as soon as it is back" not in result.stdout + result.stderr
    assert result.stderr.startswith("roost: the AI service is not answering (the connection "
                                    "to http://127.0.0.1:"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_chat_m_gives_up_after_its_timeout_when_the_model_never_answers(
        tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        result = roost("chat", "-m", "hi", "--timeout", "2", cwd=tmp_path,
                       ROOST_PROVIDER="openai", OPENAI_API_KEY="sk-test",
                       OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1")
    assert result.returncode == 1
    assert result.stderr.startswith("roost: no answer within 2 s; gave up"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_brand_new_database_logs_no_dropped_retired_columns(tmp_path: Path) -> None:
    result = roost("chat", "--demo", "-m", "hello", cwd=tmp_path, ROOST_LOG_LEVEL="INFO")
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "data" / "chat.log").read_text()
    assert "roost" in log and "retired columns" not in log


@pytest.mark.parametrize("command", [("run",), ("config", "show"), ("chat", "--demo", "-m", "hi")])
def test_a_roost_toml_that_is_a_directory_is_one_line_and_exit_2(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    (tmp_path / "roost.toml").mkdir()  # what compose's bind mount of a missing file makes
    result = roost(*command, cwd=tmp_path, ROOST_PROVIDER="scripted")
    assert result.returncode == 2
    assert result.stderr.startswith("roost: roost.toml is a directory, not a file"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_demo_banner_names_no_model_it_does_not_use(tmp_path: Path) -> None:
    result = roost("chat", "--demo", cwd=tmp_path, input="")
    assert result.returncode == 0, result.stderr
    banner = result.stderr.splitlines()[0]
    assert banner.startswith("Roost ") and "demo script, no model" in banner
    assert str(Settings.model_fields["model"].default) not in result.stderr


@pytest.mark.parametrize("token", ["not-a-token", "123456:has space", "abc:def"])
def test_a_malformed_telegram_token_is_a_setting_exit_2_without_retrying(
        tmp_path: Path, token: str) -> None:
    result = roost("run", cwd=tmp_path, ROOST_PROVIDER="scripted", ROOST_LOG_LEVEL="INFO",
                   TELEGRAM_BOT_TOKEN=token,
                   TELEGRAM_API_BASE=f"http://127.0.0.1:{closed_port()}")
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("roost: TELEGRAM_BOT_TOKEN is malformed"), result.stderr
    assert "retry" not in result.stderr and "Traceback" not in result.stderr
    assert token not in result.stderr


@pytest.mark.parametrize("channels", [{}, {"ROOST_CONSOLE": "1"}], ids=["alone", "with-console"])
def test_a_slack_bot_token_alone_names_the_missing_slack_credential(
        tmp_path: Path, channels: dict[str, str]) -> None:
    result = roost("run", cwd=tmp_path, input="", ROOST_PROVIDER="scripted",
                   ROOST_LOG_LEVEL="WARNING", SLACK_BOT_TOKEN="xoxb-only-the-bot-token",
                   **channels)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("roost: the slack channel needs SLACK_APP_TOKEN (Socket Mode) or "
                             "SLACK_SIGNING_SECRET (Events API over HTTP) next to "
                             "SLACK_BOT_TOKEN\n")


# -- the deployment files' instructions ------------------------------------------------


@pytest.mark.parametrize("compose", ["compose.yaml", "deploy/compose.replicas.yml"])
def test_the_compose_files_instructions_make_every_file_they_mount(
        tmp_path: Path, compose: str) -> None:
    """The header's commands, run as written in the repository root, leave no bind mount
    without its file (a missing one becomes a directory) and no env file missing."""
    import shlex
    import shutil

    import yaml

    source = Path(__file__).resolve().parents[1] / compose
    header = []
    for line in source.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    steps = []
    for line in header:
        if (m := re.match(r"#   (\S.*)", line)):
            if m[1].startswith("docker compose"):
                break
            steps.append(shlex.split(m[1], comments=True))
    assert steps, f"{compose} says nothing to do before docker compose"
    (tmp_path / compose).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, tmp_path / compose)
    for argv in steps:
        # `roost ...` as a process of its own (a fork, tests/cli_forks.py); others as written.
        done = run_roost(argv[1:], cwd=tmp_path, env=clean_env()) if argv[0] == "roost" else \
            subprocess.run(argv, cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                           timeout=120)
        assert done.returncode == 0, f"{' '.join(argv)} failed: {done.stderr}"
    here = (tmp_path / compose).parent
    spec = yaml.safe_load((tmp_path / compose).read_text())
    for name, service in spec["services"].items():
        for volume in service.get("volumes", []):
            host = str(volume).split(":")[0]
            if host.startswith("."):
                assert (here / host).is_file(), f"{name} mounts {host}, which is not a file"
        for env_file in service.get("env_file", []):
            path = env_file["path"] if isinstance(env_file, dict) else env_file
            assert (here / path).is_file(), f"{name} reads {path}, which does not exist"


@pytest.mark.parametrize("command", [("errors", "list"), ("pairing", "list"), ("db", "migrate"),
                                     ("plugins", "list")])
def test_an_unreachable_database_is_one_line_naming_it_masked(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    url = f"postgresql://roost:pw-hunter2@127.0.0.1:{closed_port()}/roost?sslpassword=ssl-hunter3"
    # Tried twice (one retry, whose warning names the URL too), not six times.
    result = roost(*command, cwd=tmp_path, ROOST_DATABASE_URL=url,
                   ROOST_DATABASE_CONNECT_ATTEMPTS="2")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "hunter" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(r"roost: cannot \w+ the database postgresql://roost:\*{8}@127\.0\.0\.1:", last)
