"""What the operations pages (usage, access, outbox, jobs, plugins) share: reading a
form's fields, one-line answers, and the geometry of the usage charts.

Charts are inline SVG drawn from attributes only (the UI's Content-Security-Policy
allows no inline style), so they need neither script nor a chart library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from markupsafe import Markup, escape

from bot.ui.kit import secure_headers

CHART_WIDTH = 720
CHART_HEIGHT = 120
MAX_FIELD = 300
"""Characters a form field naming a row may have (a code, an id, a user, a plugin)."""


def plain(status: int, line: str) -> web.Response:
    """A one-line text answer (a bad cursor, a malformed form) with the security headers."""
    response = web.Response(status=status, text=f"{line}\n")
    secure_headers(response)
    return response


def field(form: dict[str, str], name: str) -> str | None:
    """The form field ``name`` stripped, or ``None`` when missing, empty or too long."""
    value = form.get(name, "").strip()
    if not value or len(value) > MAX_FIELD or not value.isprintable():
        return None
    return value


def number(text: str | None) -> int | None:
    """A positive row id, or ``None``."""
    if text is None or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar of a chart: where it is drawn, and its label (the day and the value)."""

    x: float
    y: float
    width: float
    height: float
    label: str


def bars(values: Sequence[tuple[str, float]], *, width: int = CHART_WIDTH,
         height: int = CHART_HEIGHT) -> list[Bar]:
    """Bars for ``(label, value)`` pairs scaled to the largest value (0: flat)."""
    if not values:
        return []
    peak = max(v for _, v in values) or 1.0
    step = width / len(values)
    gap = min(2.0, step / 4)
    return [Bar(round(i * step + gap / 2, 2), round(height - height * v / peak, 2),
                round(step - gap, 2), round(height * v / peak, 2), label)
            for i, (label, v) in enumerate(values)]


def svg_bars(values: Sequence[tuple[str, float]], *, width: int = CHART_WIDTH,
             height: int = CHART_HEIGHT) -> Markup:
    """The ``<rect>`` elements of :func:`bars`, each titled with its label (escaped here:
    a year of bars is built once, not escaped value by value in the template)."""
    return Markup("".join(
        f'<rect x="{b.x:g}" y="{b.y:g}" width="{b.width:g}" height="{b.height:g}"'
        f' fill="currentColor"><title>{escape(b.label)}</title></rect>'
        for b in bars(values, width=width, height=height)))
