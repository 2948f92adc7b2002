"""Images with Pillow: what an image is, and the copy of it a model may see.

:func:`inspect_image` reads the header only and refuses decompression bombs
(a few KB of PNG that would decode to gigabytes) before anything decodes them.
:func:`prepare_for_model` returns the bytes a provider sends: at most
``max_edge`` pixels on the long edge and ``max_bytes`` long, in a format the
API takes, turned upright, and without EXIF/XMP/IPTC metadata (GPS location
above all): nothing but pixels leaves the machine. The file stored in the
user's workspace stays as it was received.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.contracts.media import MediaError

if TYPE_CHECKING:
    # Pillow is imported by the functions that decode: a process that gets no
    # image never loads it (a few MB of RSS, ~20 ms at start).
    from PIL import Image

MAX_PIXELS = 50_000_000
"""Images larger than this (e.g. 8000×6250) are refused: decoding one costs 150 MB
and more, and no model sees more than ~1.2 megapixels of it anyway."""

MODEL_FORMATS = ("image/jpeg", "image/png", "image/gif", "image/webp")
MODEL_MAX_EDGE = 1568
MODEL_MAX_BYTES = 5 * 1024 * 1024
TOKENS_PER_PIXEL = 1 / 750
"""Anthropic's published estimate of an image's cost: width × height / 750 tokens."""

_METADATA_KEYS = ("exif", "xmp", "XML:com.adobe.xmp", "comment", "Raw profile type exif",
                  "Raw profile type APP1", "Raw profile type iptc")

_ENTROPY_END = re.compile(rb"\xff(?=[^\x00\xd0-\xd7\xff])")
"""Where entropy-coded data ends: a 0xFF that is not stuffing (FF 00), a restart marker
(FF D0-D7) or a fill byte before the next marker."""
_KEPT_APP = {0xE0: b"JFIF\x00", 0xE2: b"ICC_PROFILE\x00", 0xEE: b"Adobe"}
"""Application segments that describe the pixels: JFIF (density), the ICC colour
profile, Adobe (the colour transform a decoder needs). Every other APPn (Exif, XMP,
IPTC, MPF, maker data) and every comment goes."""


class ImageTooLarge(MediaError):
    """The image has more pixels than Roost decodes (a decompression bomb, or near one)."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """An image's dimensions (as stored, before EXIF orientation) and sniffed type."""

    width: int
    height: int
    mime_type: str


def _open(data: bytes, max_pixels: int) -> Image.Image:
    from PIL import Image, UnidentifiedImageError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge("the image is too large to decode safely (a decompression bomb?)"
                            ) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise MediaError("the file is not an image Roost can read") from exc
    width, height = img.size
    if width <= 0 or height <= 0:
        img.close()
        raise MediaError("the image has no pixels")
    if width * height > max_pixels:
        img.close()
        raise ImageTooLarge(f"the image is {width}×{height} pixels, over the limit of "
                            f"{max_pixels / 1_000_000:g} megapixels")
    return img


def inspect_image(data: bytes, *, max_pixels: int = MAX_PIXELS) -> ImageInfo:
    """Dimensions and type of the image in ``data``, from its header.

    Raises :class:`MediaError` for what is not an image Pillow reads, and
    :class:`ImageTooLarge` for decompression bombs (more than ``max_pixels``),
    without decoding the pixels.
    """
    from PIL import Image
    img = _open(data, max_pixels)
    with img:
        mime = Image.MIME.get(img.format or "", "") or "application/octet-stream"
        info = ImageInfo(img.width, img.height, mime)
        try:
            img.verify()  # structure and checksums (PNG CRCs); decodes nothing
        except Exception as exc:  # Pillow raises many kinds for corrupt files
            raise MediaError("the image file is damaged") from exc
    return info


def model_size(width: int, height: int, max_edge: int = MODEL_MAX_EDGE) -> tuple[int, int]:
    """The size an image of ``width``×``height`` is sent at (long edge ≤ ``max_edge``)."""
    long_edge = max(width, height)
    if long_edge <= max_edge or long_edge <= 0:
        return max(width, 0), max(height, 0)
    scale = max_edge / long_edge
    return max(1, round(width * scale)), max(1, round(height * scale))


def image_tokens(width: int, height: int, max_edge: int = MODEL_MAX_EDGE) -> int:
    """What an image costs in the context: its size as sent, width × height / 750 tokens.

    Unknown dimensions (0) count as a full-size image, the safe side.
    """
    if width <= 0 or height <= 0:
        width = height = max_edge
    w, h = model_size(width, height, max_edge)
    return max(1, math.ceil(w * h * TOKENS_PER_PIXEL))


def _has_metadata(img: Image.Image) -> bool:
    if any(key in img.info for key in _METADATA_KEYS):
        return True
    applist = getattr(img, "applist", None) or []
    for marker, payload in applist:
        if marker == "COM":
            return True
        if marker.startswith("APP"):
            kept = _KEPT_APP.get(0xE0 + int(marker[3:]))
            if kept is None or not payload.startswith(kept):
                return True
    return False


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # a malformed EXIF block: treat as upright
        return 1


def prepare_for_model(
    data: bytes,
    *,
    max_edge: int = MODEL_MAX_EDGE,
    max_bytes: int = MODEL_MAX_BYTES,
    formats: Sequence[str] = MODEL_FORMATS,
    max_pixels: int = MAX_PIXELS,
    pass_edge: int | None = None,
) -> tuple[bytes, str]:
    """The image in ``data`` as a model should get it: ``(bytes, mime type)``.

    Passed through untouched when it is already in ``formats``, within
    ``pass_edge`` (default ``max_edge``) and ``max_bytes`` and carries no
    metadata. Such a JPEG that does carry metadata but stands upright loses its
    metadata segments losslessly (:func:`strip_jpeg_metadata`: no re-encoding,
    the pixels stay byte for byte). Anything else is decoded, turned upright
    (EXIF orientation), scaled to ``max_edge`` at most, and re-encoded without
    any metadata (JPEG; PNG where there is transparency, or a PNG that stays
    small enough). An animated image becomes its first frame. Raises
    :class:`MediaError` for bombs and undecodable files.
    """
    from PIL import Image, ImageFile
    img = _open(data, max_pixels)
    with img:
        mime = Image.MIME.get(img.format or "", "")
        if (mime in formats and max(img.size) <= (pass_edge or max_edge)
                and len(data) <= max_bytes):
            if img.format == "JPEG":
                # Even without Exif, a phone's JPEG may end in more images (MPF).
                if _orientation(img) == 1:
                    stripped = strip_jpeg_metadata(data)
                    if stripped is not None and _ready(
                            stripped, pass_edge or max_edge, max_bytes, formats, whole=False):
                        return (data if len(stripped) == len(data) else stripped), mime
            elif not _has_metadata(img):
                return data, mime
        # One read of the whole file for the decoder (Pillow's default is 64 KB at a time:
        # ~45 decoder calls for a 3 MB photo, each copying what the last one left over).
        # BytesIO hands the bytes it was made from over without a copy.
        if isinstance(img, ImageFile.ImageFile):
            img.decodermaxblock = max(img.decodermaxblock, len(data) + 1)
        try:
            return _reencode(img, mime, max_edge, max_bytes, formats)
        except MediaError:
            raise
        except Exception as exc:  # truncated or corrupt pixel data, in any codec
            raise MediaError("the image file is damaged") from exc


def model_ready(data: bytes, *, max_edge: int = MODEL_MAX_EDGE,
                max_bytes: int = MODEL_MAX_BYTES,
                formats: Sequence[str] = MODEL_FORMATS) -> str | None:
    """The MIME type of ``data`` if a model may get it as it is, else ``None``.

    As it is means: a format in ``formats``, the long edge within ``max_edge``,
    at most ``max_bytes``, no metadata (a JPEG: no segment
    :func:`strip_jpeg_metadata` would drop, nothing after its end), and the
    file complete (it ends as its format ends: a copy cut short by a crash is
    not ready). Used to check a prepared copy kept on disk before it is sent.
    """
    return _ready(data, max_edge, max_bytes, formats, whole=True)


def _ready(data: bytes, max_edge: int, max_bytes: int, formats: Sequence[str], *,
           whole: bool) -> str | None:
    from PIL import Image
    if len(data) > max_bytes:
        return None
    try:
        img = _open(data, MAX_PIXELS)
    except MediaError:
        return None
    with img:
        mime = Image.MIME.get(img.format or "", "")
        if mime not in formats or max(img.size) > max_edge or _has_metadata(img):
            return None
    if not _complete(data, mime):
        return None
    if whole and mime == "image/jpeg":
        stripped = strip_jpeg_metadata(data)
        if stripped is None or len(stripped) != len(data):
            return None
    return mime


def _complete(data: bytes, mime: str) -> bool:
    if mime == "image/jpeg":
        return data.endswith(b"\xff\xd9")
    if mime == "image/png":
        return data.endswith(b"IEND\xaeB`\x82")
    if mime == "image/gif":
        return data.endswith(b";")
    if mime == "image/webp":
        return len(data) >= 12 and int.from_bytes(data[4:8], "little") + 8 == len(data)
    return False


def strip_jpeg_metadata(data: bytes) -> bytes | None:
    """``data`` (a JPEG) without its metadata segments, the image data untouched.

    Drops every APPn segment except JFIF, the ICC profile and Adobe, every COM
    segment, and anything after the end of the image (the extra images a
    phone's MPF appends, which carry their own Exif). Returns ``None`` when
    the file's structure is not what the JPEG standard says (the caller then
    re-encodes it).
    """
    if not data.startswith(b"\xff\xd8"):
        return None
    out = [b"\xff\xd8"]
    pos, end = 2, len(data)
    while pos + 1 < end:
        if data[pos] != 0xFF:
            return None
        while pos + 1 < end and data[pos + 1] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos + 1 >= end:
            return None
        code = data[pos + 1]
        if code == 0xD9:
            out.append(b"\xff\xd9")
            return b"".join(out)
        if code == 0x01 or 0xD0 <= code <= 0xD7:  # markers without a length
            out.append(data[pos:pos + 2])
            pos += 2
            continue
        if pos + 4 > end:
            return None
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        stop = pos + 2 + length
        if length < 2 or stop > end:
            return None
        if code == 0xFE or (0xE0 <= code <= 0xEF and not data.startswith(
                _KEPT_APP.get(code, b"\xff"), pos + 4)):
            pos = stop
            continue
        out.append(data[pos:stop])
        pos = stop
        if code == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            marker = _ENTROPY_END.search(data, pos)
            if marker is None:
                return None
            out.append(data[pos:marker.start()])
            pos = marker.start()
    return None


def _reencode(img: Image.Image, mime: str, max_edge: int, max_bytes: int,
              formats: Sequence[str]) -> tuple[bytes, str]:
    from PIL import Image, ImageOps
    target = model_size(*img.size, max_edge=max_edge)
    if img.format == "JPEG" and target != img.size:
        # Decode at 1/2, 1/4 or 1/8 scale straight from the DCT: several times faster
        # than decoding 12 megapixels to throw most of them away.
        img.draft("RGB", target)
    icc = img.info.get("icc_profile")
    transparency = "transparency" in img.info
    orientation = _orientation(img)
    img.load()
    # No copy: ``img`` is this call's own, and every step below makes a new image anyway.
    frame: Image.Image = img if orientation == 1 else ImageOps.exif_transpose(img)
    alpha = frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and transparency)
    if frame.mode not in ("RGB", "L", "RGBA", "LA"):
        # Before the metadata goes: a palette's transparent colour is part of it.
        frame = frame.convert("RGBA" if alpha else "RGB")
    frame.info = {}  # nothing of the original's metadata may ride along
    want = model_size(*frame.size, max_edge=max_edge)
    if want != frame.size:
        # Pillow's filters are antialiased when they shrink (their support grows with the
        # factor). A photo takes the box filter (area average; a third faster than
        # bilinear, the cost that matters per photo); screenshots and drawings, where thin
        # text must stay legible, the bilinear one, still twice as fast as Lanczos.
        resample = Image.Resampling.BOX if img.format == "JPEG" else Image.Resampling.BILINEAR
        frame = frame.resize(want, resample, reducing_gap=2.0)
    png_first = "image/png" in formats and (alpha or mime in ("image/png", "image/gif"))
    while True:
        if png_first:
            out = _save(frame, "PNG", icc)
            if len(out) <= max_bytes:
                return out, "image/png"
        if "image/jpeg" in formats:
            rgb = frame if frame.mode in ("RGB", "L") else _flatten(frame)
            for quality in (85, 70, 55):
                out = _save(rgb, "JPEG", icc, quality=quality)
                if len(out) <= max_bytes:
                    return out, "image/jpeg"
        elif not png_first:
            raise MediaError("no image format the model takes can hold this image")
        if min(frame.size) <= 16:
            raise MediaError("the image cannot be made small enough for the model")
        frame = frame.resize((max(1, frame.width * 3 // 4), max(1, frame.height * 3 // 4)),
                             Image.Resampling.LANCZOS)


def _flatten(frame: Image.Image) -> Image.Image:
    from PIL import Image
    rgba = frame.convert("RGBA")
    background = Image.new("RGB", rgba.size, (255, 255, 255))
    background.paste(rgba, mask=rgba.getchannel("A"))
    return background


def _save(frame: Image.Image, fmt: str, icc: bytes | None, **options: int) -> bytes:
    buf = io.BytesIO()
    extra: dict[str, object] = {"icc_profile": icc} if icc else {}
    if fmt == "JPEG":
        frame.save(buf, "JPEG", optimize=False, **options, **extra)
    else:
        frame.save(buf, "PNG", compress_level=6, **extra)
    return buf.getvalue()
