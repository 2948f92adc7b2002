"""The suite's order under pytest-xdist (tests/ordering.py, the conftest's collection hook),
checked against the real worksteal scheduler's first hand-out."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from xdist.scheduler.worksteal import WorkStealingScheduling

from tests import conftest
from tests.ordering import deal, slice_sizes


@dataclass(eq=False)
class Node:
    """What the scheduler needs of a worker: it is sent test indexes."""

    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False
    gateway: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(id="gw"))

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def first_hand_out(ids: list[str], workers: int) -> list[list[str]]:
    """The test ids xdist's worksteal scheduler sends each idle worker first."""
    config: Any = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"])
    scheduler = WorkStealingScheduling(config)
    nodes = [Node() for _ in range(workers)]
    for node in nodes:
        scheduler.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        scheduler.add_node_collection(node, ids)  # type: ignore[arg-type]
    scheduler.schedule()
    return [[ids[i] for i in node.sent] for node in nodes]


@dataclass
class Item:
    """A collected test as the hook sees it: its id and markers."""

    nodeid: str
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


@pytest.mark.parametrize("count", [1, 7, 8, 2369])
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_slice_sizes_are_those_xdist_hands_out(count: int, workers: int) -> None:
    ids = [f"t{i}" for i in range(count)]
    assert [len(part) for part in first_hand_out(ids, workers)] == slice_sizes(count, workers)


def test_each_worker_gets_an_even_share_of_the_long_tests_longest_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 e2e tests at the end of the files, 2 known long ones, 400 short ones.
    known = {"test_a.py::long1": 40.0, "test_a.py::long2": 30.0}
    items = [Item(f"test_a.py::short{i}") for i in range(400)]
    items[10:10] = [Item("test_a.py::long1"), Item("test_a.py::long2")]
    items += [Item(f"test_z.py::e2e{i}", ("e2e",)) for i in range(12)]
    config: Any = SimpleNamespace(workerinput={"workercount": 4})
    monkeypatch.setattr(conftest, "known_durations", lambda: known)
    conftest.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    assert sorted(i.nodeid for i in items) == sorted(
        [f"test_a.py::short{i}" for i in range(400)] + list(known)
        + [f"test_z.py::e2e{i}" for i in range(12)])

    def seconds(nodeid: str) -> float:
        return known.get(nodeid, 10.0 if "e2e" in nodeid else 0.1)

    parts = first_hand_out([i.nodeid for i in items], 4)
    totals = [sum(seconds(n) for n in part) for part in parts]
    assert max(totals) - min(totals) < 10.5, totals  # about one e2e test apart at most
    for part in parts:  # the short tests at the end, where other workers steal from
        times = [seconds(n) for n in part]
        assert times == sorted(times, reverse=True)
    assert {parts[0][0], parts[1][0]} == set(known)
    # The short tests keep their file order, one contiguous run per worker.
    shorts = [n for part in parts for n in part if n.split("::")[1].startswith("short")]
    assert shorts == [f"test_a.py::short{i}" for i in range(400)]


def test_without_workers_the_order_is_the_file_order_e2e_then_slow_first() -> None:
    items = [Item("a"), Item("b", ("slow",)), Item("c"), Item("d", ("e2e",))]
    conftest.pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["d", "b", "a", "c"]


def test_deal_is_the_same_for_the_same_input() -> None:
    items = [(f"t{i}", float(i % 7)) for i in range(50)]
    first = deal(items, lambda i: i[1], 3)
    assert first == deal(list(items), lambda i: i[1], 3)
    assert sorted(first) == sorted(items)


def test_a_group_goes_to_one_slice_whole_and_nothing_is_lost() -> None:
    items = [f"b{n}" for n in range(6)] + [f"long{n}" for n in range(4)] + \
        [f"s{n}" for n in range(30)]
    seconds = {**{f"b{n}": 10.0 for n in range(6)}, **{f"long{n}": 30.0 for n in range(4)}}
    order = deal(items, lambda i: seconds.get(i, 0.1), 4,
                 group=lambda i: "browser" if i.startswith("b") else None)
    assert sorted(order) == sorted(items)
    sizes = slice_sizes(len(items), 4)
    starts = [sum(sizes[:n]) for n in range(4)]
    slices = [order[start:start + size] for start, size in zip(starts, sizes, strict=True)]
    holding = [n for n, part in enumerate(slices) if any(i.startswith("b") for i in part)]
    assert len(holding) == 1
    assert sum(i.startswith("b") for i in slices[holding[0]]) == 6
