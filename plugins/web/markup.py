"""A page's HTML cut down, in one streaming pass, to what the extractors may parse.

The extractors (trafilatura on lxml, markdownify on BeautifulSoup) build a tree
of the whole page, about a kilobyte per element, and recurse once per level of
nesting. :func:`reduce_html` feeds the page to the standard library's
incremental :class:`html.parser.HTMLParser` in chunks and writes well-formed
markup without scripts, styles, comments and other elements that carry no text
(``head`` and ``title`` included: the title is read apart), keeping only the
attributes the extractors read. It stops at :data:`MAX_ELEMENTS` elements or
:data:`MAX_MARKUP` characters (the model reads at most 100,000 characters of a
page anyway), and raises :class:`TooDeep` past :data:`MAX_DEPTH` levels, so
what is parsed after it is bounded in memory and in recursion depth.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser

__all__ = ["MAX_DEPTH", "MAX_ELEMENTS", "MAX_MARKUP", "Reduced", "TooDeep", "reduce_html"]

MAX_DEPTH = 200
"""Levels of nesting accepted (markdownify recurses three frames a level; Python
allows 1,000)."""
MAX_ELEMENTS = 15_000
"""Elements kept; the rest of the page is dropped."""
MAX_MARKUP = 600_000
"""Characters of reduced markup kept; the rest of the page is dropped."""

_CHUNK = 256 * 1024
_DROPPED = frozenset({"head", "title", "script", "style", "noscript", "template", "svg",
                      "iframe", "object", "link", "meta", "base"})
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr"})
_ATTRIBUTES = frozenset({"href", "id", "class", "role", "lang", "colspan", "rowspan", "alt",
                         "title"})
_MAX_ATTRIBUTE = 200
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# A start tag of one of these ends an open <p> (HTML's "close a p element").
_CLOSES_P = frozenset({"address", "article", "aside", "blockquote", "details", "div", "dl",
                       "fieldset", "figcaption", "figure", "footer", "header", "hr", "main",
                       "nav", "ol", "p", "pre", "section", "table", "ul", "li", "dd", "dt",
                       *_HEADINGS})
_P = frozenset({"p"})
_P_SCOPE = frozenset({"table", "td", "th", "caption", "button", "html", "marquee", "object",
                      "template"})
# For these start tags: the open elements they end, and where looking for one stops.
_SIBLINGS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "li": (frozenset({"li"}), frozenset({"ul", "ol", "menu", "table"})),
    "dt": (frozenset({"dt", "dd"}), frozenset({"dl", "table"})),
    "dd": (frozenset({"dt", "dd"}), frozenset({"dl", "table"})),
    "tr": (frozenset({"tr"}), frozenset({"table", "thead", "tbody", "tfoot"})),
    "td": (frozenset({"td", "th"}), frozenset({"tr", "table"})),
    "th": (frozenset({"td", "th"}), frozenset({"tr", "table"})),
    "option": (frozenset({"option"}), frozenset({"select", "datalist"})),
    "thead": (frozenset({"thead", "tbody", "tfoot"}), frozenset({"table"})),
    "tbody": (frozenset({"thead", "tbody", "tfoot"}), frozenset({"table"})),
    "tfoot": (frozenset({"thead", "tbody", "tfoot"}), frozenset({"table"})),
}


class TooDeep(ValueError):
    """The page nests elements deeper than :data:`MAX_DEPTH`."""


@dataclass(frozen=True, slots=True)
class Reduced:
    """The reduced markup, and whether the page went on past the limits."""

    markup: str
    truncated: bool


class _Full(Exception):
    """Raised inside the parser when a limit is reached: nothing more is read."""


class _Reducer(HTMLParser):
    def __init__(self, max_depth: int, max_elements: int, max_markup: int) -> None:
        super().__init__(convert_charrefs=True)
        self.max_depth = max_depth
        self.max_elements = max_elements
        self.max_markup = max_markup
        self.out: list[str] = []
        self.size = 0
        self.elements = 0
        self.stack: list[str] = []
        """The open elements, dropped ones included (the outermost first)."""
        self.skipping = 0
        """Stack depth at which a dropped element opened (0: not inside one)."""

    def _write(self, text: str) -> None:
        if self.skipping:
            return
        self.out.append(text)
        self.size += len(text)
        if self.size >= self.max_markup:
            raise _Full

    def _pop_to(self, index: int) -> None:
        """Close the open elements from ``index`` up (the innermost first)."""
        while len(self.stack) > index:
            tag = self.stack.pop()
            if self.skipping and len(self.stack) < self.skipping:
                self.skipping = 0  # the dropped element itself: its start was not written
            else:
                self._write(f"</{tag}>")

    def _open_index(self, tags: frozenset[str], scope: frozenset[str]) -> int:
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index] in tags:
                return index
            if self.stack[index] in scope:
                return -1
        return -1

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # The end tags HTML lets pages leave out, closed as a browser would.
        if tag in _CLOSES_P and (index := self._open_index(_P, _P_SCOPE)) >= 0:
            self._pop_to(index)
        sibling = _SIBLINGS.get(tag)
        if sibling is not None and (index := self._open_index(*sibling)) >= 0:
            self._pop_to(index)
        if tag in _HEADINGS and self.stack and self.stack[-1] in _HEADINGS:
            self._pop_to(len(self.stack) - 1)
        dropped = tag in _DROPPED or bool(self.skipping)
        if tag in _VOID:
            if not dropped:
                self._count()
                self._write(f"<{tag}{_attributes(attrs)}>")
            return
        if not dropped:
            self._count()  # before anything changes: it may end the reading
        self.stack.append(tag)
        if len(self.stack) > self.max_depth:
            raise TooDeep(f"its HTML nests elements more than {self.max_depth} levels deep")
        if dropped:
            self.skipping = self.skipping or len(self.stack)
            return
        self._write(f"<{tag}{_attributes(attrs)}>")

    def _count(self) -> None:
        self.elements += 1
        if self.elements > self.max_elements:
            raise _Full

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index] == tag:
                self._pop_to(index)
                return
        # An end tag of nothing open: browsers ignore it, and so does this.

    def handle_data(self, data: str) -> None:
        # Cut to the room left: one text can be the whole page (an unclosed comment is
        # text at the end, say).
        room = max(0, self.max_markup - self.size)
        self._write(html.escape(data[:room], quote=False)[:room])

    def finish(self) -> str:
        """The markup, every element still open closed."""
        self.max_markup = 1 << 62  # closing what is open adds a few bytes at most
        self._pop_to(0)
        return "".join(self.out)


def _attributes(attrs: Iterable[tuple[str, str | None]]) -> str:
    return "".join(f' {name}="{html.escape(value[:_MAX_ATTRIBUTE], quote=True)}"'
                   for name, value in attrs if name in _ATTRIBUTES and value is not None)


def reduce_html(page: str, *, max_depth: int = MAX_DEPTH, max_elements: int = MAX_ELEMENTS,
                max_markup: int = MAX_MARKUP) -> Reduced:
    """``page`` as bounded, well-formed markup for the extractors; raises :class:`TooDeep`."""
    reducer = _Reducer(max_depth, max_elements, max_markup)
    truncated = False
    try:
        for start in range(0, len(page), _CHUNK):
            reducer.feed(page[start:start + _CHUNK])
        reducer.close()
    except _Full:
        truncated = True
    return Reduced(reducer.finish(), truncated)
