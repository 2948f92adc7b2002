"""Where a user's workspace lives, and keeping file tools inside it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath, PureWindowsPath

from bot.contracts.tools import ToolError

MAX_COMPONENT_LENGTH = 64
"""Longest directory name :func:`safe_component` produces."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_HASH_LEN = 8
# A name that already ends like a hashed one gets a hash of its own, so a raw
# id can never equal the sanitized form of a different id.
_HASH_SUFFIX = re.compile(r"-[0-9a-f]{8}\Z")


def safe_component(value: str) -> str:
    """Turn an arbitrary id into one safe, collision-free directory name.

    Characters outside ``[A-Za-z0-9_.-]`` become ``_``; the result is never
    empty, ``.`` or ``..`` and at most :data:`MAX_COMPONENT_LENGTH` long. When
    the id had to change, ``-`` and 8 hex digits of its SHA-256 are appended,
    so ``"a/b"`` and ``"a_b"`` map to different names. Ids that are already
    safe map to themselves.
    """
    cleaned = _UNSAFE.sub("_", value)
    if cleaned in ("", ".", ".."):
        cleaned = cleaned.replace(".", "_") or "_"
    if (
        cleaned == value
        and len(cleaned) <= MAX_COMPONENT_LENGTH
        and not _HASH_SUFFIX.search(cleaned)
    ):
        return cleaned
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]
    return f"{cleaned[: MAX_COMPONENT_LENGTH - _HASH_LEN - 1]}-{digest}"


def workspace_dir(root: Path, channel: str, user_id: str) -> Path:
    """The workspace directory of ``user_id`` on ``channel``: ``root/<channel>/<user>``.

    Both parts go through :func:`safe_component`; nothing is created.
    """
    return root / safe_component(channel) / safe_component(user_id)


def resolve_in_workspace(workspace: Path, user_path: str) -> Path:
    """Resolve ``user_path`` (relative to ``workspace``) to an absolute path inside it.

    A check of the path as it is now, not a way to open it: the path may be a
    link by the time it is opened, so open files with
    :class:`workspaces.root.WorkspaceRoot` instead. ``""`` and ``"."`` mean the
    workspace itself. Symlinks are followed, so a link inside the workspace that
    points outside it (or a not-yet-existing file below such a link) is refused
    too. The path need not exist.

    Raises :class:`~bot.contracts.tools.ToolError` with code ``INVALID_ARGUMENT`` (not a
    string), ``INVALID_PATH`` (null byte, absolute, ``~``, unresolvable) or
    ``PATH_ESCAPE`` (resolves outside the workspace).
    """
    if not isinstance(user_path, str):
        raise ToolError(
            f"path must be a string, got {type(user_path).__name__}", code="INVALID_ARGUMENT"
        )
    if "\x00" in user_path:
        raise ToolError(f"path {user_path!r} contains a null byte", code="INVALID_PATH")
    if user_path.startswith("~"):
        raise ToolError(
            f"path {user_path!r}: '~' is not expanded; use a path relative to your workspace",
            code="INVALID_PATH",
        )
    # Both flavours, so "C:\\x" is refused on a POSIX host too; anything else
    # that lands outside is caught by the containment check below.
    if PurePosixPath(user_path).is_absolute() or PureWindowsPath(user_path).is_absolute():
        raise ToolError(
            f"path {user_path!r} is absolute; use a path relative to your workspace",
            code="INVALID_PATH",
        )
    try:
        root = workspace.resolve()
        target = (root / user_path).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on 3.11/3.12
        raise ToolError(
            f"path {user_path!r} cannot be resolved: {exc}", code="INVALID_PATH"
        ) from exc
    if not target.is_relative_to(root):
        raise ToolError(f"path {user_path!r} is outside your workspace", code="PATH_ESCAPE")
    return target
