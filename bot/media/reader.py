"""The files of a conversation, made ready for a model API (``roost.MediaReader``).

A :class:`~bot.contracts.llm.ContentPart` names a file in the user's workspace;
:class:`MediaReader` turns it into what a provider puts on the wire:

- an image into :class:`ImageData` (base64, resized by
  :func:`bot.media.images.prepare_for_model`: long edge at most 1568 px,
  EXIF stripped, JPEG/PNG/GIF/WebP, small enough that its *base64* text fits
  the 5 MB per image the Messages API counts);
- a PDF into :class:`DocumentData` (base64) when the model takes documents,
  else into its text, extracted with pypdf;
- anything that cannot go (the model does not see images, the file is gone or
  unreadable) into a :class:`Note`, one line of text the model reads instead.
  A part never makes the API call fail: a file that would be refused by the API
  would be refused on every later turn too, since history keeps its parts.

Reading and resizing cost tens of milliseconds per photo and a conversation
sends its images again on every model call, so a photo is prepared once: the
prepared copy is kept in the workspace (:mod:`bot.media.derived`, found again
after a restart) and the wire payloads in memory (bounded by bytes; keyed by
path, size, modification time and inode). The methods are synchronous:
providers call :meth:`MediaReader.read_all` in a worker thread, and images
are prepared on the one media thread (:mod:`bot.media.heap`: photo buffers
stay in one malloc arena, handed back once photos stop coming).
"""

from __future__ import annotations

import base64
import io
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import TYPE_CHECKING

from bot.contracts.llm import ContentPart
from bot.contracts.media import MediaError
from bot.contracts.tools import ToolError
from bot.media.derived import (
    derived_name,
    forget_derived,
    read_derived,
    take_over,
    tidy,
    write_derived,
)
from bot.media.heap import heap, on_media_thread
from bot.media.images import model_ready, prepare_for_model
from workspaces.beneath import read_fd
from workspaces.root import WorkspaceRoot

if TYPE_CHECKING:
    # Imported where a PDF or a photo is handled: a process that gets neither never
    # loads pypdf (with cryptography) or Pillow.
    from pypdf import PdfReader

__all__ = [
    "MAX_IMAGE_BASE64",
    "MAX_PDF_PAGES",
    "PDF_TEXT_LIMIT",
    "Base64Text",
    "DocumentData",
    "ImageData",
    "MediaReader",
    "Note",
    "Prepared",
]

log = logging.getLogger("roost.media.reader")

MAX_IMAGE_EDGE = 1568
"""Anthropic's recommended long edge: larger images are scaled down by the API anyway."""
ANTHROPIC_MAX_PIXELS = 1_200_000
"""Anthropic also scales down what would cost over ~1,600 tokens (width × height / 750):
a 4:3 photo is seen at about 1268×951, so sending more pixels only costs upload. An
image that must be scaled anyway is scaled to this (1264×948 for a 4000×3000 photo:
above the ~1.15 megapixels of the API's own size table, so the model sees every pixel
it would have seen of the original)."""
PASS_SLACK = 1.1
"""An image that needs no scaling for the hard limits (long edge 1568 px, 5 MB) and has
at most this many times the pixels the API looks at (1280×960, Telegram's usual photo,
is 2.4% over 1.2 MP) is sent as it is: re-encoding it would cost CPU and a generation
of JPEG loss to save the API a resize it does for free."""
OPENAI_SHORT_EDGE = 768
"""OpenAI's high detail scales an image so its short side is at most 768 px."""
MAX_IMAGE_BASE64 = 5 * 1024 * 1024
"""The Messages API's per-image limit, measured on the base64 text."""
MAX_PDF_PAGES = 100
"""Pages a PDF document block may have; a longer PDF goes as text."""
MAX_PDF_BYTES = 24 * 1024 * 1024
"""A PDF sent as a document (its base64 must fit the API's 32 MB request)."""
PDF_TEXT_LIMIT = 60_000
"""Characters of extracted PDF text given to a model; the rest is cut with a note."""
CACHE_BYTES = 8 * 1024 * 1024
"""Prepared payloads kept between model calls (base64 and text characters). Images past
it are read back from their prepared copy on disk, never prepared again."""
RELEASE_AFTER_SECONDS = 2.0
"""How long after the last model call with a newly prepared file the decode buffers
are handed back to the system (see :class:`bot.media.heap.Heap`)."""

_IMAGE_FORMATS = ("image/jpeg", "image/png", "image/gif", "image/webp")
# Raw bytes whose base64 text fits MAX_IMAGE_BASE64 (4 characters per 3 bytes).
_IMAGE_RAW_LIMIT = MAX_IMAGE_BASE64 // 4 * 3


class Base64Text(str):
    """Text that holds base64 only (``A-Z a-z 0-9 + / =``): an image's or a PDF's data.

    JSON needs no escape in it, so a request body can take it as it is instead of
    through the JSON encoder (:func:`plugins.anthropic_body.encode_messages`).
    Elsewhere it is an ordinary string.
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ImageData:
    """An image ready for the wire: its MIME type and base64 data (:class:`Base64Text`)."""

    part: ContentPart
    mime_type: str
    data: str


@dataclass(frozen=True, slots=True)
class DocumentData:
    """A PDF ready for the wire as base64 data (:class:`Base64Text`)."""

    part: ContentPart
    data: str


@dataclass(frozen=True, slots=True)
class Note:
    """Text the model reads in place of a file (or the text extracted from it)."""

    part: ContentPart
    text: str


Prepared = ImageData | DocumentData | Note


class MediaReader:
    """Prepares content parts for one provider; thread-safe, with a bounded cache.

    ``documents`` says whether the provider's API takes PDF document blocks (the
    Messages API does; OpenAI-compatible servers get the text).
    """

    def __init__(self, *, documents: bool, max_pixels: int = 0, max_short_edge: int = 0,
                 cache_bytes: int = CACHE_BYTES,
                 release_after: float = RELEASE_AFTER_SECONDS) -> None:
        self.documents = documents
        self.max_pixels = max_pixels
        """Pixels the model sees at most (0: no limit beyond the long edge)."""
        self.max_short_edge = max_short_edge
        """The short side the model sees at most (0: no such limit)."""
        self.cache_bytes = cache_bytes
        self.release_after = release_after
        """Seconds of quiet before freed buffers go back to the system (0: at once)."""
        self._cache: OrderedDict[tuple[str, str, int, int, int], Prepared] = OrderedDict()
        self._cached = 0
        self._fresh = 0
        self._lock = threading.Lock()

    def read_all(self, parts: Iterable[ContentPart], *, vision: bool) -> list[Prepared]:
        """Each part that has something to give the model, prepared, in order.

        Audio parts give nothing (their transcript is in the message text), nor
        do documents other than PDFs (the message text names them; the file
        tools read them).
        """
        prepared: list[Prepared] = []
        for part in parts:
            item = self.read(part, vision=vision)
            if item is not None:
                prepared.append(item)
        return prepared

    def read(self, part: ContentPart, *, vision: bool) -> Prepared | None:
        """``part`` prepared for the model, or ``None`` if it gives the model nothing.

        Images are prepared on the media thread (the caller waits), PDFs in the
        calling thread: a long text extraction holds up no photo.
        """
        is_pdf = part.kind == "document" and part.mime_type == "application/pdf"
        if part.kind != "image" and not is_pdf:
            return None
        if part.kind == "image" and not vision:
            return Note(part, f"[image: {part.path} — this model cannot see images]")
        mode: str = part.kind
        if is_pdf:
            mode = "document" if vision and self.documents else "pdf-text"
        try:
            # Opened once below the workspace, no link followed at open: a link planted
            # in inbox/ (a tool can write there) never sends a file from outside.
            with WorkspaceRoot(Path(part.root)) as workspace:
                fd, parts = workspace.open(part.path)
        except ToolError:
            return Note(part, f"[{part.kind}: {part.path} — outside the workspace; not sent]")
        except OSError:
            if part.root:
                forget_derived(Path(part.root), part.path)
            return Note(part, f"[{part.kind}: {part.path} — the file is no longer available]")
        try:
            return self._read_open(part, mode, fd, Path(part.root).joinpath(*parts))
        finally:
            os.close(fd)

    def _read_open(self, part: ContentPart, mode: str, fd: int, path: Path) -> Prepared | None:
        """:meth:`read` once the file is open as ``fd`` (``path``: how it is known)."""
        try:
            stat = os.fstat(fd)
        except OSError as exc:
            return _unreadable(part, exc)
        if not S_ISREG(stat.st_mode):
            return Note(part, f"[{part.kind}: {part.path} — not a regular file; not sent]")
        key = (mode, str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return _for(part, hit)
        if mode == "image":
            item = on_media_thread(self._image, part, path, stat, fd)
        else:
            try:
                data = take_over(path, stat) or read_fd(fd, stat.st_size)
            except OSError as exc:
                return _unreadable(part, exc)
            if mode == "document":
                item = self._document(part, data)
            else:
                item = _pdf_text(part, data, "this model cannot read PDF documents")
            del data
            with self._lock:
                self._fresh += 1
        self._remember(key, item)
        return item

    def release(self) -> None:
        """Hand the freed buffers back to the system once photos stop coming.

        Providers call it when a request with files is done: by then the decode
        buffers, the request's base64 and the intake's download are all freed.
        If a file was prepared since the last call, the heap is trimmed
        :attr:`release_after` seconds later, unless another file is prepared
        before then (see :class:`bot.media.heap.Heap`); calls that only re-sent
        prepared files change nothing.
        """
        with self._lock:
            fresh, self._fresh = self._fresh, 0
        if fresh:
            heap.release(self.release_after)

    def edge_for(self, width: int, height: int, slack: float = 1.0) -> int:
        """The long edge to scale an image of ``width`` × ``height`` to, at most.

        The API would scale a larger image down itself; doing it here sends fewer
        bytes and spends less CPU on resampling. Unknown dimensions: 1568.
        ``slack`` allows that many times the pixels the API looks at (the short
        side: its square root) before the edge goes below the image's own.
        """
        edge = MAX_IMAGE_EDGE
        if width <= 0 or height <= 0:
            return edge
        long, short = max(width, height), min(width, height)
        pixels = self.max_pixels * slack
        if self.max_pixels and width * height > pixels:
            edge = min(edge, int(long * math.sqrt(pixels / (width * height))))
        short_edge = int(self.max_short_edge * math.sqrt(slack))
        if self.max_short_edge and short > short_edge:
            edge = min(edge, long * short_edge // short)
        return max(edge, 1)

    def _image(self, part: ContentPart, path: Path, stat: os.stat_result, fd: int) -> Prepared:
        """The image prepared once: the copy kept in the workspace, else made (and kept).

        ``fd`` is the original, open; its bytes are read from there, never by path.
        """
        edge = self.edge_for(part.width, part.height)
        loose = max(edge, self.edge_for(part.width, part.height, PASS_SLACK))
        root = Path(part.root) if part.root else None
        name = derived_name(part.path, stat, f"{edge}px") if root is not None else None
        if root is not None and name is not None:
            kept = read_derived(root, name)
            if kept is not None:
                mime = model_ready(kept, max_edge=loose, max_bytes=_IMAGE_RAW_LIMIT,
                                   formats=_IMAGE_FORMATS)
                if mime is not None:
                    return self._encoded(part, kept, mime)
        try:
            # The intake has just stored it: its bytes, not a read back from disk.
            data = take_over(path, stat) or read_fd(fd, stat.st_size)
        except OSError as exc:
            return _unreadable(part, exc)
        heap.keep()
        with self._lock:
            self._fresh += 1
        try:
            prepared, mime = prepare_for_model(
                data, max_edge=edge, pass_edge=loose, max_bytes=_IMAGE_RAW_LIMIT,
                formats=_IMAGE_FORMATS)
        except MediaError as exc:
            return Note(part, f"[image: {part.path} — {exc}]")
        if root is not None and name is not None and prepared is not data:
            write_derived(root, name, prepared)
            tidy(root)
        del data
        return self._encoded(part, prepared, mime)

    def _encoded(self, part: ContentPart, prepared: bytes, mime: str) -> Prepared:
        encoded = Base64Text(base64.b64encode(prepared), "ascii")
        if len(encoded) > MAX_IMAGE_BASE64:
            # prepare_for_model promised otherwise; sending it would fail every turn.
            log.warning("prepared image %s is still %d bytes as base64", part.path, len(encoded))
            return Note(part, f"[image: {part.path} — too large to show the model]")
        return ImageData(part, mime, encoded)

    def _document(self, part: ContentPart, data: bytes) -> Prepared:
        if len(data) > MAX_PDF_BYTES:
            return _pdf_text(part, data, f"over {MAX_PDF_BYTES // (1024 * 1024)} MB")
        reader, problem = _open_pdf(data)
        if reader is None:
            return Note(part, f"[document: {part.path} — {problem}]")
        pages = len(reader.pages)
        if pages > MAX_PDF_PAGES:
            return _pdf_text(part, data, f"{pages} pages, over the {MAX_PDF_PAGES} a model "
                                         "reads as a document", reader=reader)
        return DocumentData(part, Base64Text(base64.b64encode(data), "ascii"))

    def _remember(self, key: tuple[str, str, int, int, int], item: Prepared) -> None:
        cost = _cost(item)
        if cost > self.cache_bytes:
            return
        with self._lock:
            if key in self._cache:
                return
            self._cache[key] = item
            self._cached += cost
            while self._cached > self.cache_bytes:
                _, old = self._cache.popitem(last=False)
                self._cached -= _cost(old)

    def clear(self) -> None:
        """Forget every prepared payload."""
        with self._lock:
            self._cache.clear()
            self._cached = 0


def _cost(item: Prepared) -> int:
    if isinstance(item, Note):
        return len(item.text)
    return len(item.data)


def _unreadable(part: ContentPart, exc: OSError) -> Note:
    return Note(part, f"[{part.kind}: {part.path} — the file could not be read: "
                      f"{exc.strerror or type(exc).__name__}]")


def _for(part: ContentPart, item: Prepared) -> Prepared:
    """A cached result re-addressed to ``part`` (same file, maybe another message)."""
    if item.part == part:
        return item
    if isinstance(item, ImageData):
        return ImageData(part, item.mime_type, item.data)
    if isinstance(item, DocumentData):
        return DocumentData(part, item.data)
    return Note(part, item.text)


def _open_pdf(data: bytes) -> tuple[PdfReader | None, str]:
    """A reader for ``data`` and ``""``, or ``None`` and why it cannot be read."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return None, "the PDF is password-protected"
        len(reader.pages)
    # pypdf raises many exception types on malformed files (its own, ValueError,
    # KeyError, RecursionError...): any of them means this PDF cannot be read.
    except Exception as exc:
        return None, f"not a readable PDF ({type(exc).__name__})"
    return reader, ""


def _pdf_text(part: ContentPart, data: bytes, why: str, *,
              reader: PdfReader | None = None) -> Note:
    """The text of a PDF as a note for the model, cut at :data:`PDF_TEXT_LIMIT`."""
    if reader is None:
        reader, problem = _open_pdf(data)
        if reader is None:
            return Note(part, f"[document: {part.path} — {problem}]")
    pieces: list[str] = []
    length = 0
    pages = len(reader.pages)
    cut = False
    for number, page in enumerate(reader.pages, 1):
        try:
            text = page.extract_text() or ""
        # Same as _open_pdf: a malformed page fails in many ways; skip it.
        except Exception:
            text = ""
        text = text.strip()
        if not text:
            continue
        piece = f"--- page {number} ---\n{text}"
        if length + len(piece) > PDF_TEXT_LIMIT:
            pieces.append(piece[: max(0, PDF_TEXT_LIMIT - length)])
            cut = True
            break
        pieces.append(piece)
        length += len(piece) + 1
    head = f"[document: {part.path}, {pages} page{'s' if pages != 1 else ''}"
    if not pieces:
        return Note(part, f"{head} — no text could be extracted ({why})]")
    tail = f"\n[text cut at {PDF_TEXT_LIMIT} characters]" if cut else ""
    return Note(part, f"{head} — its text follows ({why})]\n" + "\n".join(pieces) + tail)

