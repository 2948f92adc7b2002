"""Built-in plugin: speech to text for voice notes, through the ``roost_transcriber`` hook.

Two transcribers, the first configured one wins:

- :class:`OpenAITranscriber`: any OpenAI-compatible ``POST /v1/audio/transcriptions``
  endpoint (OpenAI itself, faster-whisper-server / speaches, whisper.cpp's server,
  vLLM, LocalAI), through the ``openai`` SDK. Set ``base_url`` in the plugin's
  table (e.g. ``http://127.0.0.1:8000/v1``), and ``model`` / ``api_key``
  (``ROOST_TRANSCRIBE_API_KEY``) as the server wants.
- :class:`LocalWhisperTranscriber`: faster-whisper in this process, from the
  optional extra (``pip install 'roost[voice]'``), when the plugin's table names
  a model::

      [plugins."plugins.transcribe"]
      local_model = "small"        # a faster-whisper size or a CTranslate2 model directory
      device = "cpu"
      compute_type = "int8"

  A model size is downloaded by faster-whisper on first use; a directory works offline.

Failures raise :class:`~roost.MediaError` with one line for the user; the run goes on.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import logging
import mimetypes
import os
import threading
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from roost import MediaError, Settings, Transcriber, hookimpl

if TYPE_CHECKING:
    import openai

__all__ = [
    "LocalWhisperTranscriber",
    "OpenAITranscriber",
    "TranscribeConfig",
    "roost_plugin_config_model",
    "roost_transcriber",
]

log = logging.getLogger("roost.plugins.transcribe")

PLUGIN_NAME = "plugins.transcribe"

_EXTENSIONS = {
    # What Whisper servers recognise, by the MIME type Roost sniffed; they pick the
    # decoder by the upload's file name.
    "audio/ogg": ".ogg", "audio/opus": ".ogg", "audio/mpeg": ".mp3", "audio/mp3": ".mp3",
    "audio/mp4": ".m4a", "audio/x-m4a": ".m4a", "audio/m4a": ".m4a", "video/mp4": ".mp4",
    "audio/wav": ".wav", "audio/x-wav": ".wav", "audio/wave": ".wav", "audio/webm": ".webm",
    "video/webm": ".webm", "audio/flac": ".flac", "audio/x-flac": ".flac",
}
_KNOWN = frozenset(_EXTENSIONS.values()) | {".mpeg", ".mpga", ".oga"}


class TranscribeConfig(BaseModel):
    """``[plugins."plugins.transcribe"]``: voice notes to text, by HTTP or local faster-whisper."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    """An OpenAI-compatible ``/v1/audio/transcriptions`` server for voice notes."""
    model: str = "whisper-1"
    """The model name sent to the transcription server."""
    api_key: SecretStr | None = None
    """``ROOST_TRANSCRIBE_API_KEY``: the transcription server's API key."""

    local_model: str = ""
    """A faster-whisper model size (``tiny``, ``small``, ``large-v3``...) or the path of
    a CTranslate2 Whisper model directory; empty: no local transcription."""
    device: str = "cpu"
    compute_type: str = "int8"
    language: str | None = None
    """Spoken language (``en``, ``de``...); ``None`` lets Whisper detect it."""
    beam_size: int = 1


def upload_name(name: str, mime_type: str) -> str:
    """``name`` with an extension a Whisper server decodes by (from ``mime_type`` if needed)."""
    base = os.path.basename(name) or "voice"
    if os.path.splitext(base)[1].lower() in _KNOWN:
        return base
    mime = mime_type.split(";", 1)[0].strip().lower()
    extension = _EXTENSIONS.get(mime) or mimetypes.guess_extension(mime) or ".ogg"
    return os.path.splitext(base)[0] + extension


class OpenAITranscriber:
    """Transcribes through an OpenAI-compatible ``/v1/audio/transcriptions`` endpoint."""

    name = "openai-compatible"

    def __init__(self, settings: Settings, *, timeout: float = 120.0,
                 max_retries: int = 2) -> None:
        config = TranscribeConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
        if not config.base_url:
            raise ValueError(f'[plugins."{PLUGIN_NAME}"] base_url is not set')
        # The SDK takes a second to import: not on the start path of every `roost run`.
        import openai

        from plugins.openai_http import http_client
        key = config.api_key
        self.base_url = config.base_url.rstrip("/")
        self.model = config.model
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            # Local servers need no key, but the SDK refuses to start without one.
            api_key=(key.get_secret_value() if key is not None else "") or "not-needed",
            timeout=timeout,
            # An upload is idempotent: the SDK may retry connection errors and 5xx.
            max_retries=max_retries,
            http_client=http_client(),
        )

    async def transcribe(self, data: bytes, mime_type: str, name: str) -> str:
        """The text spoken in ``data``; raises :class:`MediaError` with a one-line reason."""
        import openai

        upload = (upload_name(name, mime_type), data, mime_type or "application/octet-stream")
        try:
            result = await self._client.audio.transcriptions.create(
                model=self.model, file=upload, response_format="json")
        except openai.APIStatusError as exc:
            raise MediaError(
                f"the transcription server refused the audio ({exc.status_code}: "
                f"{_detail(exc)})") from exc
        except openai.APITimeoutError as exc:
            raise MediaError("the transcription server did not answer in time") from exc
        except openai.APIConnectionError as exc:
            raise MediaError(f"could not reach the transcription server at {self.base_url}"
                             ) from exc
        except openai.APIError as exc:
            raise MediaError(f"the transcription failed: {_detail(exc)}") from exc
        text = getattr(result, "text", result)
        return str(text).strip()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.close()


def _detail(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message[:200]
    return exc.message[:200]


class LocalWhisperTranscriber:
    """Transcribes with faster-whisper in this process (the ``voice`` extra).

    The model is loaded on the first voice note, in a worker thread, and kept;
    transcriptions run one at a time (the model is not shared across threads).
    """

    name = "faster-whisper"

    def __init__(self, config: TranscribeConfig) -> None:
        # Raises ImportError without the extra; the hook turns that into a log hint.
        # (Imported by name: it has no type stubs, and stays optional for mypy too.)
        self._module: Any = importlib.import_module("faster_whisper")
        self.config = config
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        if self._model is None:
            c = self.config
            looks_like_path = os.sep in c.local_model or c.local_model.startswith(".")
            if looks_like_path and not os.path.isdir(c.local_model):
                # faster-whisper would take it for a hub repository name and fail obscurely.
                log.warning("local_model %r is not a directory", c.local_model)
                raise MediaError("the local speech model is missing (its directory does not "
                                 "exist)")
            try:
                self._model = self._module.WhisperModel(
                    c.local_model, device=c.device, compute_type=c.compute_type)
            # faster-whisper and CTranslate2 raise plain RuntimeError/ValueError/OSError
            # (and hub errors) for a model they cannot load.
            except Exception as exc:
                log.warning("faster-whisper could not load %r: %s", c.local_model, exc)
                raise MediaError(f"the local speech model could not be loaded "
                                 f"({type(exc).__name__})") from exc
        return self._model

    def _run(self, data: bytes) -> str:
        with self._lock:
            model = self._load()
            try:
                segments, _info = model.transcribe(
                    io.BytesIO(data), language=self.config.language,
                    beam_size=self.config.beam_size)
                return " ".join(s.text.strip() for s in segments if s.text.strip())
            # Decoding (PyAV) and inference fail with many exception types.
            except Exception as exc:
                raise MediaError(f"the audio could not be transcribed ({type(exc).__name__})"
                                 ) from exc

    async def transcribe(self, data: bytes, mime_type: str, name: str) -> str:
        """The text spoken in ``data`` (decoded by PyAV, whatever the container)."""
        return await asyncio.to_thread(self._run, data)


def _config(settings: Settings) -> TranscribeConfig | None:
    raw = settings.plugins.get(PLUGIN_NAME) or {}
    try:
        return TranscribeConfig.model_validate(raw)
    except ValidationError:
        return None  # the plugin host reports the bad keys and disables the plugin


@hookimpl
def roost_plugin_config_model() -> type[BaseModel]:
    """The ``[plugins."plugins.transcribe"]`` table."""
    return TranscribeConfig


# The hook is asked for every voice note: the transcriber (its HTTP connections, a
# loaded speech model) is kept for as long as the configuration and loop stay the same.
_kept: tuple[tuple[object, ...], Transcriber | None] | None = None


@hookimpl
def roost_transcriber(settings: Settings) -> Transcriber | None:
    """The configured transcriber: the HTTP endpoint first, else local faster-whisper."""
    global _kept
    config = _config(settings)
    key = config.api_key if config is not None else None
    try:
        loop: object = id(asyncio.get_running_loop())
    except RuntimeError:
        loop = None
    wanted = (key.get_secret_value() if key is not None else None, config, loop)
    if _kept is not None and _kept[0] == wanted:
        return _kept[1]
    made = _make(settings, config)
    _kept = (wanted, made)
    return made


def _make(settings: Settings, config: TranscribeConfig | None) -> Transcriber | None:
    if config is None:
        return None
    if config.base_url:
        return OpenAITranscriber(settings)
    if not config.local_model:
        return None
    try:
        return LocalWhisperTranscriber(config)
    except ImportError:
        log.warning("local_model is set for %s but faster-whisper is not installed: "
                    "pip install 'roost[voice]'", PLUGIN_NAME)
        return None
