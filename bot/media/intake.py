"""The intake: the files of one inbound message, fetched, checked, stored and described.

For each attachment, in order: the count and size caps (``media_max_files``,
``media_max_file_mb``, ``media_max_total_mb``) are checked against what the
platform declared, then the channel downloads it with the remaining limit
(a lying declaration is caught there); the type is sniffed from the bytes;
the file is stored byte for byte as ``inbox/<UTC date>/<safe name>`` in the
sender's workspace; and it becomes what the model gets: a
:class:`~bot.contracts.llm.ContentPart` (images, PDFs) and one line of text
(``[photo: inbox/2026-11-23/photo-1.jpg, 1280×960, 131 KB]``). Voice notes
and audio go through the transcriber. A refused or failed file costs one
Roost-written notice to the chat naming the file and the reason, never the
rest of the message.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bot.config.settings import Settings
from bot.contracts.llm import ContentPart, charge_transcription
from bot.contracts.media import MediaError, MediaTooLarge, Transcriber
from bot.contracts.messages import Attachment, InboundMessage
from bot.contracts.tools import ToolError
from bot.media.derived import hand_over
from bot.media.documents import pdf_page_count
from bot.media.images import ImageTooLarge, inspect_image
from bot.media.sniff import extension_for, sniff_mime
from workspaces import safe_file_name
from workspaces.files import store_file_at

log = logging.getLogger("roost.media.intake")

Download = Callable[[Attachment, int], Awaitable[bytes]]
"""``channel.download``: the bytes of an attachment, at most ``limit`` of them."""

INBOX_DIR = "inbox"
MAX_DOCUMENT_PAGES = 100
"""A longer PDF is stored but not shown to the model as a document (Anthropic takes at
most 100 pages per request, and each costs 1,500-3,000 tokens)."""
MB = 1024 * 1024

NO_TRANSCRIBER_NOTICE = ("Voice messages are not set up here, so I cannot listen to {name}. "
                         "Please type your message instead.")
NO_TRANSCRIBER_HINT = ("a voice note arrived but no transcriber is configured: set "
                       "base_url in [plugins.\"plugins.transcribe\"] to an OpenAI-compatible "
                       "/v1/audio/transcriptions server, or install a plugin that offers "
                       "roost_transcriber")

_hinted = False


@dataclass(frozen=True, slots=True)
class Caps:
    """Per-message limits, in bytes and files."""

    max_file: int
    max_files: int
    max_total: int

    @classmethod
    def of(cls, settings: Settings) -> Caps:
        """The caps ``settings`` configure."""
        return cls(int(settings.media_max_file_mb * MB), settings.media_max_files,
                   int(settings.media_max_total_mb * MB))


@dataclass(slots=True)
class Received:
    """What the files of one message became."""

    parts: list[ContentPart] = field(default_factory=list)
    """Images and PDFs for the model, in the order they came."""
    lines: list[str] = field(default_factory=list)
    """Text for the model: one line per file (two for a transcribed voice note)."""
    notices: list[str] = field(default_factory=list)
    """Roost-written lines for the chat: refused files, failed downloads, no transcriber."""
    stored: list[str] = field(default_factory=list)
    """Workspace-relative paths of the files stored."""
    usable: int = 0
    """Files the model can do something with (stored and readable, or transcribed)."""

    @property
    def text(self) -> str:
        """The lines joined, for the user turn."""
        return "\n".join(self.lines)


def size_text(size: int) -> str:
    """``512 B``, ``131 KB``, ``2.1 MB``, ``30 MB``: how sizes read in chat."""
    if size < 1024:
        return f"{size} B"
    if size < MB:
        return f"{size // 1024} KB"
    mb = size / MB
    text = f"{mb:.0f}" if mb >= 10 else f"{mb:.1f}".removesuffix(".0")
    return f"{text} MB"


def duration_text(seconds: float) -> str:
    """``0:12``, ``1:05:09``."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def ogg_duration(data: bytes) -> float:
    """Seconds of an Ogg Opus/Vorbis stream from its last page's granule position; 0 if unsure."""
    last = data.rfind(b"OggS")
    if last < 0 or len(data) < last + 14:
        return 0.0
    granule = int.from_bytes(data[last + 6:last + 14], "little", signed=True)
    if granule <= 0:
        return 0.0
    if b"OpusHead" in data[:512]:
        return granule / 48_000  # Opus granules always count 48 kHz samples
    vorbis = data.find(b"\x01vorbis")
    if vorbis >= 0 and len(data) >= vorbis + 16:
        rate = int.from_bytes(data[vorbis + 12:vorbis + 16], "little")
        return granule / rate if rate else 0.0
    return 0.0


def display_name(name: str, limit: int = 80) -> str:
    """A file name as Roost quotes it in the chat and to the model: one line, no control
    or format characters (a name is the sender's text, and may try to look like Roost's
    own lines), at most ``limit`` characters."""
    cleaned = "".join(" " if unicodedata.category(c)[0] in "CZ" and c != " " else c
                      for c in name)
    cleaned = " ".join(cleaned.split()).replace("[", "(").replace("]", ")")
    return cleaned if len(cleaned) <= limit else cleaned[:limit - 1] + "…"


def _label(attachment: Attachment, mime: str) -> str:
    if mime.startswith("image/"):
        return "photo" if attachment.kind in ("photo", "sticker") else "image"
    if mime == "application/pdf":
        return "document"
    if mime.startswith("audio/") or attachment.kind in ("voice", "audio"):
        return "voice" if attachment.kind == "voice" else "audio"
    if mime.startswith("video/"):
        return "video"
    return "file"


def _file_name(attachment: Attachment, index: int, message: InboundMessage, mime: str) -> str:
    """The name to store under: the original one made safe, its extension fitted to the bytes."""
    kind = attachment.kind if attachment.kind in ("photo", "voice", "audio", "video",
                                                  "document", "sticker") else "file"
    ident = safe_file_name(message.message_id) if message.message_id else str(index + 1)
    name = safe_file_name(attachment.name, fallback=f"{kind}-{ident}")
    right = extension_for(mime)
    stem, dot, ext = name.rpartition(".")
    if not dot:
        return name + right
    claimed = sniff_ext_mime(ext)
    if right and claimed and claimed != mime and not _generic(mime):
        # A .png that is a JPEG is stored as what it is: tools and people opening
        # it later go by the extension.
        return stem + right
    return name


def sniff_ext_mime(ext: str) -> str:
    """The MIME type an extension claims (``png`` → ``image/png``), ``""`` if unknown."""
    import mimetypes

    return mimetypes.types_map.get(f".{ext.lower()}", "")


def _generic(mime: str) -> bool:
    return mime in ("text/plain", "application/octet-stream", "application/zip")


async def receive(
    message: InboundMessage,
    workspace: Path,
    download: Download | None,
    settings: Settings,
    *,
    transcriber: Transcriber | None = None,
    find_transcriber: Callable[[], Awaitable[Transcriber | None]] | None = None,
    today: dt.date | None = None,
) -> Received:
    """Fetch, check, store and describe the attachments of ``message``.

    ``download`` is the message's channel's (``None``: the channel is gone, every
    file fails with a notice). ``find_transcriber`` is asked (once) for a transcriber
    when the first audio file turns up, if none was given. Never raises for a file's
    sake: each failure becomes a notice and a line; cancellation propagates.
    """
    caps = Caps.of(settings)
    day = (today or dt.datetime.now(dt.UTC).date()).isoformat()
    directory = f"{INBOX_DIR}/{day}"
    out = Received()
    used = 0
    voice_refused = False
    note = message.attachment_note()
    if note:
        # A location, a contact, a poll: nothing to fetch, described as it came.
        out.lines.append(note)
        out.usable += 1
    files = [a for a in message.attachments if a.url]
    for index, attachment in enumerate(files):
        shown = display_name(attachment.name) or f"{attachment.kind or 'file'} {index + 1}"
        if index >= caps.max_files:
            _refuse(out, shown, f"{shown} was not accepted: at most {caps.max_files} "
                    f"files are accepted per message")
            continue
        if attachment.size > caps.max_file:
            _refuse(out, shown, _too_large(shown, attachment.size, caps.max_file))
            continue
        remaining = caps.max_total - used
        if attachment.size > remaining or remaining <= 0:
            _refuse(out, shown, _over_total(shown, caps.max_total))
            continue
        limit = min(caps.max_file, remaining)
        try:
            if download is None:
                raise MediaError("the chat it came from is not connected")
            data = await download(attachment, limit)
            if len(data) > limit:
                raise MediaTooLarge(len(data), limit)
        except MediaTooLarge as exc:
            _refuse(out, shown, _too_large(shown, exc.size, caps.max_file, exact=False)
                    if limit == caps.max_file else _over_total(shown, caps.max_total))
            continue
        except MediaError as exc:
            _fail(out, shown, f"I could not fetch {shown}: {exc}")
            continue
        except Exception as exc:  # a channel bug must not cost the message its text
            log.warning("downloading %s from %s failed: %s", shown, message.channel,
                        type(exc).__name__, exc_info=exc)
            _fail(out, shown, f"I could not fetch {shown}: the download failed")
            continue
        used += len(data)
        mime = sniff_mime(data, attachment.mime_type, attachment.name)
        label = _label(attachment, mime)
        name = _file_name(attachment, index, message, mime)
        try:
            info = await asyncio.to_thread(_check_and_store, workspace, directory, name,
                                           data, mime)
        except ImageTooLarge as exc:
            _refuse(out, shown, f"{shown} was not accepted: {exc}")
            continue
        except (MediaError, ToolError, OSError) as exc:
            log.warning("storing %s in %s failed: %s", shown, workspace, exc)
            _fail(out, shown, f"I could not store {shown}: "
                    f"{exc if isinstance(exc, MediaError) else 'the workspace is not writable'}")
            continue
        path, width, height, pages = info
        out.stored.append(path)
        root = str(workspace)
        size = size_text(len(data))
        if label in ("photo", "image") and width:
            out.parts.append(ContentPart("image", path, mime, width, height, len(data), root))
            out.lines.append(f"[{label}: {path}, {width}×{height}, {size}]")
            out.usable += 1
        elif label in ("photo", "image"):
            out.lines.append(f"[{label}: {path}, {mime}, {size} — a format that cannot be "
                             "shown to the model]")
            out.usable += 1
        elif label == "document":
            if pages > MAX_DOCUMENT_PAGES:
                out.lines.append(f"[document: {path}, PDF, {pages} pages, {size} — too long "
                                 f"to show the model at once (over {MAX_DOCUMENT_PAGES} pages)]")
            elif pages:
                out.parts.append(ContentPart("document", path, mime, 0, 0, len(data), root,
                                             pages))
                out.lines.append(f"[document: {path}, PDF, {pages} "
                                 f"page{'s' if pages != 1 else ''}, {size}]")
            else:
                out.lines.append(f"[document: {path}, PDF, {size} — not a readable PDF]")
            out.usable += 1
        elif label in ("voice", "audio"):
            seconds = attachment.duration or (ogg_duration(data) if mime == "audio/ogg" else 0)
            length = f" {duration_text(seconds)}" if seconds else ""
            if transcriber is None and find_transcriber is not None:
                transcriber, find_transcriber = await find_transcriber(), None
            if transcriber is None:
                global _hinted
                if not voice_refused:
                    voice_refused = True
                    out.notices.append(NO_TRANSCRIBER_NOTICE.format(name=shown))
                if not _hinted:
                    _hinted = True
                    log.warning(NO_TRANSCRIBER_HINT)
                else:
                    log.info(NO_TRANSCRIBER_HINT)
                out.lines.append(f"[{label}{length}: {path}, {size} — not transcribed: voice "
                                 "is not set up; the user was told]")
                continue
            try:
                transcript = (await transcriber.transcribe(data, mime, name)).strip()
            except Exception as exc:
                reason = str(exc) if isinstance(exc, MediaError) else "the transcriber failed"
                log.warning("transcribing %s with %s failed: %s", shown,
                            getattr(transcriber, "name", "?"), exc)
                out.notices.append(f"I could not transcribe {shown}: {reason}")
                out.lines.append(f"[{label}{length}: {path}, {size} — could not be "
                                 "transcribed; the user was told]")
                continue
            await charge_transcription(transcriber, transcript)
            out.lines.append(f"[{label}{length}] {transcript or '(no speech)'}")
            out.lines.append(f"[{label} file: {path}, {size}]")
            out.usable += 1
        elif label == "video":
            length = f", {duration_text(attachment.duration)}" if attachment.duration else ""
            out.lines.append(f"[video: {path}, {mime}{length}, {size}]")
            out.usable += 1
        else:
            out.lines.append(f"[file: {path}, {mime}, {size}]")
            out.usable += 1
    return out


def _check_and_store(workspace: Path, directory: str, name: str, data: bytes,
                     mime: str) -> tuple[str, int, int, int]:
    """Inspect, then store (off the event loop): ``(path, width, height, pages)``."""
    width = height = pages = 0
    if mime.startswith("image/") and mime != "image/svg+xml":
        try:
            info = inspect_image(data)
            width, height = info.width, info.height
        except ImageTooLarge:
            raise  # refused: not stored either
        except MediaError:
            pass  # a format Pillow cannot read (HEIC): stored as a plain file
    elif mime == "application/pdf":
        try:
            pages = pdf_page_count(data)
        except MediaError:
            pages = 0
    # Stored with its pages dropped from the page cache: nothing reads them soon (the
    # provider gets the bytes in memory, tools rarely open a file just received).
    path, where = store_file_at(workspace, directory, name, data)
    if width or 0 < pages <= MAX_DOCUMENT_PAGES:
        # What the provider sends next: it takes these bytes instead of reading them back.
        hand_over(where, data)
    return path, width, height, pages


def _too_large(name: str, size: int, limit: int, *, exact: bool = True) -> str:
    limit_text = size_text(limit)
    if not exact and size <= limit + 1:
        return f"{name} is over {limit_text}; files over {limit_text} are not accepted"
    return f"{name} is {size_text(size)}; files over {limit_text} are not accepted"


def _over_total(name: str, total: int) -> str:
    return (f"{name} was not accepted: the files of one message may add up to "
            f"{size_text(total)} at most")


def _refuse(out: Received, name: str, notice: str) -> None:
    out.notices.append(notice)
    out.lines.append(f"[{name}: not accepted ({notice.removeprefix(name).strip(' :;')}); "
                     "the user was told]")


def _fail(out: Received, name: str, notice: str) -> None:
    out.notices.append(notice)
    out.lines.append(f"[{name}: could not be received; the user was told]")
