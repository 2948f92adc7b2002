"""What a plugin reports about the part of the service it vouches for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HealthReport:
    """One part's health for ``/readyz`` and ``/status``: ``part`` names it, ``ready`` says
    whether it works as promised, ``detail`` says how in a few words (never a credential).

    A part that is not ready makes ``/readyz`` answer 503 with ``part: detail``;
    ``/status`` shows every part, ready or not.
    """

    part: str
    ready: bool
    detail: str = ""
