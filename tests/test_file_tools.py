"""The built-in workspace file tools, called the way the engine calls them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from bot.config.settings import Settings
from bot.contracts import hookspecs
from bot.contracts.tools import Tool, ToolContext, ToolError, ToolResult
from plugins import file_tools
from workspaces import ensure_workspace, forget_workspace, workspace_dir

CAP = 1000
ESCAPE_CODES = {"PATH_ESCAPE", "INVALID_PATH"}


@pytest.fixture(autouse=True)
def _fresh_seed_cache() -> Iterator[None]:
    forget_workspace()
    yield
    forget_workspace()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data",
                    plugins={"plugins.file_tools": {"max_file_bytes": CAP}})


@pytest.fixture
def tools(settings: Settings) -> dict[str, Tool]:
    return {t.name: t for t in file_tools.roost_tools(settings)}


@pytest.fixture
def ws(settings: Settings) -> Path:
    path = workspace_dir(settings.workspaces_dir, "telegram", "42")
    ensure_workspace(path)
    return path


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(
        user_id="42",
        channel="telegram",
        chat_id="42",
        session_key="telegram:42",
        run_id="run-1",
        workspace=ws,
        deadline=time.monotonic() + 30,
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("top secret")
    return path


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


async def run(tools: dict[str, Tool], ctx: ToolContext, name: str, **args: Any) -> str:
    result = await tools[name].execute(ctx, args)
    if isinstance(result, ToolResult):
        assert not result.is_error
        return result.content
    return result


async def fails(tools: dict[str, Tool], ctx: ToolContext, name: str, **args: Any) -> ToolError:
    with pytest.raises(ToolError) as exc:
        await tools[name].execute(ctx, args)
    return exc.value


# --- the plugin --------------------------------------------------------------


def test_plugin_offers_four_tools_through_the_hook(settings: Settings) -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    pm.register(file_tools, name="plugins.file_tools")
    (offered,) = pm.hook.roost_tools(settings=settings, services=None)
    assert sorted(t.name for t in offered) == ["edit_file", "list_files", "read_file", "write_file"]


def test_every_tool_has_a_strict_schema_and_description(tools: dict[str, Tool]) -> None:
    required = {
        "read_file": ["path"],
        "write_file": ["path", "content"],
        "list_files": [],
        "edit_file": ["path", "old", "new"],
    }
    for name, tool in tools.items():
        schema = tool.input_schema
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert schema["required"] == required[name]
        for prop in schema["properties"].values():
            assert prop["type"] == "string"
            assert prop["description"]
        assert len(tool.description) > 40
        assert tool.spec().name == name


# --- read_file ---------------------------------------------------------------


async def test_read_returns_file_text(tools: dict[str, Tool], ctx: ToolContext, ws: Path) -> None:
    (ws / "notes.md").write_text("héllo\r\nwörld\n", encoding="utf-8", newline="")
    assert await run(tools, ctx, "read_file", path="notes.md") == "héllo\r\nwörld\n"


async def test_read_seeded_template(tools: dict[str, Tool], ctx: ToolContext, ws: Path) -> None:
    text = await run(tools, ctx, "read_file", path="USER.md")
    assert text == (ws / "USER.md").read_text(encoding="utf-8")


async def test_read_empty_file_says_it_is_empty(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "empty.md").touch()
    assert "empty" in await run(tools, ctx, "read_file", path="empty.md")


async def test_read_missing_file_is_not_found(tools: dict[str, Tool], ctx: ToolContext) -> None:
    err = await fails(tools, ctx, "read_file", path="nope.md")
    assert err.code == "NOT_FOUND"
    assert "nope.md" in str(err)


async def test_read_directory_is_refused(tools: dict[str, Tool], ctx: ToolContext) -> None:
    err = await fails(tools, ctx, "read_file", path="memory")
    assert err.code == "IS_A_DIRECTORY"


async def test_read_over_cap_reports_size_and_cap(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "big.txt").write_text("x" * (CAP + 1))
    err = await fails(tools, ctx, "read_file", path="big.txt")
    assert err.code == "TOO_LARGE"
    assert str(CAP + 1) in str(err)
    assert str(CAP) in str(err)


async def test_read_exactly_at_cap_succeeds(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "full.txt").write_text("x" * CAP)
    assert await run(tools, ctx, "read_file", path="full.txt") == "x" * CAP


@pytest.mark.parametrize("data", [b"PK\x03\x04\x00\x00binary", b"\xff\xfe\xfa not utf-8"])
async def test_read_binary_file_is_refused(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, data: bytes
) -> None:
    (ws / "blob.bin").write_bytes(data)
    err = await fails(tools, ctx, "read_file", path="blob.bin")
    assert err.code == "BINARY_FILE"
    assert "blob.bin" in str(err)


async def test_read_fifo_is_refused_without_blocking(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    fifo = ws / "pipe"
    os.mkfifo(fifo)
    try:
        err = await asyncio.wait_for(fails(tools, ctx, "read_file", path="pipe"), timeout=3)
    finally:
        # A tool that wrongly opened the FIFO is stuck in a thread waiting for
        # a writer; give it one so the test fails instead of hanging.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert err.code == "NOT_A_FILE"


# --- write_file --------------------------------------------------------------


async def test_write_creates_parent_dirs_and_reports_bytes(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    content = "# Plan\nhéllo\n"
    msg = await run(tools, ctx, "write_file", path="notes/2024/plan.md", content=content)
    assert (ws / "notes/2024/plan.md").read_text(encoding="utf-8") == content
    assert str(len(content.encode("utf-8"))) in msg
    assert "notes/2024/plan.md" in msg


async def test_write_then_read_round_trips(tools: dict[str, Tool], ctx: ToolContext) -> None:
    await run(tools, ctx, "write_file", path="a.md", content="one\ntwo\r\n")
    assert await run(tools, ctx, "read_file", path="a.md") == "one\ntwo\r\n"


async def test_write_overwrites_and_says_so(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    assert "Created" in await run(tools, ctx, "write_file", path="a.md", content="old")
    assert "Overwrote" in await run(tools, ctx, "write_file", path="a.md", content="new")
    assert (ws / "a.md").read_text() == "new"


async def test_write_leaves_no_temp_files(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    before = set(os.listdir(ws))
    await run(tools, ctx, "write_file", path="a.md", content="x")
    await run(tools, ctx, "write_file", path="a.md", content="y")
    assert set(os.listdir(ws)) - before == {"a.md"}


async def test_failed_write_keeps_old_content_and_cleans_up(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "a.md").write_text("original")
    before = set(os.listdir(ws))

    def broken_replace(src: str, dst: str, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("plugins.file_tools.os.replace", broken_replace)
    err = await fails(tools, ctx, "write_file", path="a.md", content="new")
    assert err.code == "IO_ERROR"
    assert (ws / "a.md").read_text() == "original"
    assert set(os.listdir(ws)) == before


async def test_write_keeps_existing_file_mode(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "private.md").write_text("x")
    (ws / "private.md").chmod(0o640)
    await run(tools, ctx, "write_file", path="private.md", content="y")
    assert stat.S_IMODE((ws / "private.md").stat().st_mode) == 0o640


async def test_write_over_cap_is_refused_and_writes_nothing(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    err = await fails(tools, ctx, "write_file", path="big.md", content="é" * CAP)
    assert err.code == "TOO_LARGE"
    assert str(2 * CAP) in str(err)
    assert str(CAP) in str(err)
    assert not (ws / "big.md").exists()
    await run(tools, ctx, "write_file", path="full.md", content="x" * CAP)
    assert (ws / "full.md").stat().st_size == CAP


@pytest.mark.parametrize("path", ["", ".", "memory", "memory/", "notes/"])
async def test_write_to_a_directory_path_is_refused(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, path: str
) -> None:
    err = await fails(tools, ctx, "write_file", path=path, content="x")
    assert err.code == "IS_A_DIRECTORY"
    assert not (ws / "notes").exists()
    assert (ws / "memory").is_dir()


async def test_write_below_a_file_is_refused(tools: dict[str, Tool], ctx: ToolContext) -> None:
    err = await fails(tools, ctx, "write_file", path="USER.md/x.md", content="x")
    assert err.code == "NOT_A_DIRECTORY"


async def test_write_refuses_lone_surrogates(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    err = await fails(tools, ctx, "write_file", path="a.md", content="bad \ud800")
    assert err.code == "INVALID_ARGUMENT"
    assert not (ws / "a.md").exists()


async def test_write_creates_a_missing_workspace(
    tools: dict[str, Tool], settings: Settings, ctx: ToolContext
) -> None:
    fresh = workspace_dir(settings.workspaces_dir, "slack", "U1")
    other = ToolContext("U1", "slack", "C1", "slack:C1", "run-2", fresh, ctx.deadline)
    await run(tools, other, "write_file", path="a.md", content="hi")
    assert (fresh / "a.md").read_text() == "hi"


# --- list_files --------------------------------------------------------------


async def test_list_root_is_sorted_with_dirs_and_sizes(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / ".hidden").write_text("abc")
    listing = (await run(tools, ctx, "list_files")).splitlines()
    names = [line.split(" ")[0] for line in listing[1:]]
    assert names == sorted(names)
    assert ".hidden" in names
    assert "memory/" in names
    assert ".hidden (3 bytes)" in listing
    user_size = (ws / "USER.md").stat().st_size
    assert f"USER.md ({user_size} bytes)" in listing
    assert "8 entries" in listing[0]


async def test_list_subdirectory(tools: dict[str, Tool], ctx: ToolContext, ws: Path) -> None:
    (ws / "notes" / "sub").mkdir(parents=True)
    (ws / "notes" / "b.md").write_text("bb")
    (ws / "notes" / "a.md").write_text("a")
    listing = await run(tools, ctx, "list_files", path="notes")
    assert listing.splitlines() == [
        "notes/ (3 entries)",
        "a.md (1 bytes)",
        "b.md (2 bytes)",
        "sub/",
    ]


async def test_list_empty_directory(tools: dict[str, Tool], ctx: ToolContext) -> None:
    assert "empty" in await run(tools, ctx, "list_files", path="memory")


async def test_list_caps_entries_and_notes_the_rest(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    many = ws / "many"
    many.mkdir()
    total = file_tools.MAX_LIST_ENTRIES + 7
    for i in range(total):
        (many / f"f{i:04d}").touch()
    lines = (await run(tools, ctx, "list_files", path="many")).splitlines()
    assert len(lines) == 1 + file_tools.MAX_LIST_ENTRIES + 1
    assert lines[-1] == "(7 more)"
    assert lines[1] == "f0000 (0 bytes)"
    assert str(total) in lines[0]


async def test_list_missing_directory_is_not_found(
    tools: dict[str, Tool], ctx: ToolContext
) -> None:
    err = await fails(tools, ctx, "list_files", path="nope")
    assert err.code == "NOT_FOUND"


async def test_list_a_file_is_refused(tools: dict[str, Tool], ctx: ToolContext) -> None:
    err = await fails(tools, ctx, "list_files", path="USER.md")
    assert err.code == "NOT_A_DIRECTORY"


async def test_list_shows_symlinks_without_following_them(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path
) -> None:
    (ws / "link").symlink_to(outside)
    listing = await run(tools, ctx, "list_files")
    assert "link (symlink)" in listing.splitlines()
    assert "secret" not in listing


# --- edit_file ---------------------------------------------------------------


async def test_edit_replaces_the_single_occurrence(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "todo.md").write_text("- milk\n- eggs\n- bread\n")
    msg = await run(tools, ctx, "edit_file", path="todo.md", old="- eggs", new="- 12 eggs")
    assert (ws / "todo.md").read_text() == "- milk\n- 12 eggs\n- bread\n"
    assert "line 2" in msg


async def test_edit_with_empty_new_deletes_the_text(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "todo.md").write_text("keep\ndrop\nkeep too\n")
    await run(tools, ctx, "edit_file", path="todo.md", old="drop\n", new="")
    assert (ws / "todo.md").read_text() == "keep\nkeep too\n"


async def test_edit_with_no_match_fails_and_leaves_file(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "a.md").write_text("hello world")
    err = await fails(tools, ctx, "edit_file", path="a.md", old="Hello", new="Bye")
    assert err.code == "NO_MATCH"
    assert "0 occurrences" in str(err)
    assert (ws / "a.md").read_text() == "hello world"


async def test_edit_with_two_matches_fails_with_the_count(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "a.md").write_text("x = 1\ny = 2\nx = 1\n")
    err = await fails(tools, ctx, "edit_file", path="a.md", old="x = 1", new="x = 3")
    assert err.code == "MULTIPLE_MATCHES"
    assert "2 times" in str(err)
    assert (ws / "a.md").read_text() == "x = 1\ny = 2\nx = 1\n"


async def test_edit_counts_overlapping_matches_as_ambiguous(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "a.md").write_text("aaa")
    err = await fails(tools, ctx, "edit_file", path="a.md", old="aa", new="b")
    assert err.code == "MULTIPLE_MATCHES"
    assert (ws / "a.md").read_text() == "aaa"


async def test_edit_refuses_empty_old(tools: dict[str, Tool], ctx: ToolContext) -> None:
    err = await fails(tools, ctx, "edit_file", path="USER.md", old="", new="x")
    assert err.code == "INVALID_ARGUMENT"


async def test_edit_missing_file_is_not_found(tools: dict[str, Tool], ctx: ToolContext) -> None:
    err = await fails(tools, ctx, "edit_file", path="nope.md", old="a", new="b")
    assert err.code == "NOT_FOUND"


async def test_edit_that_would_exceed_cap_is_refused(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "a.md").write_text("x" * (CAP - 10) + "MARK")
    err = await fails(tools, ctx, "edit_file", path="a.md", old="MARK", new="y" * 100)
    assert err.code == "TOO_LARGE"
    assert (ws / "a.md").read_text().endswith("MARK")


async def test_edit_binary_file_is_refused(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    (ws / "blob").write_bytes(b"abc\x00def")
    err = await fails(tools, ctx, "edit_file", path="blob", old="abc", new="x")
    assert err.code == "BINARY_FILE"
    assert (ws / "blob").read_bytes() == b"abc\x00def"


async def test_concurrent_edits_to_one_file_all_land(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path
) -> None:
    markers = [f"<slot{i:02d}>" for i in range(30)]
    (ws / "a.md").write_text("\n".join(markers) + "\n" + "pad\n" * 100)
    await asyncio.gather(
        *(
            run(tools, ctx, "edit_file", path="a.md", old=m, new=f"done{i}")
            for i, m in enumerate(markers)
        )
    )
    text = (ws / "a.md").read_text()
    assert all(f"done{i}" in text for i in range(len(markers)))
    assert "<slot" not in text


# --- arguments ---------------------------------------------------------------


@pytest.mark.parametrize("bad", [42, None, ["a.md"], {"p": 1}])
@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("read_file", {}),
        ("write_file", {"content": "x"}),
        ("list_files", {}),
        ("edit_file", {"old": "a", "new": "b"}),
    ],
)
async def test_non_string_path_is_an_invalid_argument(
    tools: dict[str, Tool], ctx: ToolContext, name: str, extra: dict[str, Any], bad: Any
) -> None:
    err = await fails(tools, ctx, name, path=bad, **extra)
    assert err.code == "INVALID_ARGUMENT"
    assert "path" in str(err)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("write_file", {"path": "a.md", "content": 5}),
        ("edit_file", {"path": "USER.md", "old": None, "new": "x"}),
        ("edit_file", {"path": "USER.md", "old": "x", "new": 1}),
    ],
)
async def test_non_string_text_arguments_are_invalid(
    tools: dict[str, Tool], ctx: ToolContext, name: str, args: dict[str, Any]
) -> None:
    err = await fails(tools, ctx, name, **args)
    assert err.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("name", "args", "word"),
    [
        ("read_file", {}, "missing path"),
        ("write_file", {"path": "a.md"}, "missing content"),
        ("edit_file", {"path": "a.md", "old": "x"}, "missing new"),
        ("read_file", {"path": "USER.md", "offset": 3}, "unknown offset"),
    ],
)
async def test_missing_or_unknown_arguments_are_named(
    tools: dict[str, Tool], ctx: ToolContext, name: str, args: dict[str, Any], word: str
) -> None:
    err = await fails(tools, ctx, name, **args)
    assert err.code == "INVALID_ARGUMENT"
    assert word in str(err)


# --- confinement -------------------------------------------------------------

ESCAPES = ["../x", "a/../../x", "..", "~/x", "a\x00b"]


@pytest.mark.parametrize("path", [*ESCAPES, "/etc/passwd"])
async def test_read_escapes_are_refused(
    tools: dict[str, Tool], ctx: ToolContext, path: str
) -> None:
    err = await fails(tools, ctx, "read_file", path=path)
    assert err.code in ESCAPE_CODES


@pytest.mark.parametrize("path", [*ESCAPES, "/etc"])
async def test_list_escapes_are_refused(
    tools: dict[str, Tool], ctx: ToolContext, path: str
) -> None:
    err = await fails(tools, ctx, "list_files", path=path)
    assert err.code in ESCAPE_CODES


@pytest.mark.parametrize("name", ["write_file", "edit_file"])
@pytest.mark.parametrize(
    "path",
    [*ESCAPES, "../../../../outside/secret.txt", "../../../../outside/pwned"],
)
async def test_modifying_escapes_are_refused_and_write_nothing(
    tools: dict[str, Tool],
    ctx: ToolContext,
    tmp_path: Path,
    outside: Path,
    name: str,
    path: str,
) -> None:
    before = snapshot(tmp_path)
    args = {"content": "pwned"} if name == "write_file" else {"old": "top", "new": "pwned"}
    err = await fails(tools, ctx, name, path=path, **args)
    assert err.code in ESCAPE_CODES
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["write_file", "edit_file"])
async def test_absolute_path_outside_is_refused_and_writes_nothing(
    tools: dict[str, Tool], ctx: ToolContext, tmp_path: Path, outside: Path, name: str
) -> None:
    before = snapshot(tmp_path)
    for target in (outside / "secret.txt", outside / "pwned.txt"):
        args = {"content": "pwned"} if name == "write_file" else {"old": "top", "new": "pwned"}
        err = await fails(tools, ctx, name, path=str(target), **args)
        assert err.code == "INVALID_PATH"
    assert snapshot(tmp_path) == before


async def test_symlink_to_outside_cannot_be_read_listed_or_modified(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, tmp_path: Path, outside: Path
) -> None:
    (ws / "link").symlink_to(outside)
    (ws / "passwd").symlink_to(outside / "secret.txt")
    before = snapshot(outside)
    calls: list[tuple[str, dict[str, str]]] = [
        ("read_file", {"path": "link/secret.txt"}),
        ("read_file", {"path": "passwd"}),
        ("list_files", {"path": "link"}),
        ("write_file", {"path": "passwd", "content": "pwned"}),
        ("write_file", {"path": "link/secret.txt", "content": "pwned"}),
        ("write_file", {"path": "link/new.txt", "content": "pwned"}),
        ("write_file", {"path": "link/deep/new.txt", "content": "pwned"}),
        ("edit_file", {"path": "passwd", "old": "top", "new": "pwned"}),
        ("edit_file", {"path": "link/secret.txt", "old": "top", "new": "pwned"}),
    ]
    for name, args in calls:
        err = await fails(tools, ctx, name, **args)
        assert err.code == "PATH_ESCAPE", (name, args)
    assert snapshot(outside) == before
    assert (ws / "link").is_symlink()
    assert (ws / "passwd").is_symlink()


async def test_dangling_symlink_to_outside_is_not_written_through(
    tools: dict[str, Tool], ctx: ToolContext, ws: Path, outside: Path
) -> None:
    (ws / "planted.md").symlink_to(outside / "created.md")
    err = await fails(tools, ctx, "write_file", path="planted.md", content="pwned")
    assert err.code == "PATH_ESCAPE"
    assert not (outside / "created.md").exists()
