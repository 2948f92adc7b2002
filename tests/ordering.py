"""The order the suite runs in under pytest-xdist: the long tests spread over the workers,
each worker starting with its longest.

``--dist worksteal`` first hands each worker one contiguous slice of the collected tests
(the first quarter to the first of four workers, and so on); an idle worker later steals
the back half of the longest queue left. Sorted longest first, every long test would sit
in the first worker's slice and run one after another there while the others ran short
ones. :func:`deal` orders the tests so that each slice holds an even share of the long
tests, longest first, and ends with short ones in file order, which other workers steal.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each test of one second or more took in a recorded run (``--store-durations``)."""

E2E_SECONDS = 10.0
"""The expected time of an ``e2e`` test the recorded run does not know."""
SLOW_SECONDS = 5.0
"""...of a ``slow`` one."""
OTHER_SECONDS = 0.1
"""...of any other."""


def known_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The recorded durations by test id; empty when there is no record."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def slice_sizes(count: int, workers: int) -> list[int]:
    """How many of ``count`` tests pytest-xdist's worksteal scheduler first sends to each
    of ``workers`` idle workers, in order (``len(pending) // workers_remaining``)."""
    sizes = []
    for i in range(workers):
        size = count // (workers - i)
        sizes.append(size)
        count -= size
    return sizes


def deal(items: Sequence[T], seconds: Callable[[T], float], workers: int,
         short: float = OTHER_SECONDS,
         group: Callable[[T], str | None] = lambda item: None) -> list[T]:
    """``items`` reordered into ``workers`` consecutive slices of pytest-xdist's sizes: the
    tests expected to take longer than ``short`` spread evenly over the slices, longest
    first in each, then the short ones in their file order, a contiguous run per slice
    (tests of one module stay mostly on one worker, as without this order).

    Longest first, each long test goes to the slice with the least time so far that still
    has room. Tests of one ``group`` (not ``None``: they share a costly fixture, such as a
    browser) go to one slice together, as one long test of their summed time. The order
    depends on nothing but ``items``, ``seconds`` and ``group``, so every worker computes
    the same one, as xdist requires.
    """
    if workers <= 1:
        return sorted(items, key=seconds, reverse=True)
    sizes = slice_sizes(len(items), workers)
    slices: list[list[T]] = [[] for _ in sizes]
    load = [0.0] * workers
    blocks: dict[str, list[T]] = {}
    units: list[list[T]] = []
    for item in items:
        name = group(item)
        if name is None:
            if seconds(item) > short:
                units.append([item])
        elif name in blocks:
            blocks[name].append(item)
        else:
            blocks[name] = [item]
            units.append(blocks[name])
    dealt = {id(item) for unit in units for item in unit}

    def total(unit: list[T]) -> float:
        return sum(seconds(item) for item in unit)

    for unit in sorted(units, key=total, reverse=True):  # a stable sort: ties keep file order
        open_ = [i for i in range(workers) if len(slices[i]) + len(unit) <= sizes[i]] \
            or [i for i in range(workers) if len(slices[i]) < sizes[i]]
        target = min(open_, key=lambda i: (load[i], i))
        slices[target].extend(unit)
        load[target] += total(unit)
    rest = iter([i for i in items if id(i) not in dealt])
    for part, size in zip(slices, sizes, strict=True):
        part.extend(itertools.islice(rest, max(0, size - len(part))))
    slices[-1].extend(rest)  # what a group too big for its slice pushed out
    return [item for part in slices for item in part]
