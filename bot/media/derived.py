"""Copies of received files made for a model, kept in the workspace so each is made once.

Preparing a 12-megapixel photo for a model (decode, scale, re-encode) costs
tens of milliseconds of CPU, and a conversation sends its images again with
every model call, after restarts too. The prepared copy is therefore stored
next to the originals, in the workspace's hidden ``.cache/media/`` directory,
under a name derived from the original (its path, size, modification time and
inode: an edit, a replace or a new file with the same name makes a new name)
and from how it was prepared (``variant``, e.g. the long edge). The original
is never changed.

The files here are a cache: a missing, unreadable or damaged copy is made
again, and the caller checks a copy before it sends it (see
:func:`bot.media.images.model_ready`), since anything in a workspace may have
been changed by the file tools.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
from pathlib import Path

from bot.contracts.tools import ToolError
from workspaces.paths import resolve_in_workspace

log = logging.getLogger("roost.media.derived")

CACHE_DIR = ".cache/media"
"""Where the prepared copies live, relative to the workspace."""
VERSION = 1
"""Part of every name: a change to how copies are made (quality, filter) bumps it, so
copies made the old way are no longer found."""


def derived_name(path: str, stat: os.stat_result, variant: str) -> str:
    """The file name of the copy of workspace file ``path`` (as ``stat`` found it)."""
    key = f"{VERSION}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}\0{variant}"
    return f"{hashlib.sha256(key.encode()).hexdigest()[:40]}-{variant}"


def read_derived(workspace: Path, name: str) -> bytes | None:
    """The copy called ``name`` in ``workspace``, or ``None`` (not made yet, unreadable,
    or a link leading out of the workspace)."""
    try:
        target = resolve_in_workspace(workspace, f"{CACHE_DIR}/{name}")
        return target.read_bytes()
    except (OSError, ToolError):
        return None


def write_derived(workspace: Path, name: str, data: bytes) -> bool:
    """Keep ``data`` as the copy called ``name``; ``False`` if it could not be written.

    Written aside and renamed into place, so a reader finds the whole copy or
    none. A failure (read-only workspace, disk full, a link planted as the
    directory) is logged and otherwise ignored: the copy is made again next time.
    """
    temp: Path | None = None
    try:
        directory = resolve_in_workspace(workspace, CACHE_DIR)
        directory.mkdir(parents=True, exist_ok=True)
        # Resolved again now that it exists: a link planted as the directory is refused.
        directory = resolve_in_workspace(workspace, CACHE_DIR)
        temp = directory / f".{name}.{uuid.uuid4().hex}"
        with open(temp, "xb") as out:
            out.write(data)
        os.replace(temp, directory / name)
        temp = None
        return True
    except (OSError, ToolError) as exc:
        log.info("could not keep a prepared copy in %s: %s", workspace, exc)
        return False
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                temp.unlink()
