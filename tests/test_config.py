"""Configuration precedence, validation and masking."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config.masking import SECRET_MASK
from bot.config.settings import ConfigError, load_settings


@pytest.fixture(autouse=True)
def no_roost_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    monkeypatch.chdir(tmp_path)  # no stray roost.toml from the working directory

    for key in list(os.environ):
        if key.startswith("ROOST_") or key in ("ANTHROPIC_API_KEY", "TELEGRAM_BOT_TOKEN"):
            monkeypatch.delenv(key)


def test_environment_overrides_the_file_and_cli_overrides_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "roost.toml"
    path.write_text('model = "file"\nqueue_cap = 4\nmerge_window_ms = 100\n')
    monkeypatch.setenv("ROOST_MODEL", "env")
    monkeypatch.setenv("ROOST_QUEUE_CAP", "6")
    settings = load_settings(path, queue_cap=9)
    assert (settings.model, settings.queue_cap, settings.merge_window_ms) == ("env", 9, 100)


def test_data_dir_defaults_to_data_and_follows_roost_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings().data_dir == Path("data")
    monkeypatch.setenv("ROOST_DATA_DIR", str(tmp_path / "elsewhere"))
    assert load_settings().db_path == tmp_path / "elsewhere" / "roost.db"


def test_admins_come_from_a_comma_separated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_ADMINS", "telegram:42, slack:U1")
    settings = load_settings()
    assert settings.is_admin("telegram", "42") and settings.is_admin("slack", "U1")
    assert not settings.is_admin("discord", "42")


def test_malformed_admin_entry_is_rejected_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_ADMINS", "just-an-id")
    with pytest.raises(ConfigError, match="admins"):
        load_settings()


def test_trace_retention_days_defaults_to_30_and_follows_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().trace_retention_days == 30
    monkeypatch.setenv("ROOST_TRACE_RETENTION_DAYS", "7")
    assert load_settings().trace_retention_days == 7
    monkeypatch.setenv("ROOST_TRACE_RETENTION_DAYS", "0")
    with pytest.raises(ConfigError, match="trace_retention_days"):
        load_settings()


def test_a_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_broken_toml_is_reported_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "roost.toml"
    path.write_text("model = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(path)


def test_sdk_variables_are_honoured_and_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-123")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "1:abc")
    settings = load_settings()
    assert settings.anthropic_api_key is not None
    assert settings.anthropic_api_key.get_secret_value() == "sk-ant-123"
    masked = settings.masked()
    assert masked["anthropic_api_key"] == SECRET_MASK
    assert masked["telegram_bot_token"] == SECRET_MASK
    assert "sk-ant-123" not in repr(settings)
