"""A local fake of an OpenAI-compatible speech-to-text server (``POST /v1/audio/transcriptions``).

Drive the real ``openai`` SDK (or Roost's transcriber plugin) against it::

    async with FakeTranscriber() as fake:
        fake.transcript("buy milk and eggs")
        client = openai.AsyncOpenAI(api_key="k", base_url=fake.base_url)
        result = await client.audio.transcriptions.create(
            model="whisper-1", file=("voice.ogg", data, "audio/ogg"))
        assert result.text == "buy milk and eggs"
        assert fake.uploads[0].filename == "voice.ogg"

The request is ``multipart/form-data`` as OpenAI's: a ``file`` part and a
``model`` field, optionally ``language``, ``prompt``, ``response_format``
(``json``, ``text``, ``verbose_json``, ``srt``, ``vtt``) and ``temperature``. Like
OpenAI it checks the key (when one is set), that ``model`` and ``file`` are
there, the file's extension (the server decodes by it) and the 25 MB limit,
and answers errors with ``{"error": {"message", "type", "param", "code"}}``.
Scripted transcripts are served first in, first out; ``fail`` enqueues an HTTP
error; an empty script answers :attr:`FakeTranscriber.default_text`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from bot.testing._server import FakeServer, json_error

__all__ = ["FakeTranscriber", "TranscriptionError", "Upload"]

SUPPORTED = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
MAX_FILE = 25 * 1024 * 1024
"""OpenAI's limit for one audio file."""


@dataclass(frozen=True, slots=True)
class Upload:
    """One transcription request the fake received."""

    filename: str
    content_type: str
    data: bytes
    fields: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None

    @property
    def model(self) -> str:
        """The ``model`` field."""
        return self.fields.get("model", "")


@dataclass(frozen=True, slots=True)
class TranscriptionError:
    """A scripted HTTP error with OpenAI's error envelope."""

    status: int
    message: str
    error_type: str = "invalid_request_error"
    code: str | None = None


class FakeTranscriber(FakeServer[str | TranscriptionError]):
    """An aiohttp server on 127.0.0.1 answering ``POST /v1/audio/transcriptions`` from a script.

    ``api_key``: when set, a request with another ``Authorization: Bearer`` key gets
    a 401; when ``None`` any key, or none, passes (local Whisper servers ignore it).
    """

    route = "/v1/audio/transcriptions"
    url_suffix = "/v1"

    def __init__(self, *, api_key: str | None = None, model: str = "whisper-1") -> None:
        super().__init__(api_key=api_key, model=model)
        self.uploads: list[Upload] = []
        """Every well-formed request received, in order (including refused ones)."""
        self.default_text = "(no transcript scripted)"
        """The transcript served when the script is empty."""

    def transcript(self, text: str) -> None:
        """Enqueue the transcript of the next request."""
        self.enqueue(text)

    def fail(self, status: int, message: str = "scripted failure", *,
             error_type: str = "invalid_request_error", code: str | None = None) -> None:
        """Enqueue an HTTP error."""
        self.enqueue(TranscriptionError(status, message, error_type, code))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        api_key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if not request.content_type.startswith("multipart/"):
            self.request_received.set()
            return _error(400, "Invalid Content-Type header: expected multipart/form-data",
                          param=None)
        upload = await self._read(request, api_key)
        self.request_received.set()
        if self.api_key is not None and api_key != self.api_key:
            return _error(401, "Incorrect API key provided", code="invalid_api_key",
                          param=None)
        if upload is None:
            return _error(400, "you must provide a file parameter", param="file")
        self.uploads.append(upload)
        if not upload.model:
            return _error(400, "you must provide a model parameter", param="model")
        extension = os.path.splitext(upload.filename)[1].lstrip(".").lower()
        if extension not in SUPPORTED:
            return _error(400, f"Invalid file format. Supported formats: {list(SUPPORTED)}",
                          param="file", code="invalid_value")
        if len(upload.data) > MAX_FILE:
            return _error(413, f"Maximum content size limit ({MAX_FILE}) exceeded "
                               f"({len(upload.data)} bytes read)", param=None)
        item = self._next_item()
        if isinstance(item, TranscriptionError):
            return _error(item.status, item.message, error_type=item.error_type,
                          code=item.code, param=None)
        text = item if isinstance(item, str) else self.default_text
        return _answer(text, upload.fields.get("response_format", "json"), upload)

    async def _read(self, request: web.Request, api_key: str | None) -> Upload | None:
        reader = await request.multipart()
        fields: dict[str, str] = {}
        filename = content_type = ""
        data: bytes | None = None
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "file":
                filename = part.filename or ""
                content_type = part.headers.get("Content-Type", "")
                data = bytes(await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        if data is None:
            return None
        return Upload(filename, content_type, data, fields, api_key)


def _answer(text: str, response_format: str, upload: Upload) -> web.Response:
    if response_format == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    if response_format in ("srt", "vtt"):
        head = "WEBVTT\n\n" if response_format == "vtt" else "1\n"
        return web.Response(text=f"{head}00:00:00,000 --> 00:00:01,000\n{text}\n",
                            content_type="text/plain")
    payload: dict[str, Any] = {"text": text}
    if response_format == "verbose_json":
        payload.update(task="transcribe", language=upload.fields.get("language", "english"),
                       duration=1.0, segments=[])
    return web.Response(body=json.dumps(payload).encode(), content_type="application/json")


def _error(status: int, message: str, *, param: str | None,
           error_type: str = "invalid_request_error", code: str | None = None) -> web.Response:
    return json_error(status, {"error": {"message": message, "type": error_type,
                                         "param": param, "code": code}})
