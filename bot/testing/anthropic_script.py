"""What the fake Messages API answers with: scripted replies, errors, and injected faults.

:class:`Reply`, :class:`ToolUse`, :class:`HttpError` and :class:`StreamError`
are the script a test queues on :class:`bot.testing.anthropic.FakeAnthropic`;
:class:`FaultPlan` fails a share of calls (shared with the OpenAI fake), and
:func:`busiest` counts request rates from arrival times.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "FAULT_KINDS",
    "FaultKind",
    "FaultPlan",
    "HttpError",
    "Reply",
    "StreamError",
    "ToolUse",
    "busiest",
]


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A ``tool_use`` block the fake model emits.

    ``input`` is streamed as ``input_json_delta`` fragments; pass a string to
    send raw (possibly invalid) JSON text instead of a serialised dict.
    """

    name: str
    input: Mapping[str, Any] | str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """One successful answer: text (``str``) and ``ToolUse`` blocks in order.

    A text block given as a list of strings is streamed as exactly those
    deltas; a plain string is split into word-sized deltas. ``chunk_delay``
    sleeps before every SSE event, so a test can cancel mid-stream.
    ``input_tokens``: the uncached input tokens to report; ``None`` estimates
    them from the request (the cache's read and written tokens are always
    accounted, :mod:`bot.testing.anthropic_cache`).
    """

    blocks: Sequence[str | Sequence[str] | ToolUse]
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int = 7
    chunk_delay: float = 0.0
    ping: bool = True


@dataclass(frozen=True, slots=True)
class HttpError:
    """An HTTP error answer with the API's error envelope."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamError:
    """A stream that starts fine, emits ``text_before`` (if any), then an ``event: error``."""

    error_type: str
    message: str
    text_before: str = ""


FaultKind = Literal["overloaded", "server_error", "rate_limit", "stream_cut"]
"""A failure the fakes inject: 529 (503 for OpenAI), 500, 429 with
``retry-after``, or a stream cut after a few deltas with no error event."""

FAULT_KINDS: tuple[FaultKind, ...] = ("overloaded", "server_error", "rate_limit", "stream_cut")


@dataclass(slots=True)
class FaultPlan:
    """Which calls a fake fails, and how; shared by the Anthropic and OpenAI fakes.

    :meth:`inject` fails a random ``share`` of calls with one of ``kinds``;
    :meth:`start_outage` fails every call as overloaded until
    :meth:`end_outage` or a deadline. :attr:`served` lists the faults
    actually served, in order (``"outage"`` for outage answers).
    """

    share: float = 0.0
    kinds: tuple[FaultKind, ...] = FAULT_KINDS
    retry_after: float = 1.0
    """Seconds sent in the ``retry-after`` header of an injected 429."""
    cut_after: int = 2
    """Content deltas sent before an injected stream cut."""
    outage_until: float | None = None
    """:func:`time.monotonic` time the outage ends (``inf``: until :meth:`end_outage`)."""
    limit: int | None = None
    """How many more random faults may be served (``None``: no limit)."""
    served: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    def inject(
        self,
        share: float,
        *,
        kinds: Sequence[FaultKind] = FAULT_KINDS,
        retry_after: float = 1.0,
        cut_after: int = 2,
        limit: int | None = None,
        seed: int | None = None,
    ) -> None:
        """Fail a random ``share`` (0 to 1) of calls, each with one of ``kinds``.

        ``limit`` stops after that many faults: ``inject(1.0, kinds=("rate_limit",),
        limit=1)`` fails exactly the next call. ``seed`` makes the draw repeatable.
        """
        self.share = share
        self.kinds = tuple(kinds)
        self.retry_after = retry_after
        self.cut_after = cut_after
        self.limit = limit
        if seed is not None:
            self.rng.seed(seed)

    def start_outage(self, seconds: float | None = None) -> None:
        """Fail every call as overloaded for ``seconds``, or until :meth:`end_outage`."""
        self.outage_until = time.monotonic() + seconds if seconds is not None else float("inf")

    def end_outage(self) -> None:
        """Let calls through again."""
        self.outage_until = None

    def clear(self) -> None:
        """No more faults of any kind."""
        self.share = 0.0
        self.outage_until = None

    @property
    def in_outage(self) -> bool:
        """Whether a call arriving now would get the outage answer."""
        return self.outage_until is not None and time.monotonic() < self.outage_until

    def draw(self) -> FaultKind | Literal["outage"] | None:
        """The fault for the call arriving now (recorded in :attr:`served`), if any."""
        fault: FaultKind | Literal["outage"] | None = None
        if self.in_outage:
            fault = "outage"
        elif self.share > 0 and self.kinds and self.limit != 0 and self.rng.random() < self.share:
            fault = self.rng.choice(self.kinds)
            if self.limit is not None:
                self.limit -= 1
        if fault is not None:
            self.served.append(fault)
        return fault


def busiest(times: Sequence[float], window: float) -> int:
    """The most of ``times`` that fall in any half-open window ``[t, t + window)``."""
    ordered = sorted(times)
    most = start = 0
    for end, at in enumerate(ordered):
        while ordered[start] <= at - window:
            start += 1
        most = max(most, end - start + 1)
    return most
