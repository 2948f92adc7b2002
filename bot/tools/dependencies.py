"""Which calls of a batch wait for which: a tool's ``requires`` as edges between calls.

A call waits for every other call of the same batch whose tool it requires;
edges that would close a cycle are dropped, so no call ever waits for itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.contracts.llm import ToolCall
from bot.contracts.tools import Tool

__all__ = ["requirements"]


def requirements(calls: Sequence[ToolCall], tools: Mapping[str, Tool]) -> list[list[int]]:
    """For each call, the calls of the batch it must wait for (cycles broken)."""
    edges: list[list[int]] = []
    for i, call in enumerate(calls):
        tool = tools.get(call.name)
        needs = set(tool.requires) if tool is not None else set()
        edges.append([j for j, other in enumerate(calls) if j != i and other.name in needs])
    # Drop the edges that close a cycle, so no call waits for itself.
    colour = [0] * len(calls)  # 0 new, 1 on the current path, 2 finished

    def visit(i: int) -> None:
        colour[i] = 1
        for j in list(edges[i]):
            if colour[j] == 1:
                edges[i].remove(j)
            elif colour[j] == 0:
                visit(j)
        colour[i] = 2

    for i in range(len(calls)):
        if colour[i] == 0:
            visit(i)
    return edges
