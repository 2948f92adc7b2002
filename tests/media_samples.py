"""Files for media tests, made on the spot: photos, PNGs, PDFs with a text layer."""

from __future__ import annotations

import io
import os
import struct
from statistics import NormalDist

from PIL import Image

__all__ = ["jpeg", "ogg_opus", "pdf", "png"]


_GAUSSIAN = [min(255, max(0, round(128 + 48 * NormalDist().inv_cdf((u + 0.5) / 256))))
             for u in range(256)]
"""Uniform bytes to Gaussian noise around grey (sigma 48), as ``Image.effect_noise`` makes it."""


def noise(width: int, height: int) -> Image.Image:
    """Fresh grey Gaussian noise (sigma 48): random bytes through :data:`_GAUSSIAN`, several
    times cheaper than ``Image.effect_noise`` with the same distribution."""
    return Image.frombytes("L", (width, height), os.urandom(width * height)).point(_GAUSSIAN)


def jpeg(width: int, height: int, *, quality: int = 90, exif: Image.Exif | None = None) -> bytes:
    """A photo-like JPEG (noise over a gradient, so it compresses like a photo); each call
    makes a different image."""
    noise_ = noise(width, height).convert("RGB")
    gradient = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    image = Image.blend(noise_, gradient, 0.5)
    out = io.BytesIO()
    options: dict[str, object] = {"quality": quality}
    if exif is not None:
        options["exif"] = exif
    image.save(out, "JPEG", **options)
    return out.getvalue()


def png(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A plain PNG."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def pdf(*pages: str) -> bytes:
    """A valid PDF whose pages show ``pages`` (one line of text each, Helvetica)."""
    pages = pages or ("",)
    objects: list[bytes] = []
    count = len(pages)
    # 1: catalog, 2: page tree, 3: font, then a page and its content stream per page.
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(count))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 18 Tf 72 720 Td ({escaped}) Tj ET".encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, xref))
    return out.getvalue()


def ogg_opus(seconds: float) -> bytes:
    """An Ogg Opus file's pages as a voice note has them: the Opus header, then a last
    page whose granule position says ``seconds`` (no real audio in between)."""

    def page(kind: int, granule: int, sequence: int, payload: bytes) -> bytes:
        head = b"OggS" + struct.pack("<BBqIIIB", 0, kind, granule, 0x524F4F53, sequence, 0, 1)
        return head + bytes([len(payload)]) + payload

    opus_head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, 48000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 5) + b"roost" + struct.pack("<I", 0)
    end = int(seconds * 48000) + 312
    return (page(2, 0, 0, opus_head) + page(0, 0, 1, tags)
            + page(4, end, 2, b"\xf8\xff\xfe"))
