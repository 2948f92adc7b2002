"""The fake CDN: attachment URLs signed and expiring like Discord's."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from aiohttp import web

from bot.testing.discord.state import State
from bot.testing.discord.wire import CDN_GONE, CHANNEL_ID, cdn_signature, reset_connection


class Cdn:
    """Files on the CDN (kept in ``state``), served by signed URL."""

    def __init__(self, state: State) -> None:
        self._state = state

    def attachment(self, data: bytes, filename: str, content_type: str | None = None, *,
                   channel_id: int = CHANNEL_ID, width: int | None = None,
                   height: int | None = None, voice_seconds: float | None = None,
                   size: int | None = None, chunked: bool = False) -> dict[str, Any]:
        """Put ``data`` on the CDN; the attachment object a message carries.

        ``size`` overrides the declared size (a payload that lies); ``chunked``
        serves the bytes without a Content-Length. ``voice_seconds`` makes it
        a voice message's attachment (``duration_secs`` and ``waveform``).
        """
        attachment_id = next(self._state.ids)
        path = f"/attachments/{channel_id}/{attachment_id}/{filename}"
        self._state.cdn_files[path] = (data, content_type or "application/octet-stream", chunked)
        expires = f"{int(time.time()) + 86_400:x}"
        url = (f"http://127.0.0.1:{self._state.require_port()}{path}?ex={expires}"
               f"&is={int(time.time()):x}&hm={cdn_signature(path, expires)}&")
        found: dict[str, Any] = {"id": str(attachment_id), "filename": filename,
                                 "size": len(data) if size is None else size, "url": url,
                                 "proxy_url": url.replace("/attachments/",
                                                          "/media/attachments/", 1)}
        if content_type is not None:
            found["content_type"] = content_type
        if width is not None and height is not None:
            found["width"], found["height"] = width, height
        if voice_seconds is not None:
            found["duration_secs"] = voice_seconds
            found["waveform"] = "AAAAAAAAAAAA"
        return found

    def expire(self, url: str) -> None:
        """Forget the file behind a CDN ``url``: it answers 404 from now on."""
        self._state.cdn_files.pop(urllib.parse.urlsplit(url).path, None)

    def fail_cdn(self, fault: int | str, count: int = 1) -> None:
        """Fail the next ``count`` CDN requests: an HTTP status, or ``"reset"``."""
        self._state.cdn_failures.extend([fault] * count)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Serve a CDN ``GET``: the file, or the CDN's 404 for a bad or expired URL."""
        found = self._state.cdn_files.get(request.path)
        expires = request.query.get("ex", "")
        status = 200
        if self._state.cdn_failures:
            fault = self._state.cdn_failures.pop(0)
            if fault == "reset":
                self._state.cdn_requests.append((request.path_qs, dict(request.headers), 0))
                reset_connection(request)
                return web.Response(status=500)  # never written: the connection is gone
            status = int(fault)
        elif (found is None or request.query.get("hm") != cdn_signature(request.path, expires)
              or int(expires or "0", 16) < time.time()):
            status = 404
        self._state.cdn_requests.append((request.path_qs, dict(request.headers), status))
        if status != 200 or found is None:
            return web.Response(status=status, text=CDN_GONE if status == 404
                                else f"{status} Error", content_type="text/plain")
        data, content_type, chunked = found
        if not chunked:
            return web.Response(body=data, content_type=content_type)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(data), 16_384):
            await response.write(data[start:start + 16_384])
        await response.write_eof()
        return response
