"""A file opened once and read by offset: what an upload streams from.

:class:`OpenFile` wraps one descriptor of a regular file. Readers never
reopen its path, and each reads by offset (``pread``), so a retried upload
starts again from byte 0 of the same file, whatever has been linked or
renamed at its path since. Reads stop at the size the file had when opened.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import stat
from collections.abc import AsyncIterator
from types import TracebackType

CHUNK = 1 << 20
"""Bytes read at a time by :meth:`OpenFile.chunks`."""


class OpenFile:
    """A regular file's descriptor, its size at open, and readers that share it.

    ``owned``: :meth:`close` closes the descriptor (else whoever opened it does).
    """

    def __init__(self, fd: int, *, owned: bool = True) -> None:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            # OSError picks IsADirectoryError for EISDIR.
            code = errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL
            raise OSError(code, "not a regular file")
        self.fd = fd
        self.size = info.st_size
        self.owned = owned

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> OpenFile:
        """Open ``path`` once, its last component not followed if it is a link; owned.

        For a path someone else confined (an absolute path of a plugin's own
        making); workspace files come opened from :mod:`workspaces`.
        """
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC)
        try:
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def borrowed(self) -> OpenFile:
        """This descriptor, as an :class:`OpenFile` whose :meth:`close` leaves it open."""
        twin = OpenFile.__new__(OpenFile)
        twin.fd, twin.size, twin.owned = self.fd, self.size, False
        return twin

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset``, never past :attr:`size`."""
        size = max(0, min(size, self.size - offset))
        return os.pread(self.fd, size, offset) if size else b""

    def read_all(self) -> bytes:
        """The whole file (its first :attr:`size` bytes)."""
        chunks, offset = [], 0
        while offset < self.size:
            chunk = self.read_at(offset, CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    async def chunks(self, size: int = CHUNK) -> AsyncIterator[bytes]:
        """The file from byte 0 in pieces, each read off the event loop."""
        offset = 0
        while offset < self.size:
            chunk = await asyncio.to_thread(self.read_at, offset, size)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    def reader(self) -> io.BufferedReader:
        """A new file object at byte 0 with a position of its own; closing it leaves the
        descriptor open."""
        return io.BufferedReader(_OffsetReader(self))

    def close(self) -> None:
        """Close the descriptor if this object owns it (once)."""
        if self.owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class _OffsetReader(io.RawIOBase):
    """A seekable raw reader over an :class:`OpenFile` that reads by offset."""

    def __init__(self, source: OpenFile) -> None:
        super().__init__()
        self._source = source
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._source.read_at(self._pos, len(buffer))
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._source.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos
