"""A skill's other files: listed for ``load_skill``, read one at a time by ``read_skill_file``.

Both work on a descriptor of the skill's folder opened without links; a file is opened
once below it with no link followed at any component (a link inside a skill, or one
swapped in meanwhile, is refused) and read from that descriptor, at most
:data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import errno
import os
import stat

from plugins.skills.format import SKILL_FILE
from roost import ToolError, open_beneath, read_fd, user_parts

MAX_FILE_BYTES = 256 * 1024
"""The largest skill file ``read_skill_file`` returns; a larger one is refused."""
MAX_LISTED = 200
"""Files named by ``load_skill``; past it the list says how many more there are."""


def list_files(skill_fd: int) -> list[str]:
    """The skill's files (not ``SKILL.md``, no links, no hidden names) as relative paths
    with their sizes, sorted, at most :data:`MAX_LISTED` plus a line for the rest."""
    found: list[str] = []
    more = 0
    for top, dirs, files, dir_fd in os.fwalk(".", dir_fd=skill_fd, follow_symlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            rel = os.path.normpath(os.path.join(top, name))
            if name.startswith(".") or rel == SKILL_FILE:
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if len(found) >= MAX_LISTED:
                more += 1
                continue
            found.append(f"{rel} ({st.st_size} bytes)")
    if more:
        found.append(f"... and {more} more files")
    return found


def read_file(skill_fd: int, skill: str, path: object) -> str:
    """The text of ``path`` in the skill; :class:`ToolError` for anything else."""
    parts = user_parts(path)
    if not parts:
        raise ToolError("'path' names the skill's folder; give a file in it",
                        code="INVALID_PATH")
    if any(p.startswith(".") for p in parts):
        raise ToolError(f"{path!r}: hidden files of a skill are not readable",
                        code="INVALID_PATH")
    try:
        fd = open_beneath(skill_fd, parts, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise ToolError(f"{path!r} is a link; skill files are read only as plain files "
                            "inside the skill's folder", code="PATH_ESCAPE") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ToolError(f"skill {skill!r} has no file {path!r} (load_skill lists its "
                            "files)", code="NOT_FOUND") from None
        raise ToolError(f"cannot open {path!r}: {exc.strerror}", code="NOT_FOUND") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path!r} is not a regular file", code="INVALID_PATH")
        if info.st_size > MAX_FILE_BYTES:
            raise ToolError(f"{path!r} is too large to read ({info.st_size} bytes; at most "
                            f"{MAX_FILE_BYTES}); run a script on it with exec instead",
                            code="TOO_LARGE")
        data = read_fd(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"{path!r} grew past {MAX_FILE_BYTES} bytes", code="TOO_LARGE")
    if b"\x00" in data[:8192]:
        raise ToolError(f"{path!r} is a binary file; it cannot be read as text (use it "
                        "from a script with exec)", code="INVALID_PATH")
    return data.decode("utf-8", "replace")
