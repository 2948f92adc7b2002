"""Built-in plugin: read, write, list and edit files in the user's workspace.

Every path is opened once below ``context.workspace`` with no link followed at
open (:class:`workspaces.root.WorkspaceRoot`; a link the user made that stays
inside is resolved explicitly first), and the tool works on that descriptor,
so nothing outside the workspace is read or written even while the workspace
changes underneath. Failures raise
:class:`~bot.contracts.tools.ToolError` with one of these codes: ``INVALID_ARGUMENT``,
``INVALID_PATH``, ``PATH_ESCAPE``, ``NOT_FOUND``, ``IS_A_DIRECTORY``,
``NOT_A_DIRECTORY``, ``NOT_A_FILE``, ``TOO_LARGE``, ``BINARY_FILE``,
``NO_MATCH``, ``MULTIPLE_MATCHES``, ``IO_ERROR``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from roost import (
    Parts,
    Settings,
    Tool,
    ToolContext,
    ToolError,
    WorkspaceRoot,
    check_keys,
    hookimpl,
    lstat_at,
    make_dirs,
    read_fd,
    str_arg,
    user_parts,
    write_atomic,
)

MAX_LIST_ENTRIES = 500
"""``list_files`` shows at most this many entries and notes how many it left out."""

_NEW_FILE_MODE = 0o644
_PATH_HELP = "Path relative to your workspace, e.g. 'notes/todo.md'."

# Serialises read-modify-write on one file: a user's group and direct chats
# can run at once against the same workspace. Weak values drop idle locks.
_file_locks: weakref.WeakValueDictionary[Path, asyncio.Lock] = weakref.WeakValueDictionary()


PLUGIN_NAME = "plugins.file_tools"


class FileToolsConfig(BaseModel):
    """``[plugins."plugins.file_tools"]``: the workspace file tools (``max_file_bytes`` before)."""

    model_config = ConfigDict(extra="forbid")

    max_file_bytes: int = Field(1_000_000, ge=1)
    """The largest file the file tools read or write."""


@hookimpl
def roost_plugin_config_model() -> type[FileToolsConfig]:
    """The ``[plugins."plugins.file_tools"]`` table."""
    return FileToolsConfig


@hookimpl
def roost_tools(settings: Settings) -> list[Tool]:
    """The four workspace file tools, capped at the table's ``max_file_bytes``."""
    cap = FileToolsConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {}).max_file_bytes

    async def read_file(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path",))
        path = str_arg(args, "path")
        shown, text = await asyncio.to_thread(_read_file, context.workspace, path, cap)
        return text if text else f"({shown} is empty)"

    async def write_file(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path", "content"))
        path = str_arg(args, "path")
        content = str_arg(args, "content")
        data = _encode(content, "content")
        if len(data) > cap:
            raise ToolError(
                f"content for {path!r} is {len(data)} bytes, over the {cap}-byte limit; "
                "split it across several files",
                code="TOO_LARGE",
            )
        parts = await asyncio.to_thread(_file_parts, context.workspace, path)
        async with _lock_for(context.workspace, parts):
            existed = await asyncio.to_thread(_write_file, context.workspace, parts, path, data)
        verb = "Overwrote" if existed else "Created"
        return f"{verb} {'/'.join(parts)} ({len(data)} bytes)."

    async def list_files(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=(), optional=("path",))
        path = str_arg(args, "path", default=".")
        where, entries = await asyncio.to_thread(_list_dir, context.workspace, path)
        shown = entries[:MAX_LIST_ENTRIES]
        header = f"{where}/ ({len(entries)} entries)"
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
        parts = await asyncio.to_thread(_file_parts, context.workspace, path)
        async with _lock_for(context.workspace, parts):
            line = await asyncio.to_thread(_edit, context.workspace, parts, path, old, new, cap)
        return f"Edited {'/'.join(parts)}: replaced 1 occurrence at line {line}."

    return [
        Tool(
            name="read_file",
            read_only=True,
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
            read_only=True,
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


def _file_parts(workspace: Path, path: str) -> Parts:
    """``path`` checked and its links resolved (they must stay inside); must name a file."""
    if path.endswith(("/", "\\")):
        raise ToolError(f"{path!r} names a directory, not a file", code="IS_A_DIRECTORY")
    parts = user_parts(path)
    if parts and workspace.is_dir():  # else write_file creates it: nothing to resolve
        with WorkspaceRoot(workspace) as root:
            try:
                parts = root.resolve(parts, path)
            except OSError as exc:
                raise _io_error(path, exc) from exc
    if not parts:
        raise ToolError(f"{path!r} names a directory, not a file", code="IS_A_DIRECTORY")
    return parts


def _encode(text: str, name: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # Lone surrogates survive JSON decoding but are not valid UTF-8.
        raise ToolError(
            f"'{name}' contains a character that is not valid UTF-8 at index {exc.start}",
            code="INVALID_ARGUMENT",
        ) from None


def _lock_for(workspace: Path, parts: Parts) -> asyncio.Lock:
    key = workspace.joinpath(*parts)
    lock = _file_locks.get(key)
    if lock is None:
        lock = _file_locks[key] = asyncio.Lock()
    return lock


def _io_error(path: str, exc: OSError) -> ToolError:
    return ToolError(f"{path!r}: {exc.strerror or exc}", code="IO_ERROR")


def _parent_is_file(path: str) -> ToolError:
    return ToolError(
        f"cannot create {path!r}: a parent path is a file, not a directory",
        code="NOT_A_DIRECTORY",
    )


def _not_found(path: str, exc: OSError) -> ToolError:
    if isinstance(exc, NotADirectoryError):
        return ToolError(f"{path!r} does not exist (a parent is a file)", code="NOT_FOUND")
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"{path!r} does not exist", code="NOT_FOUND")
    return _io_error(path, exc)


def _read_file(workspace: Path, path: str, cap: int) -> tuple[str, str]:
    """Open ``path`` once below the workspace and read it: ``(shown path, text)``."""
    with WorkspaceRoot(workspace) as root:
        try:
            fd, parts = root.open(path)
        except OSError as exc:
            raise _not_found(path, exc) from None
    try:
        return "/".join(parts) or ".", _read_text(fd, path, cap)
    finally:
        os.close(fd)


def _read_text(fd: int, path: str, cap: int) -> str:
    """The UTF-8 text of the open file ``fd``; a :class:`ToolError` unless it is one."""
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path!r} is a directory; use list_files to see its contents",
                            code="IS_A_DIRECTORY")
        if not stat.S_ISREG(st.st_mode):
            # A FIFO or device would block the reading thread or never end.
            raise ToolError(f"{path!r} is not a regular file", code="NOT_A_FILE")
        if st.st_size > cap:
            raise ToolError(f"{path!r} is {st.st_size} bytes, over the {cap}-byte limit",
                            code="TOO_LARGE")
        # One byte past the cap in case the file grew since fstat().
        data = read_fd(fd, cap + 1)
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


def _write_file(workspace: Path, parts: Parts, path: str, data: bytes) -> bool:
    """Write ``data`` as ``parts`` (whole or not at all); return whether it existed.

    Missing parent directories are created; each directory is opened below the
    one before without following a link, and the file is renamed into place
    relative to its directory's descriptor.
    """
    with WorkspaceRoot(workspace, create=True) as root:
        try:
            dir_fd = make_dirs(root.fd, parts[:-1])
        except (FileExistsError, NotADirectoryError):
            raise _parent_is_file(path) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(f"path {path!r} is a link that changed while it was "
                                "opened, or leads outside your workspace",
                                code="PATH_ESCAPE") from None
            raise _io_error(path, exc) from exc
    try:
        mode, existed = _NEW_FILE_MODE, False
        try:
            st = lstat_at(dir_fd, parts[-1])
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _io_error(path, exc) from exc
        else:
            if stat.S_ISDIR(st.st_mode):
                raise ToolError(f"{path!r} is a directory", code="IS_A_DIRECTORY")
            if stat.S_ISREG(st.st_mode):
                existed, mode = True, stat.S_IMODE(st.st_mode) & 0o777
            elif not stat.S_ISLNK(st.st_mode):
                raise ToolError(f"{path!r} is not a regular file", code="NOT_A_FILE")
            # A link swapped in since resolving is replaced, never written through.
        try:
            write_atomic(dir_fd, parts[-1], data, mode)
        except OSError as exc:
            raise _io_error(path, exc) from exc
        return existed
    finally:
        os.close(dir_fd)


def _list_dir(workspace: Path, path: str) -> tuple[str, list[str]]:
    """Open directory ``path`` once below the workspace: ``(shown path, sorted entries)``."""
    with WorkspaceRoot(workspace) as root:
        try:
            fd, parts = root.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except NotADirectoryError:
            raise ToolError(
                f"{path!r} is a file, not a directory; use read_file", code="NOT_A_DIRECTORY"
            ) from None
        except OSError as exc:
            raise _not_found(path, exc) from None
    try:
        with os.scandir(fd) as it:
            raw = sorted(it, key=lambda e: e.name)
            entries = [_describe_entry(e) for e in raw]
    except OSError as exc:
        raise _io_error(path, exc) from exc
    finally:
        os.close(fd)
    return "/".join(parts) or ".", entries


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


def _edit(workspace: Path, parts: Parts, path: str, old: str, new: str, cap: int) -> int:
    """Replace the single occurrence of ``old``; return its 1-based line number."""
    with WorkspaceRoot(workspace) as root:
        try:
            fd, _ = root.open(parts)
        except OSError as exc:
            raise _not_found(path, exc) from None
    try:
        text = _read_text(fd, path, cap)
    finally:
        os.close(fd)
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
    _write_file(workspace, parts, path, data)
    return text.count("\n", 0, at) + 1


def _find_all(text: str, needle: str) -> list[int]:
    # Overlapping matches count: "aa" in "aaa" is ambiguous, not unique.
    found = []
    start = text.find(needle)
    while start != -1:
        found.append(start)
        start = text.find(needle, start + 1)
    return found
