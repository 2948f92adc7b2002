"""PDFs with pypdf: page count, and the text for models that cannot read PDFs."""

from __future__ import annotations

import io
import logging

from bot.contracts.media import MediaError

log = logging.getLogger("roost.media.documents")


def pdf_page_count(data: bytes) -> int:
    """How many pages the PDF in ``data`` has; raises :class:`MediaError` if unreadable."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        return len(PdfReader(io.BytesIO(data)).pages)
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise MediaError("the PDF cannot be read") from exc


def pdf_text(data: bytes, *, max_chars: int = 100_000) -> str:
    """The text of the PDF in ``data``, page by page, cut at ``max_chars``.

    Scanned pages have no text layer and contribute nothing. Raises
    :class:`MediaError` if the file is not a readable PDF.
    """
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        chunks: list[str] = []
        total = 0
        for number, page in enumerate(reader.pages, 1):
            text = (page.extract_text() or "").strip()
            if text:
                chunk = f"[page {number}]\n{text}"
                chunks.append(chunk)
                total += len(chunk)
                if total >= max_chars:
                    break
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise MediaError("the PDF cannot be read") from exc
    return "\n\n".join(chunks)[:max_chars]
