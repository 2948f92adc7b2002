"""Putting received files into a workspace: safe names, no overwrites, no duplicates."""

from __future__ import annotations

import contextlib
import os
import re
import unicodedata
import uuid
from pathlib import Path

from bot.contracts.tools import ToolError
from workspaces.paths import resolve_in_workspace

MAX_FILE_NAME = 100
"""Longest file name :func:`safe_file_name` produces (bytes on disk stay well under 255)."""

_UNSAFE_NAME = re.compile(r"[^\w.\- ()+,=@\[\]]", re.UNICODE)
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)),
             *(f"LPT{i}" for i in range(10))}


def safe_file_name(name: str, fallback: str = "file") -> str:
    """A file name that is safe to create anywhere: ``../../etc/passwd`` → ``passwd``.

    Only the last path component is kept (``/`` and ``\\`` both count);
    letters and digits of any script survive (NFC-normalized), other
    characters become ``_``; leading dots and spaces go (no hidden files), a
    Windows device name gets a ``_``, and a long name is cut to
    :data:`MAX_FILE_NAME` characters keeping its extension. ``fallback`` is
    used when nothing is left.
    """
    base = re.split(r"[/\\]", unicodedata.normalize("NFC", name))[-1]
    base = _UNSAFE_NAME.sub("_", base).strip(" .")
    base = re.sub(r"_{2,}", "_", base)
    if not base or set(base) <= {"_", "-", "."}:
        base = fallback
    stem, dot, ext = base.rpartition(".")
    if not dot:
        stem, ext = base, ""
    if stem.upper() in _RESERVED:
        stem += "_"
    ext = ext[:16]
    suffix = f".{ext}" if ext else ""
    stem = stem[: MAX_FILE_NAME - len(suffix)] or "file"
    return stem + suffix


def _numbered(name: str, number: int) -> str:
    if number == 1:
        return name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        return f"{name}-{number}"
    return f"{stem}-{number}.{ext}"


def store_file(workspace: Path, directory: str, name: str, data: bytes,
               max_tries: int = 1000) -> str:
    """Write ``data`` as ``<directory>/<name>`` in ``workspace``; returns the relative path.

    ``name`` must already be safe (:func:`safe_file_name`). An existing file is
    never overwritten: ``-2``, ``-3``... is added before the extension. A file
    with the same name (or a numbered one) and identical bytes is reused
    instead, so a run executed again after a crash does not store a second
    copy. The file appears whole or not at all (written aside, then linked in
    place, which also settles a race between two writers of one name).
    Raises :class:`~bot.contracts.tools.ToolError` if the directory is not
    inside the workspace (a symlink pointing out, say).
    """
    return store_file_at(workspace, directory, name, data, max_tries)[0]


def store_file_at(workspace: Path, directory: str, name: str, data: bytes,
                  max_tries: int = 1000) -> tuple[str, Path]:
    """:func:`store_file`, also returning the stored file's resolved absolute path."""
    target_dir = resolve_in_workspace(workspace, directory)
    if not target_dir.is_dir():
        target_dir.mkdir(parents=True, exist_ok=True)
        # Resolved again now that it exists: a link planted as the directory is refused.
        resolve_in_workspace(workspace, directory)
    temp = target_dir / f".incoming-{uuid.uuid4().hex}"
    with open(temp, "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    try:
        for number in range(1, max_tries + 1):
            candidate = _numbered(name, number)
            path = target_dir / candidate
            if path.is_symlink():
                continue
            if path.exists():
                if _same(path, data):
                    return f"{directory}/{candidate}", path
                continue
            try:
                os.link(temp, path)
            except FileExistsError:
                if _same(path, data):
                    return f"{directory}/{candidate}", path
                continue
            return f"{directory}/{candidate}", path
        raise ToolError(f"{directory} holds too many files named like {name}",
                        code="INVALID_PATH")
    finally:
        with contextlib.suppress(OSError):
            temp.unlink()


def _same(path: Path, data: bytes) -> bool:
    try:
        if not path.is_file() or path.stat().st_size != len(data):
            return False
        return path.read_bytes() == data
    except OSError:
        return False
