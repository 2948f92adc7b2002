"""What a file is, from its bytes: the platform's declared MIME type is not trusted.

Signatures cover what people send in chats (photos, screenshots, PDFs, voice
notes, audio, video, archives, text). When the bytes say only "some text" or
"a ZIP container", a compatible declared type (``text/csv``, a ``.docx``)
refines it; a declared type the bytes contradict is ignored.
"""

from __future__ import annotations

import mimetypes

OCTET = "application/octet-stream"

_OOXML = {
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".odt": "application/vnd.oasis.opendocument.text",
    ".ods": "application/vnd.oasis.opendocument.spreadsheet",
    ".epub": "application/epub+zip",
    ".jar": "application/java-archive",
    ".apk": "application/vnd.android.package-archive",
}

_FTYP = {
    # ISO base media brands (bytes 8..12 of an ``ftyp`` box).
    b"M4A ": "audio/mp4", b"M4B ": "audio/mp4", b"M4P ": "audio/mp4",
    b"qt  ": "video/quicktime",
    b"heic": "image/heic", b"heix": "image/heic", b"mif1": "image/heif", b"msf1": "image/heif",
    b"avif": "image/avif", b"avis": "image/avif",
    b"3gp4": "video/3gpp", b"3gp5": "video/3gpp", b"3g2a": "video/3gpp2",
}


def sniff_mime(data: bytes, declared: str = "", name: str = "") -> str:
    """The MIME type of ``data`` judged by its content.

    ``declared`` (the platform's claim) and ``name`` (its extension) only refine
    a generic answer (plain text, a ZIP container, unknown bytes); they never
    override a signature. Unknown binary data is ``application/octet-stream``.
    """
    found = _by_signature(data)
    declared = declared.split(";", 1)[0].strip().lower()
    guessed = _by_name(name)
    if found == "application/zip":
        for claim in (declared, guessed):
            if claim and claim in _OOXML.values():
                return claim
        return found
    if found == "text/plain":
        for claim in (declared, guessed):
            if claim and _is_text_type(claim):
                return claim
        return found
    return found or OCTET


def _by_signature(data: bytes) -> str:
    head = data[:64]
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio/wav"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "video/x-msvideo"
    if head.startswith(b"%PDF-"):
        return "application/pdf"
    if head.startswith(b"OggS"):
        # Voice notes (Telegram, WhatsApp exports) are Opus in Ogg; Theora is video.
        return "video/ogg" if b"\x80theora" in data[:256] else "audio/ogg"
    if head.startswith(b"fLaC"):
        return "audio/flac"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
                                   and head[1] & 0x06 != 0):
        # An ID3 tag, or an MPEG audio frame sync (layer bits set: not an ADTS stream).
        return "audio/mpeg"
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:
        return "audio/aac"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in _FTYP:
            return _FTYP[brand]
        return "video/mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "video/x-matroska" if b"matroska" in data[:64] else "video/webm"
    if head.startswith(b"BM") and len(data) > 14:
        return "image/bmp"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "image/tiff"
    if head.startswith(b"\x00\x00\x01\x00"):
        return "image/x-icon"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "application/zip"
    if head.startswith(b"\x1f\x8b"):
        return "application/gzip"
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        return "application/x-7z-compressed"
    if head.startswith(b"Rar!\x1a\x07"):
        return "application/vnd.rar"
    if head.startswith(b"\x7fELF"):
        return "application/x-executable"
    if head.startswith(b"MZ"):
        return "application/x-msdownload"
    if _looks_like_text(data):
        stripped = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
        if stripped.startswith((b"<svg", b"<?xml")) and b"<svg" in data[:4096].lower():
            return "image/svg+xml"
        return "text/plain"
    return ""


def _looks_like_text(data: bytes) -> bool:
    sample = data[:8192]
    if not sample or b"\x00" in sample:
        return False
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the sample's end is still text.
        if exc.start < len(sample) - 3:
            return False
    return True


def _by_name(name: str) -> str:
    if not name or "." not in name:
        return ""
    ext = "." + name.rsplit(".", 1)[1].lower()
    return _OOXML.get(ext) or mimetypes.types_map.get(ext, "")


def _is_text_type(mime: str) -> bool:
    return mime.startswith("text/") or mime in {
        "application/json", "application/xml", "application/x-yaml", "application/yaml",
        "application/javascript", "application/x-python", "application/toml",
        "application/x-sh", "application/sql", "application/x-ndjson",
    }


def extension_for(mime: str) -> str:
    """The usual extension for ``mime`` (``.jpg`` for ``image/jpeg``), ``""`` if none."""
    special = {"image/jpeg": ".jpg", "audio/ogg": ".ogg", "audio/mpeg": ".mp3",
               "audio/mp4": ".m4a", "text/plain": ".txt", "video/quicktime": ".mov",
               "image/heic": ".heic", "image/heif": ".heif", "image/avif": ".avif",
               "image/webp": ".webp", "audio/wav": ".wav", "audio/flac": ".flac",
               "video/webm": ".webm", "application/gzip": ".gz"}
    if mime in special:
        return special[mime]
    for ext, value in _OOXML.items():
        if value == mime:
            return ext
    return mimetypes.guess_extension(mime) or ""
