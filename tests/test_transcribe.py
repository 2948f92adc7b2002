"""Voice notes to text: the built-in transcribers, the fake Whisper server, and a whole run."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest

from bot.contracts.media import MediaError, Transcriber
from bot.testing.media import FileChat
from bot.testing.transcribe import MAX_FILE, FakeTranscriber
from plugins import transcribe
from plugins.transcribe import OpenAITranscriber, TranscribeConfig, upload_name
from roost import Settings
from tests.media_samples import ogg_opus

AppFactory = Callable[..., Any]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTranscriber]:
    async with FakeTranscriber(api_key="sk-voice") as server:
        yield server


def settings_for(fake: FakeTranscriber, **extra: Any) -> Settings:
    return Settings(plugins={"plugins.transcribe": {
        "base_url": fake.base_url, "api_key": "sk-voice", "model": "whisper-large-v3"}}, **extra)


async def test_a_voice_note_is_uploaded_as_multipart_and_its_text_comes_back(
    fake: FakeTranscriber,
) -> None:
    fake.transcript("  buy milk and eggs ")
    voice = ogg_opus(3)
    transcriber = OpenAITranscriber(settings_for(fake))

    text = await transcriber.transcribe(voice, "audio/ogg", "voice-7.ogg")
    await transcriber.aclose()

    assert text == "buy milk and eggs"
    [upload] = fake.uploads
    assert (upload.filename, upload.content_type, upload.data) == ("voice-7.ogg", "audio/ogg",
                                                                    voice)
    assert upload.model == "whisper-large-v3"
    assert upload.fields["response_format"] == "json"
    assert upload.api_key == "sk-voice"


@pytest.mark.parametrize(("name", "mime", "expected"), [
    ("voice-7.ogg", "audio/ogg", "voice-7.ogg"),
    ("voice-7", "audio/ogg", "voice-7.ogg"),
    ("memo.bin", "audio/mp4", "memo.m4a"),
    ("dir/../note", "audio/mpeg", "note.mp3"),
    ("", "audio/wav", "voice.wav"),
])
def test_the_upload_name_carries_an_extension_the_server_decodes_by(
    name: str, mime: str, expected: str
) -> None:
    assert upload_name(name, mime) == expected


async def test_a_refusal_becomes_a_one_line_media_error(fake: FakeTranscriber) -> None:
    fake.fail(400, "Audio file is too short. Minimum audio length is 0.1 seconds.")
    transcriber = OpenAITranscriber(settings_for(fake))

    with pytest.raises(MediaError) as caught:
        await transcriber.transcribe(b"OggS", "audio/ogg", "v.ogg")
    await transcriber.aclose()

    assert str(caught.value) == ("the transcription server refused the audio (400: Audio "
                                 "file is too short. Minimum audio length is 0.1 seconds.)")


async def test_a_wrong_key_is_reported_without_the_key(fake: FakeTranscriber) -> None:
    transcriber = OpenAITranscriber(Settings(plugins={"plugins.transcribe": {
        "base_url": fake.base_url, "api_key": "sk-wrong-secret"}}))

    with pytest.raises(MediaError) as caught:
        await transcriber.transcribe(b"OggS", "audio/ogg", "v.ogg")
    await transcriber.aclose()

    assert "401" in str(caught.value)
    assert "sk-wrong-secret" not in str(caught.value)


async def test_an_unreachable_server_is_named_in_the_error() -> None:
    async with FakeTranscriber() as gone:
        url = gone.base_url
    transcriber = OpenAITranscriber(
        Settings(plugins={"plugins.transcribe": {"base_url": url}}), max_retries=0)

    with pytest.raises(MediaError) as caught:
        await transcriber.transcribe(b"OggS", "audio/ogg", "v.ogg")
    await transcriber.aclose()

    assert str(caught.value) == f"could not reach the transcription server at {url}"


@pytest.mark.parametrize(("upload", "model", "status", "message"), [
    (("v.txt", b"OggS", "text/plain"), "whisper-1", 400, "Invalid file format. Supported"),
    (("v.ogg", b"\0" * (MAX_FILE + 1), "audio/ogg"), "whisper-1", 413,
     "Maximum content size limit (26214400) exceeded"),
    (("v.ogg", b"OggS", "audio/ogg"), "", 400, "you must provide a model parameter"),
])
async def test_the_fake_refuses_what_openai_refuses_with_its_error_shape(
    fake: FakeTranscriber, upload: tuple[str, bytes, str], model: str, status: int,
    message: str,
) -> None:
    client = openai.AsyncOpenAI(api_key="sk-voice", base_url=fake.base_url, max_retries=0)

    with pytest.raises(openai.APIStatusError) as caught:
        await client.audio.transcriptions.create(model=model, file=upload)
    await client.close()

    assert caught.value.status_code == status
    body = caught.value.body
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}
    assert body["message"].startswith(message)


@pytest.mark.parametrize(("response_format", "expected"), [
    ("text", "hello there\n"), ("verbose_json", "hello there")])
async def test_the_fake_answers_each_response_format(
    fake: FakeTranscriber, response_format: Any, expected: str
) -> None:
    fake.transcript("hello there")
    client = openai.AsyncOpenAI(api_key="sk-voice", base_url=fake.base_url, max_retries=0)

    result = await client.audio.transcriptions.create(
        model="whisper-1", file=("v.ogg", b"OggS", "audio/ogg"), response_format=response_format)
    await client.close()

    assert getattr(result, "text", result) == expected


# -- the hook ------------------------------------------------------------------------


async def test_the_hook_offers_the_endpoint_when_its_url_is_set_and_keeps_it(
    fake: FakeTranscriber,
) -> None:
    settings = settings_for(fake)

    first = transcribe.roost_transcriber(settings)
    again = transcribe.roost_transcriber(settings)

    assert isinstance(first, OpenAITranscriber) and isinstance(first, Transcriber)
    assert again is first  # one HTTP client, not one per voice note
    assert transcribe.roost_transcriber(Settings()) is None


async def test_local_whisper_without_the_voice_extra_offers_nothing_and_says_how(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # import fails as if absent
    settings = Settings(plugins={"plugins.transcribe": {"local_model": "small"}})

    with caplog.at_level(logging.WARNING, "roost.plugins.transcribe"):
        offered = transcribe.roost_transcriber(settings)

    assert offered is None
    assert "pip install 'roost[voice]'" in caplog.text


async def test_a_local_model_directory_that_is_missing_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    loaded: list[str] = []

    class Stand:  # stands in for the faster_whisper module, which is an optional extra
        def WhisperModel(self, *args: Any, **kwargs: Any) -> None:
            loaded.append(args[0])

    monkeypatch.setitem(sys.modules, "faster_whisper", Stand())
    transcriber = transcribe.LocalWhisperTranscriber(
        TranscribeConfig(local_model=str(tmp_path / "no-model")))

    with pytest.raises(MediaError, match="directory does not exist"):
        await transcriber.transcribe(b"OggS", "audio/ogg", "v.ogg")
    assert loaded == []


def test_the_plugin_table_is_validated() -> None:
    assert transcribe.roost_plugin_config_model() is TranscribeConfig
    assert TranscribeConfig.model_validate({"local_model": "tiny"}).compute_type == "int8"
    with pytest.raises(ValueError, match="local_modle"):
        TranscribeConfig.model_validate({"local_modle": "tiny"})


# -- a whole run -----------------------------------------------------------------------


async def test_a_voice_note_reaches_the_model_as_its_transcript(
    roost_app: AppFactory, fake: FakeTranscriber
) -> None:
    fake.transcript("remind me to call the dentist")
    chat = await FileChat.join(await roost_app(
        [{"reply": "Noted."}],
        plugins={"plugins.transcribe": {"base_url": fake.base_url, "api_key": "sk-voice"}}))
    voice = chat.add_file("voice-1.ogg", ogg_opus(12), "voice", mime_type="audio/ogg",
                          duration=12.0)

    await chat.say_with("", voice)
    await chat.settle()

    assert chat.replies[-1] == "Noted."
    [upload] = fake.uploads
    assert upload.filename == "voice-1.ogg"
    user = chat.requests[-1].messages[-1]
    assert "[voice 0:12] remind me to call the dentist" in user.content
    assert user.parts == ()  # the model reads the transcript; the audio stays in inbox/


async def test_a_failed_transcription_tells_the_user_and_the_run_goes_on(
    roost_app: AppFactory, fake: FakeTranscriber
) -> None:
    fake.fail(400, "Audio file might be corrupted or unsupported")
    chat = await FileChat.join(await roost_app(
        [{"reply": "I could not hear that."}],
        plugins={"plugins.transcribe": {"base_url": fake.base_url, "api_key": "sk-voice"}}))
    voice = chat.add_file("voice-2.ogg", ogg_opus(2), "voice", mime_type="audio/ogg")

    await chat.say_with("listen", voice)
    await chat.settle()

    assert any("could not transcribe" in r and "corrupted" in r for r in chat.replies)
    assert chat.replies[-1] == "I could not hear that."
