"""Thumbnails of the images messages carried, read from the users' workspaces.

A part's file is named by the store (its workspace root and a path in it). It is
opened once, beneath the workspaces directory, following no link anywhere
(:func:`workspaces.beneath.open_beneath`): a root outside that directory, a
``..``, or a link swapped in for any component is refused. Only a regular file of at
most :data:`MAX_BYTES` is read; the thumbnail is made by the media code that
prepares images for models (decompression bombs refused, metadata such as GPS
dropped), at most :data:`EDGE` pixels on its long edge.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path, PurePosixPath

from aiohttp import web

from bot.contracts.llm import ContentPart
from bot.contracts.media import MediaError
from bot.media.images import prepare_for_model
from workspaces.beneath import PathRefused, open_beneath, open_root, read_fd, split_path

EDGE = 320
"""The long edge of a thumbnail, in pixels."""
MAX_BYTES = 25 * 1024 * 1024
"""The largest image file a thumbnail is made of."""


def _read(workspaces: Path, part: ContentPart) -> bytes:
    root = PurePosixPath(os.path.normpath(part.root)) if part.root else None
    base = PurePosixPath(os.path.normpath(workspaces.absolute()))
    if root is None or not root.is_absolute() or not root.is_relative_to(base):
        raise PathRefused("the file's workspace is not under the workspaces directory")
    parts = split_path(str(root.relative_to(base))) + split_path(part.path)
    dir_fd = open_root(workspaces)
    try:
        fd = open_beneath(dir_fd, parts)
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            raise PathRefused("not a regular file of at most 25 MB")
        return read_fd(fd, MAX_BYTES)
    finally:
        os.close(fd)


def _make(workspaces: Path, part: ContentPart) -> tuple[bytes, str]:
    return prepare_for_model(_read(workspaces, part), max_edge=EDGE, max_bytes=MAX_BYTES)


async def thumbnail(workspaces: Path, part: ContentPart) -> web.Response:
    """The thumbnail of image ``part`` (404 when it is gone, refused or no image)."""
    if part.kind != "image":
        return web.Response(status=404, text="not an image\n")
    try:
        body, mime = await asyncio.to_thread(_make, workspaces, part)
    except (OSError, PathRefused, MediaError) as exc:
        return web.Response(status=404, text=f"no thumbnail: {type(exc).__name__}\n")
    return web.Response(body=body, headers={"Content-Type": mime,
                                            "Content-Disposition": "inline"})
