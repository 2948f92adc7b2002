"""Large and hostile HTML pages for the web_fetch tests and benchmark.

:func:`article` is a long article the way large real pages are built (an inline
script and style, a navigation bar, thousands of paragraphs with links and
references, tables); :func:`dense` packs as many small elements as fit (the most
tree per byte); :func:`nested` opens ``depth`` elements inside each other.
"""

from __future__ import annotations

import random

__all__ = ["article", "dense", "nested"]

_WORDS = ("roost", "perch", "chicken", "night", "predator", "feather", "winter", "nest",
          "box", "height", "smooth", "round", "wide", "toes", "cover", "bird", "sleep",
          "ground", "safe", "ancestor")


def article(size: int = 3_900_000, *, seed: int = 1) -> str:
    """An article page of about ``size`` characters (ASCII)."""
    rng = random.Random(seed)

    def sentence(words: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."

    parts = ["<!doctype html><html><head><title>Everything about roosts</title><style>",
             "p.text { color: #333; margin: 0 0 1em }\n" * 500, "</style><script>",
             "window.trackers.push({id: 'secret-tracker-id'});\n" * 5_000,
             "</script></head><body><nav>",
             *(f'<a class="nav-link item-{i}" href="/n/{i}">Link {i}</a> ' for i in range(500)),
             '</nav><div id="content" class="mw-body"><article><h1>Everything about roosts</h1>']
    length = sum(map(len, parts))
    i = 0
    while length < size - 2_000:
        i += 1
        chunk = ""
        if i % 20 == 0:
            chunk += f'<h2 id="s{i}">Section {i}</h2>'
        if i % 50 == 0:
            chunk += ('<table class="wikitable"><tr><th>kind</th><th>count</th></tr>'
                      + "".join(f'<tr><td class="c">{rng.choice(_WORDS)}</td><td><span '
                                f'class="n">{j}</span></td></tr>' for j in range(20))
                      + "</table>")
        chunk += (f'<div class="para-wrap"><p class="text" data-i="{i}">Paragraph {i}. '
                  f'{sentence(25)} <a href="/wiki/{rng.choice(_WORDS)}_{i}" title="more">'
                  f'{rng.choice(_WORDS)}</a> <span class="ref"><sup>[{i}]</sup></span> '
                  f"{sentence(20)}</p></div>")
        parts.append(chunk)
        length += len(chunk)
    parts.append("</article></div><footer>Copyright 2026 Poultry Weekly.</footer></body></html>")
    return "".join(parts)


def dense(size: int = 3_900_000) -> str:
    """A page of about ``size`` characters made of tiny elements."""
    unit = "<div><span>a</span><b>b</b></div>"
    return ("<html><head><title>Dense</title></head><body>" + unit * (size // len(unit))
            + "</body></html>")


def nested(depth: int = 100_000) -> str:
    """A page with ``depth`` ``div`` elements each inside the one before."""
    return "<html><body>" + "<div>" * depth + "deep" + "</div>" * depth + "</body></html>"
