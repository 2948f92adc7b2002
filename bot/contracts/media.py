"""The media contract: the errors of fetching files and the transcriber protocol.

Channels raise :class:`MediaError` / :class:`MediaTooLarge` from
:meth:`bot.contracts.channel.Channel.download` and ``send``; the core's intake
(:mod:`bot.media`) raises them for files it refuses. A plugin offers speech to
text through the ``roost_transcriber`` hook with a :class:`Transcriber`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class MediaError(Exception):
    """A file could not be fetched, read or sent; the message is one line for people."""


class MediaTooLarge(MediaError):
    """A file is over a size limit. ``size`` may be a lower bound (the reading
    stopped past ``limit``); ``limit`` is 0 when the raiser does not know it."""

    def __init__(self, size: int, limit: int = 0, message: str = "") -> None:
        self.size = size
        self.limit = limit
        super().__init__(message or (f"file is {size} bytes, over the limit of {limit}"
                                     if limit else f"file is too large ({size} bytes)"))


@runtime_checkable
class Transcriber(Protocol):
    """Speech to text for voice notes and audio files.

    ``transcribe`` gets the file's bytes, its sniffed MIME type and its name and
    returns the transcript (``""`` for silence). Failures raise
    :class:`MediaError` with a one-line reason; the user is told, the run goes on.
    """

    name: str

    async def transcribe(self, data: bytes, mime_type: str, name: str) -> str:
        """The text spoken in ``data``."""
        ...
