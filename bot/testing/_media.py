"""What the fake model APIs need to check an image or PDF the way the real ones do.

The real services decode what they are sent: a payload that is not valid
base64, not the image format it claims, or too large in pixels is refused.
Pillow reads the header only (``Image.open`` is lazy), so probing a large
photo costs nothing like decoding it.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

__all__ = ["ImageProbe", "decode_base64", "probe_image"]

_FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}


@dataclass(frozen=True, slots=True)
class ImageProbe:
    """An image's real format (as a MIME type; ``""`` if not one of the four) and size."""

    mime_type: str
    width: int
    height: int


def decode_base64(data: object) -> bytes | None:
    """``data`` decoded as strict base64, or ``None`` if it is not a valid base64 string."""
    if not isinstance(data, str) or not data:
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def probe_image(data: bytes) -> ImageProbe | None:
    """The format and pixel size ``data`` really has, or ``None`` if it is no image."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = image.format or ""
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return ImageProbe(_FORMATS.get(fmt, ""), width, height)
