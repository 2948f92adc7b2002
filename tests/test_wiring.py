"""Collaborators are wired once, with constructor arguments, in the composition root.

An assignment ``x.y = ...`` (or ``x.y += ...``, ``del x.y``) where ``x`` is not
``self`` or ``cls`` sets an attribute of another object. Outside
``bot/app/roost.py`` (the composition root), tests and ``bot/testing`` (fake
platform servers tests drive), that is allowed only for the entries below, each
with its reason; an entry that no longer matches anything fails too, so the
list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path

from bot.testing.app import scripted
from tests.conftest import AppFactory

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("bot", "channels", "plugins")
COMPOSITION_ROOT = {"bot/app/roost.py"}
TEST_SUPPORT = "bot/testing/"

# (module, the object assigned to) -> why. Keys name the object as written (``ast.unparse``).
RECORDS: dict[tuple[str, str], str] = {
    # Mutable records and counters owned by the code that fills them in.
    ("bot/contracts/channel.py", "state"): "a typing indicator's own on/shown flags",
    ("bot/contracts/files.py", "twin"): "a file handle record handed over whole",
    ("bot/engine/compaction.py", "session"): "Session.pins: the cached session's pin count",
    ("bot/engine/run_engine.py", "req.session"): "Session.pins: the cached session's pin count",
    ("bot/engine/runloop.py", "req.session"): "Session.context_tokens: a gauge on the record",
    ("bot/engine/context.py", "message"): "ChatMessage.weight: the message's memoized size",
    ("bot/media/intake.py", "out"): "the intake result being built",
    ("bot/scheduling/due.py", "entry"): "a loaded job's next fire time",
    ("bot/scheduling/scheduler.py", "entry"): "a loaded job's row, spec and next fire time",
    ("bot/storage/errors.py", "item"): "a queued insert's id and attempts",
    ("bot/storage/inbox.py", "journal"): "a run journal's sequence number",
    ("bot/storage/sessions.py", "session"): "the cached session record, written by its store",
    ("bot/storage/sessions.py", "s"): "the cached session record, written by its store",
    ("bot/tools/executor.py", "metrics"): "per-tool counters",
    ("bot/tools/executor.py", "self.metrics.get(tool.name)"): "per-tool counters",
    ("bot/tools/executor.py", "self.metrics.get(call.name)"): "per-tool counters",
    ("bot/tools/structured_errors.py", "found"): "a structured error being parsed",
    ("bot/agents/router.py", "settings"):
        "the configuration record: agents and bindings re-read from its file (values)",
    ("bot/resilience/listener.py", "conn"): "a connection's phase and since when",
    ("channels/delivery.py", "state"): "a chat's send-window record",
    ("channels/telegram/client.py", "ids"): "a chat's known message ids (the probe's floor)",
    ("channels/telegram/outcomes.py", "ids"): "a chat's known message ids (the probe's floor)",
    ("channels/telegram/outcomes.py", "reply"): "a reply's unresolved-send record",
    ("channels/telegram/outcomes.py", "resume"): "a redelivery's probe floor",
    ("channels/delivery.py", "window"): "a send window's rate",
    ("plugins/anthropic_provider.py", "self.usage"): "the streamed response's usage record",
    ("plugins/exec_strip.py", "done"): "the stripping result being built",
    ("plugins/openai_provider.py", "buffer"): "a streamed tool call being assembled",
}
LIBRARY_API: dict[tuple[str, str], str] = {
    # Third-party and standard-library objects configured the way their API asks.
    ("bot/app/cli/base.py", "config_log"): "logging: held until the log format is known",
    ("bot/media/heap.py", "libc.malloc"): "ctypes: restype/argtypes",
    ("bot/media/heap.py", "libc.free"): "ctypes: argtypes",
    ("bot/media/heap.py", "libc.mallopt"): "ctypes: argtypes",
    ("bot/media/images.py", "frame"): "Pillow: a frame's info",
    ("bot/media/images.py", "img"): "Pillow: the decoder's block limit",
    ("bot/observability/logformat.py", "sys"): "the process's exception hook",
    ("bot/observability/logformat.py", "threading"): "the threads' exception hook",
    ("bot/observability/redact.py", "record"): "a logging filter rewrites the record",
    ("bot/storage/postgres.py", "mapped"): "an exception's cause and SQLite error name",
    ("channels/discord/endpoints.py", "discord.http.Route"): "discord.py: the API base URL",
    ("channels/discord/endpoints.py", "gateway_cls"): "discord.py: the gateway URL",
    ("channels/discord/endpoints.py", "discord.gateway.DiscordWebSocket"): "discord.py: gateway",
    ("channels/discord/shards.py", "intents"): "discord.py: Intents flags",
    ("channels/telegram_lazy.py", "pydantic.BaseModel"): "pydantic: lazy model rebuild",
    ("channels/slack/socketmode.py", "client"):
        "slack-sdk: the socket URL apps.connections.open returned, set before connect()",
}
ALLOWED = RECORDS | LIBRARY_API


def foreign_assignments(source: str) -> list[tuple[int, str, str]]:
    """``(line, object, attribute)`` of each assignment to another object's attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                if not (isinstance(sub, ast.Attribute)
                        and isinstance(sub.ctx, ast.Store | ast.Del)):
                    continue
                if isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
                    continue
                found.append((sub.lineno, ast.unparse(sub.value), sub.attr))
    return found


@functools.cache
def scan() -> dict[tuple[str, str], list[str]]:
    """Every foreign assignment outside the composition root and test support, by key
    (the tree is parsed once per process; callers only read the result)."""
    hits: dict[tuple[str, str], list[str]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            if module in COMPOSITION_ROOT or module.startswith(TEST_SUPPORT):
                continue
            for line, obj, attr in foreign_assignments(path.read_text(encoding="utf-8")):
                hits.setdefault((module, obj), []).append(f"{module}:{line}: {obj}.{attr}")
    return hits


def test_the_scan_finds_assignments_to_other_objects_only() -> None:
    source = (
        "engine.exporter = x\n"
        "app.dispatcher.replicas = y\n"
        "a.b += 1\n"
        "del c.d\n"
        "e.f: int = 2\n"
        "self.own = z\n"
        "cls.count = 0\n"
        "local = engine.exporter\n"
        "(g.h, i) = (1, 2)\n"
    )
    assert [(obj, attr) for _, obj, attr in foreign_assignments(source)] == [
        ("engine", "exporter"), ("app.dispatcher", "replicas"), ("a", "b"), ("c", "d"),
        ("e", "f"), ("g", "h")]


def test_no_collaborator_is_rewired_outside_the_composition_root() -> None:
    unexpected = [line for key, lines in scan().items() if key not in ALLOWED
                  for line in lines]
    assert unexpected == [], "\n".join(
        ["attributes of other objects assigned outside bot/app/roost.py; pass them to "
         "the constructor instead (or justify a value record in tests/test_wiring.py):",
         *unexpected])


def test_every_allowed_entry_is_still_needed() -> None:
    stale = sorted(set(ALLOWED) - set(scan()))
    assert stale == [], f"remove these from tests/test_wiring.py: {stale}"


def test_the_composition_root_exists_and_is_scanned_around() -> None:
    for module in COMPOSITION_ROOT:
        assert (ROOT / module).is_file()
    assert all((ROOT / module).is_file() for module, _ in ALLOWED)


def test_the_composition_root_changes_nothing_it_built() -> None:
    # Channels receive what the service shares with them when started (ChannelContext),
    # the plugin host its disabled plugins through its own methods, the HTTP server
    # its shutdown through begin_shutdown(): the root builds and passes, never patches.
    source = (ROOT / "bot/app/roost.py").read_text(encoding="utf-8")
    changes = [f"{obj}.{attr} (line {line})" for line, obj, attr in foreign_assignments(source)]
    assert changes == []


async def test_the_engine_holds_no_call_backs_only_its_sink(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    engine = app.engine
    call_backs = [name for name, value in vars(engine).items()
                  if inspect.isfunction(value) or inspect.ismethod(value)]
    assert call_backs == []
    sink = engine.sink
    assert sink.export is app.metrics and sink.deliver is app.sender
    assert sink.on_tool_failure is not None and sink.on_large_result is not None
