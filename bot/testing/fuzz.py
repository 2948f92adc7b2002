"""Mutation fuzzing of platform payloads: take a real-shaped payload, break it, send it.

A :class:`Mutation` picks one node of a JSON-like payload (dicts, lists and
scalars; node 0 is the whole payload) and deletes it, replaces it with a
hostile value, adds an unknown field or element to it, or wraps it in a list
or an object. A :class:`Mutator` holds the hostile values a test splices in
and applies mutations; with Hypothesis installed, :meth:`Mutator.strategy`
draws them::

    mutator = Mutator([None, -1, "", "\\ud83d", MEGABYTE, DEEP, HUGE])

    @given(changes=st.lists(mutator.strategy(), max_size=3))
    async def test_survives(changes):
        payload = copy.deepcopy(REAL_PAYLOAD)
        for change in changes:
            payload = mutator.apply(payload, change)
        await fake.post_body(as_json(payload))

Values a Python object cannot hold are stand-ins that :func:`as_json` turns
into text: :data:`DEEP` becomes an array nested :data:`NESTING` levels deep,
:data:`HUGE` a number of 5,000 digits.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["DEEP", "HOSTILE_VALUES", "HUGE", "MEGABYTE", "NESTING", "OPERATIONS", "Mutation",
           "Mutator", "as_json", "node_index", "nodes"]

DEEP = "\x01roost-deep\x01"
"""Stands for a value nested :data:`NESTING` levels deep (spliced into the JSON text)."""
NESTING = 100_000
HUGE = "\x01roost-huge\x01"
"""Stands for a number of 5,000 digits, more than Python's ``int()`` converts."""
MEGABYTE = "A" * 2**20
OPERATIONS = ("delete", "replace", "add", "wrap")
HOSTILE_VALUES: list[Any] = [
    None, True, False, 0, -1, 1.5, -(2**63), 2**64, 2**64 + 1, -(10**40), 10**300,
    "", "x", "\x00", "nul\x00in\x00between", "\ud83d", "lone \udc00 low", MEGABYTE,
    "9" * 40, "-5", "1.5", "😀" * 10_000, [], [1, "a", None], {}, {"id": "1"},
    {"a": {"b": {"c": []}}}, DEEP, [DEEP], {"type": DEEP},
]
"""Values no payload field should hold: wrong types, edge numbers, NULs, lone surrogates,
a megabyte, deep nesting. Platform tests add their own (command and mention syntax)."""


@dataclass(frozen=True)
class Mutation:
    """One change to a payload; it names its value by index so reports stay short."""

    node: int
    """Which node (modulo the number of nodes; 0 is the whole payload)."""
    operation: str
    """One of :data:`OPERATIONS`."""
    value: int
    """Index into the :class:`Mutator`'s values."""


def nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value``, the root (``()``) first, depth first."""
    yield path
    if isinstance(value, dict):
        for key in value:
            yield from nodes(value[key], (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from nodes(item, (*path, index))


def node_index(payload: Any, *path: str | int) -> int:
    """The :attr:`Mutation.node` that picks ``path`` in ``payload`` (for explicit examples)."""
    return list(nodes(payload)).index(path)


class Mutator:
    """Applies :class:`Mutation` s whose values are taken from ``values``."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = list(values)

    def strategy(self, max_node: int = 500) -> SearchStrategy[Mutation]:
        """A Hypothesis strategy for mutations of payloads of up to ``max_node`` nodes."""
        from hypothesis import strategies as st  # only fuzz tests need Hypothesis

        return st.builds(Mutation, st.integers(0, max_node), st.sampled_from(OPERATIONS),
                         st.integers(0, len(self.values) - 1))

    def replacing(self, payload: Any, value: Any, *path: str | int) -> Mutation:
        """The mutation that sets the node at ``path`` of ``payload`` to ``value``."""
        return Mutation(node_index(payload, *path), "replace", self.values.index(value))

    def apply(self, payload: Any, mutation: Mutation) -> Any:
        """``payload`` with ``mutation`` applied, in place (the root may be replaced)."""
        paths = list(nodes(payload))
        path = paths[mutation.node % len(paths)]
        value = copy.deepcopy(self.values[mutation.value])
        unknown = f"unknown_field_{mutation.value}"
        if not path:
            if mutation.operation == "add" and isinstance(payload, dict):
                payload[unknown] = value
                return payload
            return [payload] if mutation.operation == "wrap" else value
        parent = payload
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if mutation.operation == "delete":
            del parent[last]
        elif mutation.operation == "replace":
            parent[last] = value
        elif mutation.operation == "wrap":
            parent[last] = {"value": parent[last]} if mutation.value % 2 else [parent[last]]
        elif isinstance(parent[last], dict):
            parent[last][unknown] = value
        elif isinstance(parent[last], list):
            parent[last].append(value)
        elif isinstance(parent, dict):
            parent[unknown] = value
        else:
            parent.append(value)
        return payload


def as_json(payload: Any) -> str:
    """JSON text as a platform sends it: ASCII, lone surrogates as ``\\ud83d`` escapes.

    :data:`DEEP` and :data:`HUGE` are replaced by what they stand for.
    """
    text = json.dumps(payload)
    return (text.replace(json.dumps(DEEP), "[" * NESTING + "]" * NESTING)
            .replace(json.dumps(HUGE), "9" * 5000))
