"""Files: ``url_private`` with its token and scope checks, and the upload flow."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

from aiohttp import web

from bot.testing.slack.faults import Faults
from bot.testing.slack.state import State
from bot.testing.slack.wire import (
    ALICE,
    BAD_GATEWAY_PAGE,
    SharedFile,
    SlackFile,
    guess_type,
    reset_connection,
)


class Files:
    """Files users share and files the app uploads (kept in ``state``), and their URLs."""

    def __init__(self, state: State, faults: Faults) -> None:
        self._state = state
        self._faults = faults

    def file(self, data: bytes, name: str, mimetype: str = "application/octet-stream", *,
             width: int | None = None, height: int | None = None,
             audio_ms: int | None = None, size: int | None = None,
             user: str = ALICE) -> dict[str, Any]:
        """Store ``data``; the file object a message event carries in ``files``.

        ``width``/``height`` are an image's ``original_w``/``original_h``;
        ``audio_ms`` makes it a clip recorded in Slack (``subtype: slack_audio``);
        ``size`` overrides the declared size (a payload that lies).
        """
        file_id = f"F0{next(self._state.ids):08d}"
        self._state.files[file_id] = SlackFile(file_id, name, mimetype, data)
        return self._file_object(self._state.files[file_id], user=user, size=size, width=width,
                                 height=height, audio_ms=audio_ms)

    def _file_object(self, file: SlackFile, *, user: str, size: int | None = None,
                     width: int | None = None, height: int | None = None,
                     audio_ms: int | None = None) -> dict[str, Any]:
        base = f"{self._state.url}/files-pri/{self._state.team_id}-{file.id}"
        quoted = urllib.parse.quote(file.name)
        now = int(time.time())
        found: dict[str, Any] = {
            "id": file.id, "created": now, "timestamp": now, "name": file.name,
            "title": file.title or file.name, "mimetype": file.mimetype,
            "filetype": file.name.rsplit(".", 1)[-1] if "." in file.name else "binary",
            "pretty_type": file.mimetype, "user": user, "user_team": self._state.team_id,
            "editable": False, "size": len(file.data or b"") if size is None else size,
            "mode": "hosted", "is_external": False, "external_type": "", "is_public": False,
            "public_url_shared": False, "display_as_bot": False, "username": "",
            "url_private": f"{base}/{quoted}", "url_private_download":
            f"{base}/download/{quoted}",
            "permalink": f"https://fake.slack.com/files/{user}/{file.id}/{quoted}",
            "is_starred": False, "has_rich_preview": False, "file_access": "visible"}
        if width is not None and height is not None:
            found["original_w"], found["original_h"] = width, height
        if audio_ms is not None:
            found.update(subtype="slack_audio", duration_ms=audio_ms,
                         media_display_type="audio")
        return found

    async def serve_private(self, request: web.Request) -> web.StreamResponse:
        """``url_private``: the bytes for the bot token with ``files:read``; else Slack's no."""
        headers = dict(request.headers)
        failure = self._faults.take_failure("url_private")
        if failure is not None:
            self._state.file_requests.append((request.path, headers, failure.status))
            if failure.kind in ("reset_before", "reset_after", "disconnect"):
                reset_connection(request)
                return web.Response(status=500)  # never written: the connection is gone
            return web.Response(status=failure.status or 500, text=BAD_GATEWAY_PAGE,
                                content_type="text/html")
        parts = request.path.split("/")  # ["", "files-pri", "T-F", ("download",) name]
        file_id = parts[2].rsplit("-", 1)[-1] if len(parts) > 3 else ""
        file = self._state.files.get(file_id)
        authorized = (request.headers.get("Authorization") == f"Bearer {self._state.bot_token}"
                      and "files:read" in self._state.scopes)
        if not authorized:
            status = 403 if self._state.denial == "403" else 302
            self._state.file_requests.append((request.path, headers, status))
            if status == 403:
                return web.Response(status=403, text="Forbidden")
            redirect = urllib.parse.quote(request.path, safe="")
            return web.Response(status=302,
                                headers={"Location": f"{self._state.url}/?redir={redirect}"})
        status = 200 if file is not None and file.data is not None else 404
        self._state.file_requests.append((request.path, headers, status))
        if file is None or file.data is None:
            return web.Response(status=404, text="file_not_found")
        return web.Response(body=file.data, content_type=file.mimetype)

    async def login_page(self, request: web.Request) -> web.Response:
        """Slack's sign-in page, where ``url_private`` redirects a request it refuses."""
        return web.Response(text="<!DOCTYPE html><html><head><title>Slack</title></head><body>"
                                 "<h1>Sign in to Fake Team</h1></body></html>",
                            content_type="text/html")

    def info(self, params: dict[str, Any]) -> dict[str, Any]:
        """``files.info``: a file the bot may read (needs ``files:read``)."""
        if "files:read" not in self._state.scopes:
            return {"ok": False, "error": "missing_scope", "needed": "files:read",
                    "provided": ",".join(sorted(self._state.scopes))}
        file = self._state.files.get(str(params.get("file") or ""))
        if file is None or file.data is None:
            return {"ok": False, "error": "file_not_found"}
        return {"ok": True, "file": self._file_object(file, user=ALICE), "comments": [],
                "response_metadata": {"next_cursor": ""}}

    def get_upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        """``files.getUploadURLExternal``: an upload URL for a new file (needs ``files:write``)."""
        if "files:write" not in self._state.scopes:
            return {"ok": False, "error": "missing_scope", "needed": "files:write",
                    "provided": ",".join(sorted(self._state.scopes))}
        filename, length = str(params.get("filename") or ""), str(params.get("length") or "")
        if not filename or not length.isdigit() or int(length) <= 0:
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F0{next(self._state.ids):08d}"
        self._state.files[file_id] = SlackFile(file_id, filename, guess_type(filename), None,
                                               length=int(length))
        return {"ok": True, "upload_url": f"{self._state.url}/upload/v1/{file_id}",
                "file_id": file_id}

    async def receive_upload(self, request: web.Request) -> web.Response:
        """A POST of a file's bytes to its upload URL (raw or multipart, as Slack takes both)."""
        file = self._state.files.get(request.match_info["key"])
        if file is None or file.data is not None:
            return web.Response(status=404, text="upload_url_expired")
        data = await request.read()
        if request.content_type == "multipart/form-data":  # Slack takes both forms
            form = await request.post()
            field = next(iter(form.values()), None)
            data = field.file.read() if isinstance(field, web.FileField) else b""
        if len(data) != file.length:
            return web.Response(status=400, text="length_mismatch")
        file.data = data
        return web.Response(text=f"OK - {len(data)}")

    def complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        """``files.completeUploadExternal``: finish uploads, sharing them into a conversation."""
        try:
            items = json.loads(str(params.get("files") or ""))
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        if not isinstance(items, list) or not items:
            return {"ok": False, "error": "invalid_arguments"}
        channel = str(params.get("channel_id") or "") or None
        thread_ts = str(params.get("thread_ts") or "") or None
        if thread_ts and not channel:
            return {"ok": False, "error": "invalid_arguments"}
        done = []
        for item in items:
            file = self._state.files.get(str(item.get("id") if isinstance(item, dict) else ""))
            if file is None or file.data is None:
                return {"ok": False, "error": "file_not_found"}
            file.title = str(item.get("title") or file.name)
            done.append(file)
        for file in done:
            if channel is not None:
                self._state.shared.append(SharedFile(channel, thread_ts, file.name, file.title,
                                                     file.data or b"",
                                                     str(params.get("initial_comment") or "")))
        return {"ok": True, "files": [self._file_object(f, user=self._state.bot_user_id)
                                      for f in done]}
