"""The files of a reply, each opened once before anything of the reply is posted.

A channel uploads from the descriptors these give (:class:`~roost.OpenFile`),
never from the path again, so what it checked (the size) is what it sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from bot.contracts.files import OpenFile
from bot.contracts.media import MediaError
from bot.contracts.messages import OutboundFile


@contextlib.contextmanager
def opened_files(files: Sequence[OutboundFile],
                 check: Callable[[OutboundFile, int], None]) -> Iterator[list[OpenFile]]:
    """Open every file of ``files`` once (:meth:`OutboundFile.opened`); closed after the block.

    ``check(file, size)`` raises (say :class:`~roost.MediaTooLarge`) for a file
    that must not go; a file that cannot be opened raises :class:`MediaError`.
    """
    opened: list[OpenFile] = []
    try:
        for file in files:
            try:
                handle = file.opened()
            except OSError as exc:
                raise MediaError(f"cannot read {file.name}: {exc.strerror or exc}") from exc
            opened.append(handle)
            check(file, handle.size)
        yield opened
    finally:
        for handle in opened:
            handle.close()
