"""Built-in plugin: read, write, list and edit files in the user's workspace.

Every path goes through :func:`workspaces.resolve_in_workspace`, so a tool can
never touch anything outside ``context.workspace``. Failures raise
:class:`~bot.contracts.tools.ToolError` with one of these codes: ``INVALID_ARGUMENT``,
``INVALID_PATH``, ``PATH_ESCAPE``, ``NOT_FOUND``, ``IS_A_DIRECTORY``,
``NOT_A_DIRECTORY``, ``NOT_A_FILE``, ``TOO_LARGE``, ``BINARY_FILE``,
``NO_MATCH``, ``MULTIPLE_MATCHES``, ``IO_ERROR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roost import Settings, Tool, ToolContext, ToolError, check_keys, hookimpl, str_arg
from workspaces import resolve_in_workspace

MAX_LIST_ENTRIES = 500
"""``list_files`` shows at most this many entries and notes how many it left out."""

_NEW_FILE_MODE = 0o644
_PATH_HELP = "Path relative to your workspace, e.g. 'notes/todo.md'."

# Serialises read-modify-write on one file: a user's group and direct chats
# can run at once against the same workspace. Weak values drop idle locks.
_file_locks: weakref.WeakValueDictionary[Path, asyncio.Lock] = weakref.WeakValueDictionary()


@hookimpl
def roost_tools(settings: Settings) -> list[Tool]:
    """The four workspace file tools, capped at ``settings.max_file_bytes``."""
    cap = settings.max_file_bytes

    async def read_file(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path",))
        path = str_arg(args, "path")
        target = resolve_in_workspace(context.workspace, path)
        text = await asyncio.to_thread(_read_text, target, path, cap)
        return text if text else f"({_display(context.workspace, target)} is empty)"

    async def write_file(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path", "content"))
        path = str_arg(args, "path")
        content = str_arg(args, "content")
        target = _resolve_file(context.workspace, path)
        data = _encode(content, "content")
        if len(data) > cap:
            raise ToolError(
                f"content for {path!r} is {len(data)} bytes, over the {cap}-byte limit; "
                "split it across several files",
                code="TOO_LARGE",
            )
        async with _lock_for(target):
            existed = await asyncio.to_thread(_write_atomic, target, path, data)
        verb = "Overwrote" if existed else "Created"
        return f"{verb} {_display(context.workspace, target)} ({len(data)} bytes)."

    async def list_files(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=(), optional=("path",))
        path = str_arg(args, "path", default=".")
        target = resolve_in_workspace(context.workspace, path)
        entries = await asyncio.to_thread(_list_dir, target, path)
        shown = entries[:MAX_LIST_ENTRIES]
        header = f"{_display(context.workspace, target)}/ ({len(entries)} entries)"
        if not entries:
            return f"{header}: empty directory"
        lines = [header, *shown]
        if len(entries) > len(shown):
            lines.append(f"({len(entries) - len(shown)} more)")
        return "\n".join(lines)

    async def edit_file(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path", "old", "new"))
        path = str_arg(args, "path")
        old = str_arg(args, "old")
        new = str_arg(args, "new")
        if not old:
            raise ToolError(
                "'old' must not be empty; to replace the whole file use write_file",
                code="INVALID_ARGUMENT",
            )
        target = _resolve_file(context.workspace, path)
        async with _lock_for(target):
            line = await asyncio.to_thread(_edit, target, path, old, new, cap)
        return (
            f"Edited {_display(context.workspace, target)}: replaced 1 occurrence at line {line}."
        )

    return [
        Tool(
            name="read_file",
            description=(
                "Read a UTF-8 text file from your workspace and return its full content. "
                f"Files over {cap} bytes and binary files are refused. "
                "Use list_files to find paths."
            ),
            input_schema=_schema(path=_PATH_HELP, required=("path",)),
            execute=read_file,
        ),
        Tool(
            name="write_file",
            description=(
                "Create or completely replace a text file in your workspace with 'content' "
                "(missing parent directories are created). Overwrites without asking, so "
                "for small changes to an existing file prefer edit_file. "
                f"At most {cap} bytes."
            ),
            input_schema=_schema(
                path=_PATH_HELP,
                content="The complete new content of the file (UTF-8 text).",
                required=("path", "content"),
            ),
            execute=write_file,
        ),
        Tool(
            name="list_files",
            description=(
                "List a directory of your workspace (not recursive), sorted by name: "
                "directories end with '/', files show their size in bytes, hidden files "
                f"included. At most {MAX_LIST_ENTRIES} entries are shown."
            ),
            input_schema=_schema(
                path="Directory relative to your workspace; omit or use '.' for its root.",
                required=(),
            ),
            execute=list_files,
        ),
        Tool(
            name="edit_file",
            description=(
                "Replace exactly one occurrence of 'old' with 'new' in a text file of your "
                "workspace. 'old' must match the file exactly, whitespace and line breaks "
                "included, and must occur exactly once: add surrounding lines to make it "
                "unique. Use an empty 'new' to delete the text. Read the file first."
            ),
            input_schema=_schema(
                path=_PATH_HELP,
                old="The exact text to replace; must occur exactly once in the file.",
                new="The replacement text (may be empty).",
                required=("path", "old", "new"),
            ),
            execute=edit_file,
        ),
    ]


def _schema(*, required: tuple[str, ...], **descriptions: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            name: {"type": "string", "description": text} for name, text in descriptions.items()
        },
        "required": list(required),
        "additionalProperties": False,
    }






def _resolve_file(workspace: Path, path: str) -> Path:
    """Resolve a path that must name a file, not the root or a directory-style path."""
    target = resolve_in_workspace(workspace, path)
    if path.endswith(("/", "\\")) or target == workspace.resolve():
        raise ToolError(f"{path!r} names a directory, not a file", code="IS_A_DIRECTORY")
    return target


def _encode(text: str, name: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # Lone surrogates survive JSON decoding but are not valid UTF-8.
        raise ToolError(
            f"'{name}' contains a character that is not valid UTF-8 at index {exc.start}",
            code="INVALID_ARGUMENT",
        ) from None


def _display(workspace: Path, target: Path) -> str:
    rel = target.relative_to(workspace.resolve())
    return rel.as_posix() if rel.parts else "."


def _lock_for(target: Path) -> asyncio.Lock:
    lock = _file_locks.get(target)
    if lock is None:
        lock = _file_locks[target] = asyncio.Lock()
    return lock


def _io_error(path: str, exc: OSError) -> ToolError:
    return ToolError(f"{path!r}: {exc.strerror or exc}", code="IO_ERROR")


def _parent_is_file(path: str) -> ToolError:
    return ToolError(
        f"cannot create {path!r}: a parent path is a file, not a directory",
        code="NOT_A_DIRECTORY",
    )


def _stat_regular_file(target: Path, path: str) -> os.stat_result:
    try:
        st = target.stat()
    except FileNotFoundError:
        raise ToolError(f"{path!r} does not exist", code="NOT_FOUND") from None
    except NotADirectoryError:
        raise ToolError(f"{path!r} does not exist (a parent is a file)", code="NOT_FOUND") from None
    except OSError as exc:
        raise _io_error(path, exc) from exc
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(
            f"{path!r} is a directory; use list_files to see its contents", code="IS_A_DIRECTORY"
        )
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or device would block the reading thread or never end.
        raise ToolError(f"{path!r} is not a regular file", code="NOT_A_FILE")
    return st


def _read_text(target: Path, path: str, cap: int) -> str:
    size = _stat_regular_file(target, path).st_size
    if size > cap:
        raise ToolError(f"{path!r} is {size} bytes, over the {cap}-byte limit", code="TOO_LARGE")
    try:
        with target.open("rb") as fh:
            # Read one byte past the cap in case the file grew since stat().
            data = fh.read(cap + 1)
    except OSError as exc:
        raise _io_error(path, exc) from exc
    if len(data) > cap:
        raise ToolError(f"{path!r} is over the {cap}-byte limit", code="TOO_LARGE")
    if b"\x00" in data:
        raise ToolError(f"{path!r} is a binary file, not text", code="BINARY_FILE")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            f"{path!r} is not UTF-8 text (invalid byte at offset {exc.start}); "
            "it is probably a binary file",
            code="BINARY_FILE",
        ) from None


def _write_atomic(target: Path, path: str, data: bytes) -> bool:
    """Write ``data`` to ``target`` via a temp file; return whether it existed."""
    mode = _NEW_FILE_MODE
    existed = False
    try:
        st = target.stat()
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        raise _parent_is_file(path) from None
    except OSError as exc:
        raise _io_error(path, exc) from exc
    else:
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path!r} is a directory", code="IS_A_DIRECTORY")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path!r} is not a regular file", code="NOT_A_FILE")
        existed = True
        mode = stat.S_IMODE(st.st_mode)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise _parent_is_file(path) from None
    except OSError as exc:
        raise _io_error(path, exc) from exc
    tmp_name = ""
    try:
        fd, tmp_name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name[:100]}.", suffix=".tmp"
        )
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except OSError as exc:
        if tmp_name:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
        raise _io_error(path, exc) from exc
    return existed


def _list_dir(target: Path, path: str) -> list[str]:
    try:
        with os.scandir(target) as it:
            raw = sorted(it, key=lambda e: e.name)
            entries = [_describe_entry(e) for e in raw]
    except FileNotFoundError:
        raise ToolError(f"{path!r} does not exist", code="NOT_FOUND") from None
    except NotADirectoryError:
        raise ToolError(
            f"{path!r} is a file, not a directory; use read_file", code="NOT_A_DIRECTORY"
        ) from None
    except OSError as exc:
        raise _io_error(path, exc) from exc
    return entries


def _describe_entry(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return f"{entry.name} (symlink)"
        if entry.is_dir():
            return f"{entry.name}/"
        return f"{entry.name} ({entry.stat().st_size} bytes)"
    except OSError:
        # Vanished or unreadable since scandir; still worth listing by name.
        return f"{entry.name} (unreadable)"


def _edit(target: Path, path: str, old: str, new: str, cap: int) -> int:
    """Replace the single occurrence of ``old``; return its 1-based line number."""
    text = _read_text(target, path, cap)
    positions = _find_all(text, old)
    if not positions:
        raise ToolError(
            f"'old' text was not found in {path!r} (0 occurrences); read the file and copy "
            "the text exactly, including whitespace and line breaks",
            code="NO_MATCH",
        )
    if len(positions) > 1:
        raise ToolError(
            f"'old' text occurs {len(positions)} times in {path!r}; include more "
            "surrounding text so it matches exactly once",
            code="MULTIPLE_MATCHES",
        )
    at = positions[0]
    updated = text[:at] + new + text[at + len(old) :]
    data = _encode(updated, "new")
    if len(data) > cap:
        raise ToolError(
            f"the edited {path!r} would be {len(data)} bytes, over the {cap}-byte limit",
            code="TOO_LARGE",
        )
    _write_atomic(target, path, data)
    return text.count("\n", 0, at) + 1


def _find_all(text: str, needle: str) -> list[int]:
    # Overlapping matches count: "aa" in "aaa" is ambiguous, not unique.
    found = []
    start = text.find(needle)
    while start != -1:
        found.append(start)
        start = text.find(needle, start + 1)
    return found
