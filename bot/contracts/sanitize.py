"""Output sanitizers: the plugin contract and the pipeline runner."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sanitizer:
    """A text transform applied to every final reply, lowest ``order`` first."""

    name: str
    func: Callable[[str], str]
    order: int = 500


def run_pipeline(text: str, sanitizers: Iterable[Sanitizer]) -> str:
    """Apply ``sanitizers`` in order and trim the result."""
    for s in sorted(sanitizers, key=lambda s: s.order):
        text = s.func(text)
    return text.strip()
