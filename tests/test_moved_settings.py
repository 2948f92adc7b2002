"""Built-in plugins' settings live in their `[plugins.<name>]` tables; old names still work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.config.moved import MOVED, SERVICE_ENV, new_place, places
from bot.config.settings import Settings, load_settings
from plugins.exec_config import ExecConfig, exec_config
from plugins.web.config import web_config
from tests.test_cli import roost

EXEC = "plugins.exec_tool"


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith("ROOST_") or key in ("BRAVE_API_KEY", "TAVILY_API_KEY"):
            monkeypatch.delenv(key)


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "roost.config" and "is now" in r.getMessage()]


def test_the_new_place_works_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "roost.toml").write_text(
        f'[plugins."{EXEC}"]\ntimeout = 12\nnetwork_agents = ["dev"]\n')
    config = exec_config(load_settings())
    assert (config.timeout, config.network_agents) == (12, ["dev"])
    assert deprecations(caplog) == []


def test_no_table_gives_the_defaults() -> None:
    assert exec_config(load_settings()) == ExecConfig()
    assert exec_config(load_settings()).timeout == 30.0


def test_an_old_top_level_key_lands_in_the_table_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "roost.toml").write_text(
        f'exec_timeout = 12\nexec_network_agents = ["dev"]\n[plugins."{EXEC}"]\nmemory_mb = 128\n')
    config = exec_config(load_settings())
    assert (config.timeout, config.network_agents, config.memory_mb) == (12, ["dev"], 128)
    assert sorted(deprecations(caplog)) == [
        f'exec_network_agents is now [plugins."{EXEC}"] network_agents (the old name still works)',
        f'exec_timeout is now [plugins."{EXEC}"] timeout (the old name still works)']


def test_an_old_env_name_works_with_one_line_and_beats_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "roost.toml").write_text(f'[plugins."{EXEC}"]\ntimeout = 12\nuid = 7\n')
    monkeypatch.setenv("ROOST_EXEC_TIMEOUT", "45")
    monkeypatch.setenv("ROOST_EXEC_NETWORK_AGENTS", "dev, ops")
    config = exec_config(load_settings())
    assert (config.timeout, config.uid, config.network_agents) == (45, 7, ["dev", "ops"])
    lines = deprecations(caplog)
    assert len(lines) == 2
    assert f'ROOST_EXEC_TIMEOUT is now [plugins."{EXEC}"] timeout (the old name still works)' \
        in lines


def test_an_old_name_in_dotenv_and_as_a_keyword_still_works(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / ".env").write_text("ROOST_EXEC_MEMORY_MB=256\n")
    assert exec_config(load_settings()).memory_mb == 256
    assert deprecations(caplog) == [
        f'ROOST_EXEC_MEMORY_MB is now [plugins."{EXEC}"] memory_mb (the old name still works)']
    (tmp_path / ".env").unlink()
    caplog.clear()
    assert exec_config(Settings(exec_bwrap="/opt/bwrap")).bwrap == "/opt/bwrap"
    assert deprecations(caplog) == [
        f'exec_bwrap is now [plugins."{EXEC}"] bwrap (the old name still works)']


def test_an_invalid_value_fails_at_start_with_one_line_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text(f'[plugins."{EXEC}"]\ntimeout = 0\n')
    result = roost("chat", "--demo", "-m", "hi", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f'roost: invalid config: [plugins."{EXEC}"] timeout: Input should be greater than 0']
    # Given under the old name, the same line (after the one deprecation line).
    (tmp_path / "roost.toml").write_text("exec_timeout = -1\n")
    result = roost("chat", "--demo", "-m", "hi", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "exec_timeout is now" in lines[0]
    assert lines[1] == (f'roost: invalid config: [plugins."{EXEC}"] timeout: '
                        "Input should be greater than 0")


def test_config_show_shows_each_plugin_table_with_its_defaults(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text("exec_max_timeout = 90\n")
    result = roost("config", "show", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = next(line for line in result.stdout.splitlines() if line.startswith("plugins = "))
    assert f'"{EXEC}": {{"bwrap": "bwrap", "timeout": 30.0, "max_timeout": 90.0' in shown
    assert "exec_max_timeout" not in result.stdout


def test_the_services_own_key_variables_work_silently_and_stay_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("BRAVE_API_KEY", "BSA-env-secret")
    (tmp_path / ".env").write_text("TAVILY_API_KEY=tvly-dotenv-secret\n"
                                   "ROOST_TRANSCRIBE_API_KEY=sk-dotenv-secret\n")
    (tmp_path / "roost.toml").write_text('web_fetch_timeout = 5\n')
    settings = load_settings()
    config = web_config(settings)
    assert config.brave_api_key is not None and config.tavily_api_key is not None
    assert config.brave_api_key.get_secret_value() == "BSA-env-secret"
    assert config.tavily_api_key.get_secret_value() == "tvly-dotenv-secret"
    assert config.fetch_timeout == 5
    assert settings.plugins["plugins.transcribe"] == {"api_key": "sk-dotenv-secret"}
    assert deprecations(caplog) == [
        'web_fetch_timeout is now [plugins."plugins.web"] fetch_timeout (the old name still works)']
    shown = str(settings.masked())
    assert "BSA-env-secret" not in shown and "tvly-dotenv-secret" not in shown
    assert "sk-dotenv-secret" not in shown
    assert "BSA-env-secret" not in repr(config)


def test_config_show_masks_a_moved_key_and_shows_where_it_went(tmp_path: Path) -> None:
    (tmp_path / "roost.toml").write_text('[plugins."plugins.web"]\nsearch_backend = "brave"\n')
    result = roost("config", "show", cwd=tmp_path, ROOST_BRAVE_API_KEY="BSA-roost-secret")
    assert result.returncode == 0, result.stderr
    assert "BSA-roost-secret" not in result.stdout + result.stderr
    shown = next(line for line in result.stdout.splitlines() if line.startswith("plugins = "))
    assert '"brave_api_key": "********"' in shown and '"search_backend": "brave"' in shown
    assert shown.endswith("# masked: not the real value")
    assert ('ROOST_BRAVE_API_KEY is now [plugins."plugins.web"] brave_api_key '
            "(the old name still works)") in result.stderr


def test_every_moved_name_points_at_a_field_of_its_plugins_model() -> None:
    import asyncio

    from bot.pluginhost.manager import get_plugin_manager

    host = get_plugin_manager(load_entry_points=False)
    asyncio.run(host.validate_configs({}))  # every table absent: each model's defaults
    moved = [(old, place) for old in MOVED for place in places(old)]
    for old, (plugin, key) in [*moved, *SERVICE_ENV.items()]:
        assert key in type(host.config[plugin]).model_fields, old
        assert old not in Settings.model_fields, old  # gone from the core


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_name_lands_in_its_table_from_the_file_and_from_the_env(
        old: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "roost.toml").write_text(f'{old} = "from-file"\n')
    tables = load_settings().plugins
    assert all(tables[plugin][key] == "from-file" for plugin, key in places(old))
    assert deprecations(caplog) == [f"{old} is now {new_place(old)} (the old name still works)"]
    caplog.clear()
    monkeypatch.setenv(f"ROOST_{old.upper()}", "from-env")
    tables = load_settings().plugins
    assert all(tables[plugin][key] == "from-env" for plugin, key in places(old))
    lines = deprecations(caplog)
    if old == "transcribe_api_key":  # a secret's variable: an ordinary override
        assert lines == [f"{old} is now {new_place(old)} (the old name still works)"]
    else:
        assert sorted(lines) == sorted([
            f"{old} is now {new_place(old)} (the old name still works)",
            f"ROOST_{old.upper()} is now {new_place(old)} (the old name still works)"])


def test_cron_limits_and_the_file_cap_moved_to_their_plugins_tables(
        caplog: pytest.LogCaptureFixture) -> None:
    from plugins.cron import CronConfig, roost_plugin_config_model
    from plugins.file_tools import FileToolsConfig
    from plugins.memory.config import memory_config

    old = Settings(cron_max_jobs_per_user=3, cron_min_interval_seconds=600, max_file_bytes=77)
    cron = roost_plugin_config_model().model_validate(old.plugins["plugins.cron"])
    assert (cron.max_jobs_per_user, cron.min_interval_seconds) == (3, 600)
    assert FileToolsConfig.model_validate(old.plugins["plugins.file_tools"]).max_file_bytes == 77
    assert memory_config(old).max_file_bytes == 77  # the memory tools shared the cap
    assert sorted(deprecations(caplog)) == [
        'cron_max_jobs_per_user is now [plugins."plugins.cron"] max_jobs_per_user '
        "(the old name still works)",
        'cron_min_interval_seconds is now [plugins."plugins.cron"] min_interval_seconds '
        "(the old name still works)",
        'max_file_bytes is now [plugins."plugins.file_tools"] max_file_bytes and '
        '[plugins."plugins.memory"] max_file_bytes (the old name still works)']
    assert CronConfig() == CronConfig(max_jobs_per_user=20, min_interval_seconds=60)


def test_a_deprecation_line_follows_the_log_format(tmp_path: Path) -> None:
    import json

    result = roost("config", "show", cwd=tmp_path, ROOST_LOG_FORMAT="json",
                   ROOST_EXEC_TIMEOUT="5")
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.strip().splitlines()
    record = json.loads(line)
    assert record["level"] == "WARNING" and record["logger"] == "roost.config"
    assert record["message"] == (f'ROOST_EXEC_TIMEOUT is now [plugins."{EXEC}"] timeout '
                                 "(the old name still works)")
