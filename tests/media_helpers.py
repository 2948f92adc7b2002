"""Files for media tests: real JPEG/PNG/PDF/Ogg bytes made on the spot (no binary fixtures)."""

from __future__ import annotations

import functools
import io
import struct
import zlib

from PIL import ExifTags, Image


def jpeg(width: int = 1280, height: int = 960, *, gps: bool = False, orientation: int = 1,
         quality: int = 85, color: tuple[int, int, int] = (180, 40, 40)) -> bytes:
    """A JPEG photo, optionally with a GPS position and an EXIF orientation, as phones write."""
    img = Image.new("RGB", (width, height), color)
    # Some structure, so the encoder has real work (a flat image compresses to nothing).
    for x in range(0, width, max(1, width // 16)):
        img.paste((x % 255, 90, 200), (x, 0, min(width, x + 4), height))
    exif = Image.Exif()
    if orientation != 1:
        exif[ExifTags.Base.Orientation] = orientation
    if gps:
        exif[ExifTags.Base.Make] = "PhoneCo"
        info = exif.get_ifd(ExifTags.IFD.GPSInfo)
        info[ExifTags.GPS.GPSLatitudeRef] = "N"
        info[ExifTags.GPS.GPSLatitude] = (48.0, 51.0, 24.0)
        info[ExifTags.GPS.GPSLongitudeRef] = "E"
        info[ExifTags.GPS.GPSLongitude] = (2.0, 21.0, 3.0)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality, exif=exif.tobytes() if len(exif) else b"")
    return buf.getvalue()


def png(width: int = 64, height: int = 48, *, alpha: bool = False) -> bytes:
    """A small PNG screenshot (no metadata)."""
    img = Image.new("RGBA" if alpha else "RGB", (width, height),
                    (10, 120, 200, 128) if alpha else (10, 120, 200))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


@functools.cache
def png_bomb(side: int = 30_000) -> bytes:
    """A valid 1-bit PNG of ``side``×``side`` pixels (900 megapixels) in a few hundred KB."""
    row = b"\x00" + bytes((side + 7) // 8)
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", body)
            + _chunk(b"IEND", b""))


def pdf(pages: int = 2, text: str = "Total: 42.00 EUR") -> bytes:
    """A PDF with ``pages`` pages of text (pypdf writes it)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                             NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    font_ref = writer._add_object(font)
    for number in range(pages):
        page = writer.add_blank_page(width=300, height=200)
        stream = DecodedStreamObject()
        stream.set_data(f"BT /F1 12 Tf 20 100 Td ({text} p{number + 1}) Tj ET".encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject(
            {NameObject("/F1"): font_ref})})
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def ogg_opus(seconds: float = 12.0) -> bytes:
    """The framing of an Ogg Opus voice note: OpusHead page, then a last page at ``seconds``."""
    def page(granule: int, body: bytes, seq: int) -> bytes:
        header = (b"OggS" + bytes([0, 0]) + struct.pack("<q", granule)
                  + struct.pack("<I", 1234) + struct.pack("<I", seq) + b"\x00\x00\x00\x00"
                  + bytes([1, len(body)]))
        return header + body

    head = b"OpusHead" + bytes([1, 1]) + struct.pack("<H", 312) + struct.pack("<I", 48_000) \
        + b"\x00\x00\x00"
    return page(0, head, 0) + page(0, b"OpusTags" + bytes(20), 1) \
        + page(int(seconds * 48_000), bytes(200), 2)
