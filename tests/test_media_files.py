"""Media building blocks: sniffing, images for the model, safe names, storing, token costs,
images in the history, parts in the session store and the durable inbox."""

from __future__ import annotations

import datetime as dt
import io
import os
from pathlib import Path

import pytest
from PIL import Image

from bot.config.settings import Settings
from bot.contracts.llm import ChatMessage, ContentPart, LLMRequest
from bot.contracts.media import MediaError
from bot.contracts.messages import (
    Attachment,
    InboundMessage,
    OutboundFile,
    OutboundMessage,
)
from bot.contracts.tools import ToolError
from bot.engine.context import DOCUMENT_PAGE_TOKENS, TokenEstimator
from bot.engine.media import MAX_CONTEXT_IMAGES, drop_images
from bot.media.images import (
    ImageTooLarge,
    image_tokens,
    inspect_image,
    model_ready,
    model_size,
    prepare_for_model,
    strip_jpeg_metadata,
)
from bot.media.sniff import sniff_mime
from bot.storage.inbox import decode_message, decode_outbound, encode_message, encode_outbound
from bot.storage.sessions import SessionStore
from plugins.transcribe import TranscribeConfig
from tests.media_helpers import jpeg, ogg_opus, png, png_bomb
from workspaces import safe_file_name, store_file

# -- sniffing -----------------------------------------------------------------------


@pytest.mark.parametrize(("data", "declared", "name", "expected"), [
    (jpeg(32, 32), "image/png", "photo.png", "image/jpeg"),
    (png(), "application/pdf", "scan.pdf", "image/png"),
    (b"%PDF-1.7\n...", "image/jpeg", "x.jpg", "application/pdf"),
    (ogg_opus(), "audio/mpeg", "voice.mp3", "audio/ogg"),
    (b"a,b\n1,2\n", "text/csv", "t.csv", "text/csv"),
    (b"just some words", "image/png", "fake.png", "text/plain"),
    (b"PK\x03\x04" + bytes(40), "", "report.docx",
     "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    (b"PK\x03\x04" + bytes(40), "image/jpeg", "x.jpg", "application/zip"),
    (bytes(range(256)) * 4, "image/png", "noise.png", "application/octet-stream"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "", "", "image/webp"),
    (b"\x00\x00\x00\x20ftypM4A \x00", "", "", "audio/mp4"),
])
def test_the_type_is_what_the_bytes_are_whatever_was_declared(
        data: bytes, declared: str, name: str, expected: str) -> None:
    assert sniff_mime(data, declared, name) == expected


# -- images --------------------------------------------------------------------------


def test_a_decompression_bomb_png_is_refused_from_its_header() -> None:
    with pytest.raises(ImageTooLarge):
        inspect_image(png_bomb())
    with pytest.raises(ImageTooLarge):
        prepare_for_model(png_bomb())


def test_an_image_over_the_pixel_limit_is_refused_even_below_pillows_own_limit() -> None:
    with pytest.raises(ImageTooLarge, match="9000×9000 pixels"):
        inspect_image(png_bomb(9_000))


def test_bytes_that_are_no_image_are_a_media_error() -> None:
    with pytest.raises(MediaError):
        inspect_image(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    with pytest.raises(MediaError):
        prepare_for_model(b"not an image")


def test_the_model_gets_a_resized_upright_copy_without_gps() -> None:
    original = jpeg(4000, 3000, gps=True, orientation=6)
    assert Image.open(io.BytesIO(original)).getexif().get_ifd(0x8825)  # GPS was there
    data, mime = prepare_for_model(original)
    img = Image.open(io.BytesIO(data))
    assert mime == "image/jpeg" and img.format == "JPEG"
    assert img.size == (1176, 1568)  # orientation 6: turned upright, long edge 1568
    assert len(img.getexif()) == 0
    assert "exif" not in img.info and b"GPS" not in data and b"PhoneCo" not in data


def test_a_small_clean_image_goes_to_the_model_unchanged() -> None:
    small = png(200, 100)
    assert prepare_for_model(small) == (small, "image/png")


def test_a_small_photo_with_gps_loses_it_without_being_re_encoded() -> None:
    original = jpeg(320, 240, gps=True)
    data, mime = prepare_for_model(original)
    assert mime == "image/jpeg" and b"PhoneCo" not in data and b"GPS" not in data
    assert Image.open(io.BytesIO(data)).size == (320, 240)
    assert data.endswith(original[original.index(b"\xff\xda"):])  # the scan, untouched
    assert model_ready(data) == "image/jpeg" and model_ready(original) is None


def test_a_turned_photo_within_the_limits_is_re_encoded_upright() -> None:
    data, _ = prepare_for_model(jpeg(320, 240, gps=True, orientation=6))
    img = Image.open(io.BytesIO(data))
    assert img.size == (240, 320) and b"PhoneCo" not in data and len(img.getexif()) == 0


def test_stripping_keeps_colour_and_drops_comments_xmp_and_appended_images() -> None:
    img = Image.open(io.BytesIO(jpeg(64, 48, gps=True)))
    icc = b"\x00" * 128  # only carried, never parsed
    buf = io.BytesIO()
    img.save(buf, "JPEG", progressive=True, exif=img.info["exif"], comment=b"at home",
             icc_profile=icc, xmp=b"<x:xmpmeta>Paris</x:xmpmeta>")
    original = buf.getvalue() + b"\xff\xd8 a second image with its own Exif \xff\xd9"

    stripped = strip_jpeg_metadata(original)

    assert stripped is not None
    for secret in (b"PhoneCo", b"at home", b"Paris", b"second image"):
        assert secret not in stripped
    out = Image.open(io.BytesIO(stripped))
    assert out.info.get("icc_profile") == icc and out.info.get("progressive")
    assert out.tobytes() == Image.open(io.BytesIO(original)).tobytes()


@pytest.mark.parametrize("cut", [b"\xff\xd8\xff\xe1\x00", b"not a jpeg", b""])
def test_a_jpeg_whose_structure_is_broken_is_not_stripped(cut: bytes) -> None:
    whole = jpeg(64, 48, gps=True)
    assert strip_jpeg_metadata(cut) is None
    assert strip_jpeg_metadata(whole[:-2]) is None  # no end of image
    assert strip_jpeg_metadata(whole[:200]) is None


def test_transparency_is_kept_as_png_and_a_format_the_model_cannot_take_is_converted() -> None:
    data, mime = prepare_for_model(png(2000, 1000, alpha=True))
    assert mime == "image/png" and Image.open(io.BytesIO(data)).size == (1568, 784)
    bmp = io.BytesIO()
    Image.new("RGB", (50, 40), (1, 2, 3)).save(bmp, "BMP")
    data, mime = prepare_for_model(bmp.getvalue())
    assert mime in ("image/png", "image/jpeg")


def test_a_palette_png_with_a_transparent_color_keeps_its_transparency() -> None:
    img = Image.new("P", (3000, 100), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    buf = io.BytesIO()
    img.save(buf, "PNG", transparency=0)
    data, mime = prepare_for_model(buf.getvalue())
    out = Image.open(io.BytesIO(data))
    assert mime == "image/png" and out.mode == "RGBA" and out.getpixel((0, 0))[3] == 0


def test_an_image_larger_than_the_byte_limit_is_made_to_fit() -> None:
    noisy = Image.frombytes("RGB", (1500, 1500), os.urandom(1500 * 1500 * 3))
    buf = io.BytesIO()
    noisy.save(buf, "PNG")
    data, mime = prepare_for_model(buf.getvalue(), max_bytes=400_000)
    assert len(data) <= 400_000 and mime == "image/jpeg"


def test_an_image_costs_width_times_height_over_750_at_the_size_it_is_sent() -> None:
    assert image_tokens(1000, 750) == 1000
    assert model_size(4000, 3000) == (1568, 1176)
    assert image_tokens(4000, 3000) == image_tokens(1568, 1176) == 2459


# -- names and storing ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), [
    ("../../etc/passwd", "passwd"),
    ("..\\..\\boot.ini", "boot.ini"),
    (".bashrc", "bashrc"),
    ("CON.txt", "CON_.txt"),
    ("фото отпуск.jpg", "фото отпуск.jpg"),
    ("a\x00b\u202egpj.exe", "a_b_gpj.exe"),
    ("", "photo-7.jpg"),
    ("...", "photo-7.jpg"),
    ("x" * 300 + ".pdf", "x" * 96 + ".pdf"),
])
def test_a_file_name_from_a_chat_becomes_a_safe_one(name: str, expected: str) -> None:
    assert safe_file_name(name, fallback="photo-7.jpg") == expected


def test_a_name_clash_adds_a_number_and_identical_bytes_are_not_stored_twice(
        tmp_path: Path) -> None:
    assert store_file(tmp_path, "inbox/2026-11-23", "photo.jpg", b"one") \
        == "inbox/2026-11-23/photo.jpg"
    assert store_file(tmp_path, "inbox/2026-11-23", "photo.jpg", b"two") \
        == "inbox/2026-11-23/photo-2.jpg"
    assert store_file(tmp_path, "inbox/2026-11-23", "photo.jpg", b"three") \
        == "inbox/2026-11-23/photo-3.jpg"
    # A run executed again after a crash stores the same bytes: the first copy is reused.
    assert store_file(tmp_path, "inbox/2026-11-23", "photo.jpg", b"two") \
        == "inbox/2026-11-23/photo-2.jpg"
    stored = sorted(p.name for p in (tmp_path / "inbox/2026-11-23").iterdir())
    assert stored == ["photo-2.jpg", "photo-3.jpg", "photo.jpg"]
    assert (tmp_path / "inbox/2026-11-23/photo-3.jpg").read_bytes() == b"three"


def test_an_inbox_that_links_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "inbox").symlink_to(outside)
    with pytest.raises(ToolError, match="outside your workspace"):
        store_file(workspace, "inbox/2026-11-23", "photo.jpg", b"x")
    assert not any(outside.rglob("*"))


# -- token costs and the history --------------------------------------------------------


def _photo(path: str, root: Path, width: int = 1568, height: int = 1176) -> ContentPart:
    return ContentPart("image", path, "image/jpeg", width, height, 1000, str(root))


def test_a_message_with_an_image_costs_the_image_too() -> None:
    est = TokenEstimator("anthropic")
    text_only = ChatMessage("user", "what is this?")
    with_photo = ChatMessage("user", "what is this?", parts=(_photo("p.jpg", Path("/")),))
    assert est.message(with_photo) - est.message(text_only) == image_tokens(1568, 1176)
    assert est.messages([with_photo]) == est.message(with_photo)
    doc = ChatMessage("user", "", parts=(ContentPart("document", "d.pdf", "application/pdf",
                                                     pages=3),))
    assert est.messages([doc]) - est.messages([ChatMessage("user", "")]) \
        == 3 * DOCUMENT_PAGE_TOKENS


def test_calibration_counts_images_by_their_own_rule() -> None:
    est = TokenEstimator("anthropic")
    before = est.ratio
    message = ChatMessage("user", "x" * 3500, parts=(_photo("p.jpg", Path("/")),))
    request = LLMRequest("m", "", (message,))
    # The provider reports text tokens at exactly the current ratio plus the image.
    text_tokens = int(est.request_chars(request) / before)
    est.calibrate(request, text_tokens + image_tokens(1568, 1176))
    assert est.ratio == pytest.approx(before, rel=0.01)


def test_old_images_leave_the_context_first_with_a_note(tmp_path: Path) -> None:
    history = []
    for n in range(5):
        history.append(ChatMessage("user", f"photo {n}",
                                   parts=(_photo(f"inbox/d/p{n}.jpg", tmp_path),)))
        history.append(ChatMessage("assistant", f"nice {n}"))
    est = TokenEstimator("anthropic")
    window = est.messages(history) * 2  # 50% full: above a soft ratio of 0.3

    out = drop_images(history, lambda ms: est.messages(ms) / window, 0.3,
                      exists=lambda p: True)
    kept = [p.path for m in out for p in m.parts]
    assert kept and kept == [f"inbox/d/p{n}.jpg" for n in range(5 - len(kept), 5)]
    assert out[0].content == "photo 0\n[image: inbox/d/p0.jpg — removed from context]"
    assert est.messages(out) / window < 0.3
    assert history[0].parts  # the session's own messages are untouched


def test_beyond_the_image_cap_the_oldest_go_and_a_missing_file_becomes_a_note(
        tmp_path: Path) -> None:
    (tmp_path / "here.jpg").write_bytes(b"x")
    history = [ChatMessage("user", f"{n}", parts=(_photo("here.jpg", tmp_path),))
               for n in range(MAX_CONTEXT_IMAGES + 2)]
    history.insert(0, ChatMessage("user", "", parts=(_photo("gone.jpg", tmp_path),)))
    out = drop_images(history, lambda ms: 0.0, 0.3)
    assert out[0].content == "[image: gone.jpg — file no longer available]"
    assert not out[1].parts and not out[2].parts and out[3].parts
    assert sum(len(m.parts) for m in out) == MAX_CONTEXT_IMAGES


# -- persistence ---------------------------------------------------------------------------


async def test_parts_are_stored_by_reference_and_come_back_after_a_restart(
        tmp_path: Path) -> None:
    part = ContentPart("document", "inbox/2026-11-23/scan.pdf", "application/pdf", size=9000,
                       root=str(tmp_path / "ws"), pages=2)
    store = await SessionStore.open(tmp_path / "roost.db")
    session = await store.get("default:console:direct:u")
    await store.append_run(session, "r1", [ChatMessage("user", "sum this", parts=(part,)),
                                           ChatMessage("assistant", "42")])
    await store.close()
    store = await SessionStore.open(tmp_path / "roost.db")
    try:
        again = await store.get("default:console:direct:u")
        assert [m.parts for m in again.messages] == [(part,), ()]
        async with store.db.execute("SELECT parts FROM messages WHERE role = 'user'") as cur:
            row = await cur.fetchone()
        assert row is not None and len(row[0]) < 300  # a reference, not the file
    finally:
        await store.close()


def test_attachments_and_outbound_files_survive_the_durable_inbox() -> None:
    attachment = Attachment("voice", "voice-9.ogg", "file-id-9", "audio/ogg", 5000,
                            duration=12.5)
    message = InboundMessage("telegram", "1", "direct", "1", "", attachments=(attachment,))
    assert decode_message(encode_message(message)).attachments == (attachment,)
    out = OutboundMessage("telegram", "1", "here", files=(OutboundFile(
        "/ws/chart.png", "chart.png", "image/png", 1234, "the chart"),))
    assert decode_outbound(encode_outbound(out)) == out


async def test_the_console_prints_the_path_of_a_file_it_is_sent() -> None:
    from channels.console import ConsoleChannel

    out = io.StringIO()
    console = ConsoleChannel(out=out, read_stdin=False)
    await console.send(OutboundMessage("console", "console", "your chart", files=(OutboundFile(
        "/data/ws/chart.png", "chart.png", "image/png", 2048, "sales"),)))
    assert out.getvalue() == ("roost> your chart\n"
                              "roost> [file: /data/ws/chart.png (image/png, 2048 bytes)] — sales\n")


def test_media_settings_have_their_defaults_and_the_transcriber_key_is_masked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_TRANSCRIBE_BASE_URL", "http://127.0.0.1:9000/v1")
    monkeypatch.setenv("ROOST_TRANSCRIBE_API_KEY", "sk-secret-123")
    settings = Settings(_env_file=None)
    assert (settings.media_max_file_mb, settings.media_max_files,
            settings.media_max_total_mb, settings.vision) == (20, 10, 50, True)
    config = TranscribeConfig.model_validate(settings.plugins["plugins.transcribe"])
    assert config.base_url == "http://127.0.0.1:9000/v1"
    assert config.api_key is not None and config.api_key.get_secret_value() == "sk-secret-123"
    masked = settings.masked()["plugins"]["plugins.transcribe"]
    assert masked["api_key"] == "********" and "sk-secret" not in str(masked)


def test_the_summarizer_is_told_which_files_a_message_had() -> None:
    from bot.engine.compaction import transcript

    described = ChatMessage("user", "look\n\n[photo: inbox/d/a.jpg, 10×10, 1 KB]", sender_id="u",
                            parts=(_photo("inbox/d/a.jpg", Path("/ws")),))
    bare = ChatMessage("user", "and this", sender_id="u",
                       parts=(_photo("inbox/d/b.jpg", Path("/ws")),))
    text = transcript([described, bare])
    assert text.count("inbox/d/a.jpg") == 1
    assert "u: and this\n[image: inbox/d/b.jpg]" in text


async def test_files_without_a_name_are_named_after_their_kind_and_type(tmp_path: Path) -> None:
    from bot.media.intake import receive

    files = {"a": jpeg(8, 8), "b": b"%PDF-1.4\n%%EOF"}

    async def download(attachment: Attachment, limit: int) -> bytes:
        return files[attachment.url]

    message = InboundMessage("t", "1", "direct", "1", "", attachments=(
        Attachment("photo", url="a"), Attachment("document", url="b")))
    received = await receive(message, tmp_path, download, Settings(data_dir=tmp_path),
                             today=dt.date(2026, 11, 23))
    assert received.stored == ["inbox/2026-11-23/photo-1.jpg", "inbox/2026-11-23/document-2.pdf"]
