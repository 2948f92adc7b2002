"""Files in the fake: held for download (``getFile`` and ``/file/bot<token>/<path>``),
uploaded by the bot (``sendPhoto``, ``sendDocument`` as multipart), and pushed to
it in media messages.

Checks follow the real Bot API: ``getFile`` refuses files over 20 MB ("file is
too big") and unknown ids ("invalid file_id"); an upload over 50 MB gets 413
"Request Entity Too Large"; ``sendPhoto`` refuses what is not an image
(``IMAGE_PROCESS_FAILED``), over 10 MB (``PHOTO_SAVE_FILE_INVALID``) or outside
the photo dimensions (``PHOTO_INVALID_DIMENSIONS``: width + height over 10,000,
or a ratio over 20); a missing file is "there is no photo in the request".
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import secrets
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from PIL import Image, UnidentifiedImageError

from bot.testing.telegram.messages import MAX_CAPTION, Messages
from bot.testing.telegram.state import State
from bot.testing.telegram.updates import Updates
from bot.testing.telegram.wire import (
    HTML_PAGES,
    ApiError,
    DownloadFault,
    StoredFile,
    Upload,
    require,
    utf16_len,
)

DOWNLOAD_FAULTS = ("status", "html", "reset", "cut")
"""How :meth:`Files.fail_download` can make a download fail."""


class Files:
    """Files held, served, uploaded and pushed."""

    def __init__(self, state: State, queue: Updates, outbox: Messages) -> None:
        self.state = state
        self.queue = queue
        self.outbox = outbox
        self._file_numbers = itertools.count(1)
        self._download_faults: list[DownloadFault] = []


    # -- holding files -----------------------------------------------------------

    def add_file(self, data: bytes, *, name: str = "", mime_type: str = "",
                 folder: str = "documents") -> StoredFile:
        """Hold ``data`` as a file Telegram has (a ``file_id`` and a ``file_path``)."""
        number = next(self._file_numbers)
        extension = name.rpartition(".")[2] if "." in name else "bin"
        stored = StoredFile(f"FILE{number}-{secrets.token_hex(8)}", f"U{number}",
                            f"{folder}/file_{number}.{extension}", data, name, mime_type)
        self.state.files[stored.file_id] = stored
        return stored

    def photo_sizes(self, data: bytes, *, thumbnail: bool = True) -> list[dict[str, Any]]:
        """``PhotoSize`` objects for the image ``data`` (plus a 90 px thumbnail), smallest
        first, as in a message's ``photo``."""
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            small: bytes | None = None
            if thumbnail and max(width, height) > 90:
                copy = img.convert("RGB")
                copy.thumbnail((90, 90))
                out = io.BytesIO()
                copy.save(out, "JPEG")
                small = out.getvalue()
                small_size = copy.size
        sizes: list[dict[str, Any]] = []
        if small is not None:
            held = self.add_file(small, name="thumb.jpg", folder="photos")
            sizes.append(_photo_size(held, *small_size))
        held = self.add_file(data, name="photo.jpg", folder="photos")
        sizes.append(_photo_size(held, width, height))
        return sizes

    # -- pushing media messages ------------------------------------------------------

    def media_message(self, media: Mapping[str, Any], *, caption: str | None = None,
                      group: bool = False, **kwargs: Any) -> dict[str, Any]:
        """Push a message carrying ``media`` (``{"photo": [...]}``, ``{"document": {...}}``)
        and an optional caption, privately or in a group; returns the update."""
        extra = {**kwargs, **media}
        if caption is not None:
            extra["caption"] = caption
        if group:
            return self.queue.group_message(None, **extra)
        return self.queue.private_message(None, **extra)

    def photo(self, data: bytes, caption: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Push a photo (the image ``data``, with a thumbnail size) with an optional caption."""
        return self.media_message({"photo": self.photo_sizes(data)}, caption=caption, **kwargs)

    def document(self, data: bytes, file_name: str | None = "file.bin",
                 mime_type: str | None = "application/octet-stream",
                 caption: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Push a document; ``file_name``/``mime_type`` ``None`` leave them out."""
        held = self.add_file(data, name=file_name or "", mime_type=mime_type or "")
        document: dict[str, Any] = {"file_id": held.file_id,
                                    "file_unique_id": held.file_unique_id,
                                    "file_size": len(data)}
        if file_name is not None:
            document["file_name"] = file_name
        if mime_type is not None:
            document["mime_type"] = mime_type
        return self.media_message({"document": document}, caption=caption, **kwargs)

    def voice(self, data: bytes, duration: int = 3, mime_type: str = "audio/ogg",
              **kwargs: Any) -> dict[str, Any]:
        """Push a voice note of ``duration`` seconds."""
        held = self.add_file(data, name="voice.oga", mime_type=mime_type, folder="voice")
        return self.media_message({"voice": {
            "file_id": held.file_id, "file_unique_id": held.file_unique_id,
            "duration": duration, "mime_type": mime_type, "file_size": len(data)}}, **kwargs)

    # -- download faults ---------------------------------------------------------------

    def fail_download(self, kind: str = "status", status: int = 502, *, times: int = 1) -> None:
        """Make the next ``times`` file downloads fail.

        ``kind``: ``"status"`` answers ``status`` with the JSON error envelope,
        ``"html"`` with nginx's HTML page for it, ``"reset"`` closes the
        connection without answering, ``"cut"`` announces the whole length and
        closes the connection half way through the body.
        """
        if kind not in DOWNLOAD_FAULTS:
            raise ValueError(f"unknown download fault {kind!r}; one of {DOWNLOAD_FAULTS}")
        self._download_faults.append(DownloadFault(kind, status, times))

    def _download_fault(self) -> DownloadFault | None:
        if not self._download_faults:
            return None
        fault = self._download_faults[0]
        fault.times -= 1
        if fault.times <= 0:
            self._download_faults.pop(0)
        return fault

    # -- serving ---------------------------------------------------------------------

    def get_file(self, p: dict[str, Any]) -> dict[str, Any]:
        require(p, "file_id")
        stored = self.state.files.get(str(p["file_id"]))
        if stored is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        if len(stored.data) > self.state.download_limit:
            raise ApiError(400, "Bad Request: file is too big")
        return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                "file_size": len(stored.data), "file_path": stored.file_path}

    async def serve_file(self, request: web.Request) -> web.StreamResponse:
        """``GET /file/bot<token>/<file_path>``: the bytes, as Telegram's file server."""
        if request.match_info["token"] != self.state.token:
            return _json_error(401, "Unauthorized")
        path = request.match_info["path"]
        self.state.downloads.append(path)
        await self._notify_calls()
        fault = self._download_fault()
        if fault is not None and fault.kind == "reset":
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError
        if fault is not None and fault.kind == "status":
            return _json_error(fault.status, "Internal Server Error" if fault.status >= 500
                               else "Bad Request")
        if fault is not None and fault.kind == "html":
            return web.Response(status=fault.status, content_type="text/html",
                                text=HTML_PAGES.get(fault.status, HTML_PAGES[502]))
        stored = next((f for f in self.state.files.values() if f.file_path == path), None)
        if stored is None:
            return _json_error(404, "Not Found")
        if fault is not None and fault.kind == "cut":
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = len(stored.data)
            await response.prepare(request)
            await response.write(stored.data[:len(stored.data) // 2])
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def _notify_calls(self) -> None:
        async with self.state.call_cond:
            self.state.call_cond.notify_all()

    # -- uploads -------------------------------------------------------------------------

    def send_media(self, method: str, p: dict[str, Any]) -> dict[str, Any]:
        """``sendPhoto`` / ``sendDocument`` with the file as a multipart part (or a held
        ``file_id``), checked as the Bot API checks it."""
        require(p, "chat_id")
        field = "photo" if method == "sendphoto" else "document"
        name, content_type, data = self._uploaded(p, field)
        if len(data) > self.state.upload_limit:
            raise ApiError(413, "Request Entity Too Large")
        caption = self._caption(p)
        if field == "photo":
            width, height = self._check_photo(data)
        held = self.add_file(data, name=name, mime_type=content_type,
                             folder="photos" if field == "photo" else "documents")
        content: dict[str, Any]
        if field == "photo":
            content = {"photo": [_photo_size(held, width, height)]}
        else:
            content = {"document": {"file_id": held.file_id,
                                    "file_unique_id": held.file_unique_id,
                                    "file_name": name, "mime_type": content_type,
                                    "file_size": len(data)}}
        if caption is not None:
            content["caption"] = caption
        message = self.outbox.post(p, content, source=p.get("caption"))
        self.state.uploads.append(Upload(field, p["chat_id"], name, content_type, data, caption,
                                   message["message_id"]))
        return message

    def _uploaded(self, p: dict[str, Any], field: str) -> tuple[str, str, bytes]:
        value = p.get(field)
        if isinstance(value, str) and value.startswith("attach://"):
            value = p.get(value.removeprefix("attach://"))
        if isinstance(value, web.FileField):
            value.file.seek(0)
            return value.filename, value.content_type, value.file.read()
        if isinstance(value, str) and value:
            stored = self.state.files.get(value)
            if stored is None:
                raise ApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")
            return stored.name, stored.mime_type, stored.data
        raise ApiError(400, f"Bad Request: there is no {field} in the request")

    def _caption(self, p: dict[str, Any]) -> str | None:
        if p.get("caption") in (None, ""):
            return None
        caption = Messages.visible_text(p.get("caption"), p.get("parse_mode"))
        if utf16_len(caption) > MAX_CAPTION:
            raise ApiError(400, "Bad Request: message caption is too long")
        return caption

    def _check_photo(self, data: bytes) -> tuple[int, int]:
        if len(data) > self.state.photo_limit:
            raise ApiError(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
        try:
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
            raise ApiError(400, "Bad Request: IMAGE_PROCESS_FAILED") from None
        small, large = sorted((width, height))
        if width + height > 10_000 or large > 20 * small:
            raise ApiError(400, "Bad Request: PHOTO_INVALID_DIMENSIONS")
        return width, height


def _photo_size(held: StoredFile, width: int, height: int) -> dict[str, Any]:
    return {"file_id": held.file_id, "file_unique_id": held.file_unique_id,
            "width": width, "height": height, "file_size": len(held.data)}


def _json_error(status: int, description: str) -> web.Response:
    return web.Response(status=status, content_type="application/json", text=json.dumps(
        {"ok": False, "error_code": status, "description": description}))
