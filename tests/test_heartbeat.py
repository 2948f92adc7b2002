"""The heartbeat: suppression of HEARTBEAT_OK, active hours, skips, and what it costs."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.engine.requests import NO_REPLY
from bot.pluginhost.manager import get_plugin_manager
from bot.testing.app import scripted, settle
from plugins.heartbeat import (
    ActiveHours,
    Heartbeat,
    is_effectively_empty,
    suppress_heartbeat_ack,
)
from tests.conftest import AppFactory
from tests.test_dispatch import BLOCK
from tests.test_runs import GateTools
from workspaces import workspace_dir

KEY = "default:test:direct:u1"
HEARTBEAT = "plugins.heartbeat"
ON: dict[str, Any] = {"plugins": {HEARTBEAT: {"enabled": True, "owner": "test:u1"}},
                      "timezone": "Europe/Berlin"}


def on(**table: Any) -> dict[str, Any]:
    """:data:`ON` with more keys in the heartbeat's table."""
    return {**ON, "plugins": {HEARTBEAT: {**ON["plugins"][HEARTBEAT], **table}}}
# 10:00 UTC is 11:00 (winter) or 12:00 (summer) in Berlin: inside 08:00-22:00.
NOON = dt.datetime(2026, 1, 15, 10, 0, tzinfo=dt.UTC)
CHECKLIST = "# Heartbeat\n- Is the OVEN-TIMER done? Tell me if so.\n"


def heartbeat_turn(reply: str, **step: Any) -> dict[str, Any]:
    return {"match": "^Heartbeat:", "steps": [{"reply": reply, **step}]}


def checklist(app: Roost, text: str = CHECKLIST) -> Path:
    path = workspace_dir(app.settings.workspaces_dir, "test", "u1") / "HEARTBEAT.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- suppression --------------------------------------------------------------------------------


@pytest.mark.parametrize("reply", [
    "HEARTBEAT_OK", "  **HEARTBEAT_OK**  ", "`HEARTBEAT_OK`.", "HEARTBEAT_OK - all quiet.",
    "Nothing needs you right now. HEARTBEAT_OK", "HEARTBEAT_OK\n" + "x" * 300,
    "HEART", "HEARTBEAT_",  # a stream still writing the token
])
def test_acknowledgements_become_no_reply(reply: str) -> None:
    assert suppress_heartbeat_ack(reply) == NO_REPLY


def test_real_messages_pass_without_the_token() -> None:
    long = "The oven timer went off ten minutes ago. " * 10
    assert suppress_heartbeat_ack(f"HEARTBEAT_OK\n{long}") == long.strip()
    assert suppress_heartbeat_ack("The oven is on!") == "The oven is on!"
    assert suppress_heartbeat_ack("Say HEARTBEAT_OK when") == "Say HEARTBEAT_OK when"
    assert suppress_heartbeat_ack("Hi") == "Hi"


async def test_an_ok_is_not_delivered_and_leaves_no_history_but_a_trace(
    make_app: AppFactory,
) -> None:
    provider = scripted(heartbeat_turn("HEARTBEAT_OK"), {"reply": "ok"}, loop=True)
    app, channel, log = await make_app(provider, **ON)
    checklist(app)
    beat = Heartbeat(app.settings, lambda: NOON)
    assert await beat.beat(app.runtime) == "suppressed"
    await settle(app)
    assert channel.sent == []
    request = provider.requests[-1]
    assert "<extra_context>\n# Heartbeat\n- Is the OVEN-TIMER done?" in request.system
    assert "## Persona" not in request.system  # a minimal prompt
    session = await app.store.get(KEY)
    assert session.messages == []
    runs = await app.store.runs(KEY)
    assert len(runs) == 1 and runs[0].status == "completed"
    assert runs[0].input_tokens > 0 and runs[0].output_tokens > 0
    started = [e for e in log.events if e.type == "run.started"]
    assert started[-1].payload["kind"] == "heartbeat"
    spans = await app.store.spans(runs[0].run_id)
    assert spans[0].attributes["kind"] == "heartbeat"


async def test_a_streamed_ok_never_shows(make_app: AppFactory) -> None:
    provider = scripted(heartbeat_turn("HEARTBEAT_OK", chunk=3, chunk_delay=0.001))
    app, channel, _ = await make_app(provider, stream=True, **ON)
    checklist(app)
    assert await Heartbeat(app.settings, lambda: NOON).beat(app.runtime) == "suppressed"
    assert channel.streams == [[None]] and channel.sent == []


async def test_a_real_message_is_delivered_and_kept_in_the_conversation(
    make_app: AppFactory,
) -> None:
    provider = scripted(heartbeat_turn("The OVEN-TIMER is done."),
                        {"match": "^thanks", "reply": "You're welcome."})
    app, channel, _ = await make_app(provider, **on(chat="dm-7"))
    checklist(app)
    assert await Heartbeat(app.settings, lambda: NOON).beat(app.runtime) == "delivered"
    assert channel.replies == ["The OVEN-TIMER is done."]
    assert channel.sent[0].chat_id == "dm-7"
    session = await app.store.get(KEY)
    assert [m.role for m in session.messages] == ["user", "assistant"]
    assert session.messages[0].content.startswith("Heartbeat: a scheduled check-in")
    await channel.say("thanks")
    await settle(app)
    assert [m.content for m in provider.requests[-1].messages][-2:] == [
        "The OVEN-TIMER is done.", "thanks"]


# -- when it runs ---------------------------------------------------------------------------------


def test_active_hours() -> None:
    day = ActiveHours.parse("08:00-22:00")
    assert dt.time(8, 0) in day and dt.time(21, 59) in day
    assert dt.time(7, 59) not in day and dt.time(22, 0) not in day
    night = ActiveHours.parse("22:30-06:00")
    assert dt.time(23, 0) in night and dt.time(5, 59) in night and dt.time(12, 0) not in night
    assert dt.time(3, 0) in ActiveHours.parse("00:00-24:00")
    for bad in ("8-22", "08:00-25:00", "24:00-08:00", "08:61-09:00"):
        with pytest.raises(ValueError, match="active_hours"):
            ActiveHours.parse(bad)


async def test_it_runs_only_within_active_hours_in_the_configured_time_zone(
    make_app: AppFactory,
) -> None:
    provider = scripted(heartbeat_turn("HEARTBEAT_OK"), loop=True)
    app, _, _ = await make_app(provider, **ON)
    checklist(app)
    now = dt.datetime(2026, 1, 15, 6, 30, tzinfo=dt.UTC)  # 07:30 in Berlin

    def clock() -> dt.datetime:
        return now

    beat = Heartbeat(app.settings, clock)
    assert await beat.beat(app.runtime) == "inactive"
    now = dt.datetime(2026, 1, 15, 7, 0, tzinfo=dt.UTC)  # 08:00 in Berlin
    assert await beat.beat(app.runtime) == "suppressed"
    now = dt.datetime(2026, 1, 15, 21, 0, tzinfo=dt.UTC)  # 22:00 in Berlin
    assert await beat.beat(app.runtime) == "inactive"
    assert len(provider.requests) == 1


async def test_it_skips_while_the_owner_has_a_run_in_progress(make_app: AppFactory) -> None:
    gate = GateTools()
    provider = scripted({"match": "^chat$", **BLOCK}, heartbeat_turn("HEARTBEAT_OK"),
                        loop=True)
    app, channel, _ = await make_app(provider, gate, **ON)
    checklist(app)
    await channel.say("chat")
    await asyncio.wait_for(gate.started.wait(), 5)
    beat = Heartbeat(app.settings, lambda: NOON)
    assert await beat.beat(app.runtime) == "busy"
    gate.release.set()
    await settle(app)
    assert not any("Heartbeat:" in r.messages[-1].content for r in provider.requests)
    assert await beat.beat(app.runtime) == "suppressed"


async def test_an_empty_or_missing_checklist_costs_nothing(make_app: AppFactory) -> None:
    provider = scripted(heartbeat_turn("HEARTBEAT_OK"), loop=True)
    app, _, _ = await make_app(provider, **ON)
    beat = Heartbeat(app.settings, lambda: NOON)
    assert await beat.beat(app.runtime) == "empty"  # no HEARTBEAT.md
    checklist(app, "# Heartbeat\n\n<!-- add checks here -->\n- [ ]\n---\n")
    assert await beat.beat(app.runtime) == "empty"
    assert provider.requests == []
    assert is_effectively_empty("")
    assert not is_effectively_empty("# H\nwater the plants")


# -- wiring ----------------------------------------------------------------------------------------


async def test_jobs_and_the_sanitizer_are_offered_as_configured(tmp_path: Path) -> None:
    host = get_plugin_manager(load_entry_points=False)
    off = Settings(data_dir=tmp_path)
    jobs = await host.collect("roost_scheduled_jobs", settings=off)
    assert ("memory_flush", "every 6h") in [(j.name, j.schedule) for j in jobs]
    assert "heartbeat" not in [j.name for j in jobs]
    assert not [s for s in await host.collect("roost_output_sanitizers", settings=off)
                if s.name == "suppress_heartbeat_ack"]

    table = on(interval_minutes=45)
    table["plugins"]["plugins.memory"] = {"flush_every_hours": 1.5}
    on_ = Settings(data_dir=tmp_path, **table)
    jobs = await host.collect("roost_scheduled_jobs", settings=on_)
    assert sorted((j.name, j.schedule) for j in jobs if j.name != "error-retention") == [
        ("heartbeat", "every 45m"), ("memory_flush", "every 90m")]
    assert [s for s in await host.collect("roost_output_sanitizers", settings=on_)
            if s.name == "suppress_heartbeat_ack"]

    bad = Settings(data_dir=tmp_path,
                   plugins={HEARTBEAT: {"enabled": True, "owner": "nobody"}})
    assert sorted(j.name for j in await host.collect("roost_scheduled_jobs", settings=bad)) == [
        "error-retention", "memory_flush"]
    assert '[plugins."plugins.heartbeat"] owner' in host.errors["plugins.heartbeat"]
