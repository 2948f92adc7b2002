"""Work an adapter has under way: platform calls in flight and background tasks.

:class:`InFlight` counts the calls of replies being sent, so ``stop()`` can
let them finish, and owns the adapter's background tasks, so ``stop()`` can
cancel them all.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class InFlight:
    """The calls in flight (counted) and the background tasks (owned) of one adapter."""

    def __init__(self) -> None:
        self.count = 0
        """Calls in flight now."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Count the block as a call in flight."""
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if not self.count:
                self._idle.set()

    async def tracked(self, call: Awaitable[T]) -> T:
        """``await call``, counted as a call in flight."""
        with self.busy():
            return await call

    async def wait_idle(self, grace: float) -> bool:
        """Wait up to ``grace`` seconds for the calls in flight; whether they all ended."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            return False
        return True

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in a task of its own until it ends or :meth:`cancel_tasks`."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel_tasks(self) -> None:
        """Cancel every background task and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
