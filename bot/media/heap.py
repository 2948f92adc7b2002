"""Where the buffers of photo preparation live, and when they go back to the system.

glibc keeps freed memory in the arena of the thread that allocated it, and
``malloc_trim`` does not hand back the *top* of the per-thread arenas, so what
stays resident after photos must not depend on which thread decoded them
(bench/README.md, the photo notes, has the figures). So:

- every photo is prepared on one thread (:func:`on_media_thread`): its
  buffers come from one arena, whichever thread asked;
- the thresholds are fixed at the first photo (:data:`MMAP_THRESHOLD`,
  :data:`KEEP_TOP`) instead of moving with what was freed last;
- while photos come in, Pillow keeps :data:`BUFFER_BLOCKS` freed image buffers
  for the next photo and nothing is trimmed (memory handed back costs page
  faults when used again); once no photo was prepared for a while,
  :func:`release_memory` runs on the media thread: Pillow's blocks are freed,
  the media thread's arena top is trimmed, then ``malloc_trim`` returns the rest.

Off glibc the thread and Pillow's cache still apply; the allocator calls do not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

log = logging.getLogger("roost.media.heap")

P = ParamSpec("P")
T = TypeVar("T")

BUFFER_BLOCKS = 4
"""Pillow image buffers kept for reuse while photos come in: a photo needs three (the
draft decode, the resize pass, the result)."""
MMAP_THRESHOLD = 16 * 1024 * 1024
"""Allocations from this size on get their own mapping (returned when freed). Fixed, so
glibc does not raise it after a large free; Pillow's buffers (16 MB blocks at most)
stay below it and are reused from the arena while photos come in."""
KEEP_TOP = 32 * 1024 * 1024
"""Free memory an arena's top may hold before a free hands it back (twice the mmap
threshold, as glibc sets it when it raises that threshold itself): photo bursts reuse
it; :func:`release_memory` trims it."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_PROBE_BYTES = 96 * 1024
"""A free of at least 64 KB makes glibc check the trim threshold of the chunk's arena
(``heap_trim``); under the mmap threshold, so it comes from the arena."""


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
    except (OSError, AttributeError):
        return None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


_libc = _glibc()
_malloc_trim: Callable[[int], int] | None = _libc.malloc_trim if _libc is not None else None
_mallopt: Callable[[int, int], int] | None = _libc.mallopt if _libc is not None else None

_media_thread: list[int] = []
_BUSY = float("-inf")


def _note_thread() -> None:
    _media_thread.append(threading.get_ident())


# Started by the first photo: a process that never gets one has no such thread.
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="roost-media",
                               initializer=_note_thread)


def on_media_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` run on the media thread, waiting for it (directly when
    already there). Blocks the caller: call it from a worker thread, not the event loop."""
    if threading.get_ident() in _media_thread:
        return fn(*args, **kwargs)
    return _executor.submit(fn, *args, **kwargs).result()


def _trim_this_arena() -> None:
    """Hand back the top of the calling thread's arena (``malloc_trim`` does not)."""
    if _libc is None or _mallopt is None:
        return
    _mallopt(_M_TRIM_THRESHOLD, 0)
    try:
        probe = _libc.malloc(_PROBE_BYTES)
        if probe:
            _libc.free(probe)
    finally:
        _mallopt(_M_TRIM_THRESHOLD, KEEP_TOP)


def release_memory() -> None:
    """Give the buffers kept for photos and the C heap's free pages back to the system.

    Runs on the media thread (so the arena trimmed first is the one photos
    use): Pillow's kept blocks are freed, that arena's top is trimmed, then
    ``malloc_trim`` gives back the free pages of every arena and the main arena's top.
    """
    from PIL import _imaging as pillow_core

    from bot.media.derived import forget_handed

    forget_handed()
    pillow_core.clear_cache()
    _trim_this_arena()
    if _malloc_trim is not None:
        _malloc_trim(0)


class Heap:
    """When the buffers photos need are kept, and when they go back to the system.

    :meth:`keep` before a photo is prepared cancels a pending release; after a
    model call with a newly prepared file, :meth:`release` schedules
    :func:`release_memory` ``delay`` seconds later (on the media thread: a
    photo prepared meanwhile waits for it, or it for the photo). One thread,
    started by the first release, keeps the time (not a timer thread per photo).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._due: float | None = None
        """When the release is due (monotonic seconds); ``None``: none is scheduled."""
        self._sleeping_until: float | None = _BUSY
        """When the release thread wakes by itself (``None``: only when woken; ``_BUSY``:
        it is not waiting, and looks at ``_due`` before it does)."""
        self._thread: threading.Thread | None = None
        self._kept = False

    def keep(self) -> None:
        """Before a photo is prepared: keep freed buffers for the next one."""
        with self._lock:
            # Not woken: finding nothing due when its time comes, the thread sleeps on.
            self._due = None
            if not self._kept:
                from PIL import _imaging as pillow_core

                self._kept = True
                if pillow_core.get_blocks_max() < BUFFER_BLOCKS:
                    pillow_core.set_blocks_max(BUFFER_BLOCKS)
                if _mallopt is not None:
                    _mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                    _mallopt(_M_TRIM_THRESHOLD, KEEP_TOP)

    def release(self, delay: float) -> None:
        """Hand the buffers back ``delay`` seconds from now (0: at once)."""
        if delay <= 0:
            with self._lock:
                self._due = None
            on_media_thread(release_memory)
            return
        with self._lock:
            due = time.monotonic() + delay
            self._due = due
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="roost-media-release",
                                                daemon=True)
                self._thread.start()
            elif self._sleeping_until is None or self._sleeping_until > due:
                self._wake.notify()

    def pending(self) -> bool:
        """Whether a release is scheduled."""
        with self._lock:
            return self._due is not None

    def _run(self) -> None:
        with self._lock:
            while True:
                due = self._due
                if due is None:
                    self._sleeping_until = None
                    self._wake.wait()
                    self._sleeping_until = _BUSY
                    continue
                left = due - time.monotonic()
                if left > 0:
                    self._sleeping_until = due
                    self._wake.wait(left)
                    self._sleeping_until = _BUSY
                    continue
                self._due = None
                self._lock.release()
                try:
                    on_media_thread(release_memory)
                except RuntimeError:  # the interpreter is shutting down: nothing to hand back
                    log.debug("media memory not released: shutting down")
                    return
                finally:
                    self._lock.acquire()


heap = Heap()
