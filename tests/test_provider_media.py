"""Images and PDFs in the history reach the model APIs as their blocks, through the real SDKs.

The fakes validate image and document blocks as the real APIs do, so a block
the provider builds wrong fails here with the API's own 400.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from PIL import Image
from PIL import _imaging as pillow_core

from bot.contracts.llm import ChatMessage, ContentPart, LLMRequest, ToolCall
from bot.media.reader import MAX_PDF_PAGES, ImageData, MediaReader, Note
from bot.testing.anthropic import FakeAnthropic
from bot.testing.app import create_app
from bot.testing.media import FileChat
from bot.testing.openai import FakeOpenAI
from plugins.anthropic_provider import AnthropicProvider
from plugins.openai_provider import OpenAIProvider
from tests.media_helpers import jpeg as gps_jpeg
from tests.media_samples import jpeg, pdf, png
from tests.provider_helpers import ANTHROPIC_KEY, OPENAI_KEY, anthropic_for, openai_for


@pytest.fixture
async def claude() -> AsyncIterator[tuple[FakeAnthropic, AnthropicProvider]]:
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        provider = anthropic_for(fake)
        yield fake, provider
        await provider.aclose()


@pytest.fixture
async def gpt() -> AsyncIterator[tuple[FakeOpenAI, OpenAIProvider]]:
    async with FakeOpenAI(api_key=OPENAI_KEY) as fake:
        provider = openai_for(fake)
        yield fake, provider
        await provider.aclose()


def stored(root: Path, name: str, data: bytes, kind: str = "image",
           mime: str = "image/jpeg") -> ContentPart:
    """``data`` stored as ``inbox/<name>`` in the workspace ``root``, as a part."""
    path = root / "inbox" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return ContentPart(kind, f"inbox/{name}", mime, size=len(data), root=str(root))  # type: ignore[arg-type]


def asking(*parts: ContentPart, text: str = "what is this?", vision: bool = True) -> LLMRequest:
    return LLMRequest(model="m", system="be brief",
                      messages=(ChatMessage("user", text, parts=parts),), vision=vision)


def blocks(fake: FakeAnthropic) -> list[dict[str, Any]]:
    """The first message's blocks, without their prompt-cache breakpoints."""
    content = fake.last_request.body["messages"][0]["content"]
    assert isinstance(content, list)
    return [unmarked(b) for b in content]


def unmarked(block: dict[str, Any]) -> dict[str, Any]:
    """``block`` without its ``cache_control`` breakpoint."""
    return {k: v for k, v in block.items() if k != "cache_control"}


def decoded(block: dict[str, Any]) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(block["source"]["data"])))


# -- Anthropic -------------------------------------------------------------------


async def test_a_photo_reaches_claude_as_an_image_block_before_the_text(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    fake, provider = claude
    fake.reply_text("a red square")
    part = stored(tmp_path, "photo-1.png", png(64, 48), mime="image/png")

    response = await provider.complete(asking(part))

    assert response.text == "a red square"
    image, text = blocks(fake)
    assert image["type"] == "image"
    assert image["source"]["type"] == "base64"
    assert image["source"]["media_type"] == "image/png"
    assert decoded(image).size == (64, 48)
    assert text == {"type": "text", "text": "what is this?"}


async def test_a_large_photo_is_resized_before_it_is_sent(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    fake, provider = claude
    fake.reply_text("a photo")
    part = stored(tmp_path, "big.jpg", jpeg(4000, 3000))

    await provider.complete(asking(part))

    image = blocks(fake)[0]
    assert image["source"]["media_type"] == "image/jpeg"
    assert decoded(image).size == (1568, 1176)
    assert len(image["source"]["data"]) <= 5 * 1024 * 1024
    # The stored file is left as it was received.
    assert Image.open(part.file).size == (4000, 3000)


async def test_a_photo_of_known_size_goes_at_the_pixels_each_api_looks_at(
    claude: tuple[FakeAnthropic, AnthropicProvider], gpt: tuple[FakeOpenAI, OpenAIProvider],
    tmp_path: Path,
) -> None:
    part = replace(stored(tmp_path, "big.jpg", jpeg(4000, 3000)), width=4000, height=3000)
    claude[0].reply_text("ok")
    gpt[0].reply_text("ok")

    await claude[1].complete(asking(part))
    await gpt[1].complete(asking(part))

    # Anthropic scales to ~1,600 tokens (width x height / 750); OpenAI to a 768 px short side.
    assert decoded(blocks(claude[0])[0]).size == (1264, 948)
    url = gpt[0].last_request.body["messages"][1]["content"][1]["image_url"]["url"]
    assert Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))).size == (1024, 768)


async def test_location_metadata_does_not_leave_the_machine(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    fake, provider = claude
    fake.reply_text("ok")
    exif = Image.Exif()
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0)}  # GPSInfo
    part = stored(tmp_path, "gps.jpg", jpeg(320, 240, exif=exif))
    assert Image.open(part.file).getexif().get_ifd(0x8825)

    await provider.complete(asking(part))

    sent = decoded(blocks(fake)[0])
    assert not sent.getexif().get_ifd(0x8825)


async def test_a_pdf_reaches_claude_as_a_document_block(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    fake, provider = claude
    fake.reply_text("a receipt")
    data = pdf("Receipt total 42.50 EUR")
    part = stored(tmp_path, "scan.pdf", data, "document", "application/pdf")

    await provider.complete(asking(part, text="summarize this"))

    document, text = blocks(fake)
    assert document == {"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf",
        "data": base64.b64encode(data).decode()}}
    assert text["text"] == "summarize this"


async def test_without_vision_claude_gets_a_note_and_the_pdf_text_never_a_block(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    fake, provider = claude
    fake.reply_text("ok")
    photo = stored(tmp_path, "photo-1.jpg", jpeg(100, 80))
    scan = stored(tmp_path, "scan.pdf", pdf("Receipt total 42.50 EUR"), "document",
                  "application/pdf")

    await provider.complete(asking(photo, scan, vision=False))

    sent = blocks(fake)
    assert [b["type"] for b in sent] == ["text", "text", "text"]
    assert sent[0]["text"] == "[image: inbox/photo-1.jpg — this model cannot see images]"
    assert sent[1]["text"].startswith("[document: inbox/scan.pdf, 1 page — its text follows")
    assert "Receipt total 42.50 EUR" in sent[1]["text"]


async def test_a_corrupted_or_missing_file_becomes_a_note_and_the_call_succeeds(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    fake, provider = claude
    fake.reply_text("I could not see it")
    broken = stored(tmp_path, "broken.jpg", jpeg(200, 100)[:300])
    gone = stored(tmp_path, "gone.png", png(10, 10), mime="image/png")
    gone.file.unlink()
    bad_pdf = stored(tmp_path, "bad.pdf", b"%PDF-1.4 not really", "document", "application/pdf")

    response = await provider.complete(asking(broken, gone, bad_pdf))

    assert response.text == "I could not see it"
    notes = [b["text"] for b in blocks(fake)[:3]]
    assert notes[0].startswith("[image: inbox/broken.jpg — ")
    assert notes[1] == "[image: inbox/gone.png — the file is no longer available]"
    assert notes[2].startswith("[document: inbox/bad.pdf — not a readable PDF")


async def test_images_in_earlier_turns_are_sent_again_and_tool_results_keep_order(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    from bot.contracts.llm import ToolCall

    fake, provider = claude
    fake.reply_text("done")
    part = stored(tmp_path, "p.png", png(20, 20), mime="image/png")
    history = (
        ChatMessage("user", "look", parts=(part,)),
        ChatMessage("assistant", "", tool_calls=(ToolCall("t1", "read_file", {}),)),
        ChatMessage("tool", "file text", tool_call_id="t1"),
        ChatMessage("user", "and now?"),
    )

    await provider.complete(LLMRequest("m", "", history))

    messages = fake.last_request.body["messages"]
    assert messages[0]["content"][0]["type"] == "image"
    assert messages[2]["content"][0]["type"] == "tool_result"
    assert unmarked(messages[2]["content"][1]) == {"type": "text", "text": "and now?"}


async def test_an_image_a_tool_returned_reaches_claude_inside_its_tool_result(
    claude: tuple[FakeAnthropic, AnthropicProvider], tmp_path: Path
) -> None:
    from bot.contracts.llm import ToolCall

    fake, provider = claude
    fake.reply_text("a chart")
    part = stored(tmp_path, "chart.png", png(30, 20), mime="image/png")
    history = (
        ChatMessage("user", "plot it"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("t1", "plot", {}),)),
        ChatMessage("tool", "saved as inbox/chart.png", tool_call_id="t1", parts=(part,)),
    )

    await provider.complete(LLMRequest("m", "", history))

    [result] = fake.last_request.body["messages"][2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t1"
    text, image = result["content"]
    assert text == {"type": "text", "text": "saved as inbox/chart.png"}
    assert image["type"] == "image" and decoded(image).size == (30, 20)


async def test_an_image_a_tool_returned_is_named_to_an_openai_server(
    gpt: tuple[FakeOpenAI, OpenAIProvider], tmp_path: Path
) -> None:
    from bot.contracts.llm import ToolCall

    fake, provider = gpt
    fake.reply_text("a chart")
    part = stored(tmp_path, "chart.png", png(30, 20), mime="image/png")
    history = (
        ChatMessage("user", "plot it"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("t1", "plot", {}),)),
        ChatMessage("tool", "done", tool_call_id="t1", parts=(part,)),
    )

    await provider.complete(LLMRequest("m", "", history))

    tool = fake.last_request.body["messages"][-1]
    assert tool["role"] == "tool" and "inbox/chart.png" in tool["content"]


async def test_a_pdf_over_the_page_limit_goes_as_text(tmp_path: Path) -> None:
    data = pdf(*[f"page text {n}" for n in range(MAX_PDF_PAGES + 1)])
    part = stored(tmp_path, "long.pdf", data, "document", "application/pdf")

    item = MediaReader(documents=True).read(part, vision=True)

    assert item is not None and hasattr(item, "text")
    assert f"{MAX_PDF_PAGES + 1} pages" in item.text
    assert "page text 100" in item.text


async def test_a_prepared_image_is_reused_until_the_file_changes(tmp_path: Path) -> None:
    reader = MediaReader(documents=True)
    part = stored(tmp_path, "p.jpg", jpeg(2000, 1000))

    first = reader.read(part, vision=True)
    again = reader.read(replace(part, size=1), vision=True)
    part.file.write_bytes(png(30, 10))
    changed = reader.read(part, vision=True)

    assert first is not None and again is not None and changed is not None
    assert getattr(again, "data", None) is getattr(first, "data", None)
    assert getattr(changed, "mime_type", None) == "image/png"


async def test_the_heap_is_trimmed_after_new_files_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.media import heap

    trims: list[int] = []
    monkeypatch.setattr(heap, "_malloc_trim", trims.append)
    reader = MediaReader(documents=True, release_after=0)
    part = stored(tmp_path, "p.png", png(30, 20), mime="image/png")

    reader.read(part, vision=True)
    reader.release()
    reader.read(part, vision=True)  # cached: nothing was decoded
    reader.release()

    assert trims == [0]


async def test_buffers_go_back_only_once_photos_stop_coming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.media import heap

    trimmed = threading.Event()
    monkeypatch.setattr(heap, "_malloc_trim", lambda _: trimmed.set())
    waiting = MediaReader(documents=True, release_after=3600)
    waiting.read(stored(tmp_path, "a.jpg", jpeg(300, 200)), vision=True)
    waiting.release()
    assert heap.heap.pending() and not trimmed.is_set()
    assert pillow_core.get_blocks_max() >= heap.BUFFER_BLOCKS

    for n in range(3):  # photos keep coming: one thread keeps the time for all of them
        waiting.read(stored(tmp_path, f"more-{n}.jpg", jpeg(300, 201 + n)), vision=True)
        waiting.release()
    clocks = [t for t in threading.enumerate() if t.name == "roost-media-release"]
    assert len(clocks) == 1 and heap.heap.pending() and not trimmed.is_set()

    waiting.read(stored(tmp_path, "b.jpg", jpeg(300, 200)), vision=True)  # the next photo
    assert not heap.heap.pending()  # keeps the buffers: no release while busy

    # A shorter delay than the one the thread sleeps towards wakes it.
    soon = MediaReader(documents=True, release_after=0.01)
    soon.read(stored(tmp_path, "c.jpg", jpeg(300, 200)), vision=True)
    soon.release()
    assert trimmed.wait(10)
    assert not heap.heap.pending()
    assert [t for t in threading.enumerate() if t.name == "roost-media-release"] == clocks


async def test_the_request_body_carries_base64_byte_for_byte_as_json_would_encode_it(
    tmp_path: Path,
) -> None:
    from bot.media.reader import Base64Text
    from plugins.anthropic_body import encode_json, encode_messages
    from plugins.anthropic_request import to_anthropic_messages

    photo = stored(tmp_path, "photo.jpg", jpeg(64, 48))
    scan = stored(tmp_path, "scan.pdf", pdf("Total 42.50 EUR"), kind="document",
                  mime="application/pdf")
    history = [
        # Text that looks like the markers the body is put together with.
        ChatMessage("user", 'look \x00deadbeef:0 "quoted" — a dash', parts=(photo,)),
        ChatMessage("assistant", "", tool_calls=(ToolCall("t1", "fetch", {}),)),
        ChatMessage("tool", "fetched", tool_call_id="t1", parts=(scan, photo)),
    ]
    messages: list[Any] = to_anthropic_messages(history)
    sources = [b["source"] for m in messages for b in m["content"] if "source" in b]
    sources += [b["source"] for m in messages for r in m["content"]
                if r["type"] == "tool_result" for b in r["content"] if "source" in b]
    assert len(sources) == 3 and all(isinstance(s["data"], Base64Text) for s in sources)

    body = b"".join(encode_messages(messages))

    assert body == encode_json(messages).encode()
    assert encode_messages([{"role": "user", "content": "hi — no files"}]) == [
        encode_json([{"role": "user", "content": "hi — no files"}]).encode()]
    # The messages given are left as they were.
    assert all(isinstance(s["data"], Base64Text) and len(s["data"]) > 100 for s in sources)


async def test_a_photo_is_prepared_once_and_its_copy_is_found_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.media import reader as provider_media

    part = replace(stored(tmp_path, "big.jpg", jpeg(3000, 2000)), width=3000, height=2000)
    first = MediaReader(documents=True, max_pixels=provider_media.ANTHROPIC_MAX_PIXELS)
    made = first.read(part, vision=True)
    copies = list((tmp_path / ".cache" / "media").iterdir())

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("prepared twice")

    monkeypatch.setattr(provider_media, "prepare_for_model", never)
    restarted = MediaReader(documents=True, max_pixels=provider_media.ANTHROPIC_MAX_PIXELS,
                            cache_bytes=0)  # nothing in memory: every read is a miss
    again = restarted.read(part, vision=True)
    twice = restarted.read(part, vision=True)

    assert isinstance(made, ImageData) and isinstance(again, ImageData)
    assert len(copies) == 1 and copies[0].name.startswith("inbox%2Fbig.jpg.")
    assert copies[0].name.endswith("-1341px")
    assert again.data == made.data and isinstance(twice, ImageData)
    assert decoded({"source": {"data": again.data}}).size == (1341, 894)


async def test_a_damaged_or_changed_copy_on_disk_is_made_again(tmp_path: Path) -> None:
    part = stored(tmp_path, "big.jpg", jpeg(2000, 1500))
    made = MediaReader(documents=True).read(part, vision=True)
    (copy,) = (tmp_path / ".cache" / "media").iterdir()
    copy.write_bytes(copy.read_bytes()[:-100])  # cut short, as by a crash
    remade = MediaReader(documents=True).read(part, vision=True)
    copy.write_bytes(jpeg(3000, 100))  # replaced by something too large to send
    replaced = MediaReader(documents=True).read(part, vision=True)

    assert isinstance(made, ImageData) and isinstance(remade, ImageData)
    assert isinstance(replaced, ImageData)
    assert remade.data == made.data == replaced.data


async def test_a_copy_is_never_written_outside_the_workspace(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    (workspace / ".cache").mkdir(parents=True)
    (workspace / ".cache" / "media").symlink_to(outside)  # planted by a tool
    part = stored(workspace, "big.jpg", jpeg(2000, 1500))

    item = MediaReader(documents=True).read(part, vision=True)

    assert isinstance(item, ImageData) and list(outside.iterdir()) == []


@pytest.mark.parametrize("link", ["inbox/p.jpg", "inbox"])
async def test_a_file_linked_from_outside_the_workspace_is_never_sent(
    tmp_path: Path, link: str
) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (outside / "inbox").mkdir(parents=True)
    secret = jpeg(200, 100)
    (outside / "inbox" / "p.jpg").write_bytes(secret)
    (workspace / link).parent.mkdir(parents=True, exist_ok=True)
    (workspace / link).symlink_to(outside / link)  # planted by a tool
    part = ContentPart("image", "inbox/p.jpg", "image/jpeg", size=len(secret),
                       root=str(workspace))

    item = MediaReader(documents=True).read(part, vision=True)

    assert item == Note(part, "[image: inbox/p.jpg — outside the workspace; not sent]")


async def test_a_photo_within_the_limits_is_sent_as_it_is_without_its_gps(
    tmp_path: Path
) -> None:
    from bot.media.reader import ANTHROPIC_MAX_PIXELS

    original = gps_jpeg(1280, 960, gps=True)  # 2% over the ~1.2 MP the API looks at
    part = replace(stored(tmp_path, "p.jpg", original), width=1280, height=960)

    item = MediaReader(documents=True, max_pixels=ANTHROPIC_MAX_PIXELS).read(part, vision=True)

    assert isinstance(item, ImageData)
    sent = base64.b64decode(item.data)
    assert b"GPS" not in sent and b"PhoneCo" not in sent and len(sent) < len(original)
    scan = original.index(b"\xff\xda")  # the pixels: not re-encoded, byte for byte
    assert sent.endswith(original[scan:])


# -- the Anthropic fake refuses what the API refuses -------------------------------


def image_block(data: bytes | str, media_type: str = "image/png") -> dict[str, Any]:
    text = data if isinstance(data, str) else base64.b64encode(data).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": text}}


@pytest.mark.parametrize(("block", "expected"), [
    (image_block(png(4, 4), "image/bmp"),
     "messages.0.content.0.image.source.base64.media_type: Input should be 'image/jpeg', "
     "'image/png', 'image/gif' or 'image/webp'"),
    (image_block("not base64!!"), "messages.0.content.0.image.source.base64: invalid base64 data"),
    (image_block(png(4, 4), "image/jpeg"),
     "messages.0.content.0.image.source.base64.data: The image was specified using the "
     "image/jpeg media type, but the image appears to be a image/png image"),
    (image_block(b"GIF89a but no image"),
     "messages.0.content.0.image.source.base64.data: Could not process image"),
    (image_block(png(8001, 2)),
     "messages.0.content.0.image.source.base64.data: At least one of the image dimensions "
     "exceed max allowed size: 8000 pixels"),
    ({"type": "document", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(pdf("x")).decode()}},
     "messages.0.content.0.document.source.base64.media_type: Input should be "
     "'application/pdf'"),
    ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                     "data": base64.b64encode(b"plain text").decode()}},
     "messages.0.content.0.pdf: The PDF specified was not valid."),
])
async def test_the_anthropic_fake_refuses_bad_blocks_with_the_api_error(
    block: dict[str, Any], expected: str
) -> None:
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        client = anthropic.AsyncAnthropic(api_key=ANTHROPIC_KEY, base_url=fake.base_url,
                                          max_retries=0)
        messages: Any = [{"role": "user", "content": [block, {"type": "text", "text": "?"}]}]
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(model="m", max_tokens=10, messages=messages)
        await client.close()
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"] == {"type": "invalid_request_error", "message": expected}


async def test_the_anthropic_fake_measures_the_5_mb_on_the_base64_text() -> None:
    raw = b"\x89PNG" + bytes(4 * 1024 * 1024)  # 4 MB decoded, 5.3 MB as base64
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        client = anthropic.AsyncAnthropic(api_key=ANTHROPIC_KEY, base_url=fake.base_url,
                                          max_retries=0)
        messages: Any = [{"role": "user", "content": [image_block(raw)]}]
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(model="m", max_tokens=10, messages=messages)
        await client.close()
    encoded = len(base64.b64encode(raw))
    assert f"image exceeds 5 MB maximum: {encoded} bytes > 5242880 bytes" in str(caught.value)


# -- OpenAI-compatible ------------------------------------------------------------


async def test_a_photo_reaches_an_openai_server_as_an_image_url_data_url(
    gpt: tuple[FakeOpenAI, OpenAIProvider], tmp_path: Path
) -> None:
    fake, provider = gpt
    fake.reply_text("a photo")
    part = stored(tmp_path, "big.jpg", jpeg(3000, 4000))

    await provider.complete(asking(part))

    user = fake.last_request.body["messages"][1]
    text, image = user["content"]
    assert text == {"type": "text", "text": "what is this?"}
    assert image["type"] == "image_url"
    head, _, payload = image["image_url"]["url"].partition(",")
    assert head == "data:image/jpeg;base64"
    assert Image.open(io.BytesIO(base64.b64decode(payload))).size == (1176, 1568)


async def test_an_openai_server_gets_a_pdf_as_its_text(
    gpt: tuple[FakeOpenAI, OpenAIProvider], tmp_path: Path
) -> None:
    fake, provider = gpt
    fake.reply_text("42.50")
    part = stored(tmp_path, "r.pdf", pdf("Receipt total 42.50 EUR", "Thank you"), "document",
                  "application/pdf")

    await provider.complete(asking(part, text="total?"))

    content = fake.last_request.body["messages"][1]["content"]
    assert isinstance(content, str)
    assert content.startswith("total?\n\n[document: inbox/r.pdf, 2 pages — its text follows")
    assert "Receipt total 42.50 EUR" in content and "Thank you" in content


async def test_without_vision_an_openai_server_gets_plain_text(
    gpt: tuple[FakeOpenAI, OpenAIProvider], tmp_path: Path
) -> None:
    fake, provider = gpt
    fake.reply_text("ok")
    part = stored(tmp_path, "photo-1.jpg", jpeg(100, 80))

    await provider.complete(asking(part, vision=False))

    content = fake.last_request.body["messages"][1]["content"]
    assert content == ("what is this?\n\n"
                       "[image: inbox/photo-1.jpg — this model cannot see images]")


async def test_consecutive_user_messages_keep_all_their_images(
    gpt: tuple[FakeOpenAI, OpenAIProvider], tmp_path: Path
) -> None:
    fake, provider = gpt
    fake.reply_text("two")
    one = stored(tmp_path, "1.png", png(5, 5), mime="image/png")
    two = stored(tmp_path, "2.png", png(6, 6), mime="image/png")
    history = (ChatMessage("user", "first", parts=(one,)),
               ChatMessage("user", "", parts=(two,)))

    await provider.complete(LLMRequest("m", "", history))

    content = fake.last_request.body["messages"][0]["content"]
    assert [p["type"] for p in content] == ["text", "image_url", "image_url"]


@pytest.mark.parametrize(("url", "message", "code"), [
    ("data:image/png;base64,@@@", "Invalid base64 image_url", "invalid_value"),
    ("data:application/pdf;base64,JVBERi0=",
     "Invalid MIME type. Only image types are supported.", "invalid_image_format"),
    ("data:image/png;base64," + base64.b64encode(b"not an image").decode(),
     "You uploaded an unsupported image.", "invalid_image_format"),
    ("ftp://example/x.png", "Invalid image URL", "invalid_value"),
])
async def test_the_openai_fake_refuses_bad_images_with_the_api_error(
    url: str, message: str, code: str
) -> None:
    async with FakeOpenAI(api_key=OPENAI_KEY) as fake:
        client = openai.AsyncOpenAI(api_key=OPENAI_KEY, base_url=fake.base_url, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=[{
                "role": "user",
                "content": [{"type": "text", "text": "?"},
                            {"type": "image_url", "image_url": {"url": url}}]}])
        await client.close()
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["message"].startswith(message)
    assert body["type"] == "invalid_request_error"
    assert body["code"] == code
    assert set(body) == {"message", "type", "param", "code"}


# -- whole runs: a chat, the intake, the provider plugin, the real SDK, the fake API -------


async def test_a_photo_in_a_chat_reaches_claude_as_a_valid_image_block_turn_after_turn(
    tmp_path: Path,
) -> None:
    async with FakeAnthropic(api_key=ANTHROPIC_KEY) as fake:
        fake.reply_text("A receipt.")
        fake.reply_text("42.50 EUR.")
        app, recorder = await create_app(
            None, data_dir=tmp_path, provider="anthropic", anthropic_api_key=ANTHROPIC_KEY,
            anthropic_base_url=fake.base_url)
        chat = FileChat()
        try:
            await chat.attach(app, recorder)
            photo = chat.add_file("photo-1.jpg", jpeg(4000, 3000), "photo",
                                  mime_type="image/jpeg")
            scan = chat.add_file("receipt.pdf", pdf("Total 42.50 EUR"), "document",
                                 mime_type="application/pdf")
            await chat.say_with("what is this?", photo, scan)
            await chat.settle()
            await chat.say_with("and the total?")
            await chat.settle()
        finally:
            await app.close()

    assert chat.replies == ["A receipt.", "42.50 EUR."]
    first, second = fake.requests  # both passed the fake's image and document checks
    # The time (volatile) is read last, after the cached blocks.
    image, document, text, note = first.body["messages"][-1]["content"]
    assert note["text"].startswith("Current time:") and "cache_control" in text
    assert decoded(image).size == (1264, 948)
    assert document["source"]["media_type"] == "application/pdf"
    assert text["text"].startswith("what is this?")
    # The next turn sends the photo and the PDF again, from the history.
    assert [b["type"] for b in second.body["messages"][0]["content"]][:2] == [
        "image", "document"]


async def test_a_photo_in_a_chat_reaches_an_openai_server_and_a_pdf_as_text(
    tmp_path: Path,
) -> None:
    async with FakeOpenAI(api_key=OPENAI_KEY) as fake:
        fake.reply_text("A receipt for 42.50 EUR.")
        app, recorder = await create_app(
            None, data_dir=tmp_path, provider="openai", openai_api_key=OPENAI_KEY,
            openai_base_url=fake.base_url)
        chat = FileChat()
        try:
            await chat.attach(app, recorder)
            photo = chat.add_file("photo-1.png", png(640, 480), "photo", mime_type="image/png")
            scan = chat.add_file("receipt.pdf", pdf("Total 42.50 EUR"), "document",
                                 mime_type="application/pdf")
            await chat.say_with("what is this?", photo, scan)
            await chat.settle()
        finally:
            await app.close()

    assert chat.replies == ["A receipt for 42.50 EUR."]
    text, image = fake.last_request.body["messages"][-1]["content"]
    assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert "Total 42.50 EUR" in text["text"]
