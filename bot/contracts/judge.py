"""The judge contract: a :class:`Judge` scores a reply with a :class:`Verdict`.

Also the aggregation strategies and the defaults of self-correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

Strategy = Literal["mean", "median", "min", "max", "weighted", "vote"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
"""``mean``/``median``/``min``/``max``/``weighted`` (by judge weight) combine the
scores and pass at ``score >= threshold``; ``vote`` scores the share of judges at
or above the threshold and passes when that share is above one half."""

DEFAULT_THRESHOLD = 0.7
DEFAULT_MAX_RETRIES = 3
MAX_RETRIES_RANGE = (1, 10)

@dataclass(frozen=True, slots=True)
class Verdict:
    """One judge's opinion of one reply.

    ``score`` is clamped to ``[0, 1]`` (a non-finite score becomes 0).
    ``judge`` and ``weight`` are filled in by :func:`self_correct` from the judge.
    """

    score: float
    reasons: str = ""
    judge: str = ""
    weight: float = 1.0

    def __post_init__(self) -> None:
        score = float(self.score)
        object.__setattr__(self, "score", min(1.0, max(0.0, score)) if math.isfinite(score)
                           else 0.0)
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"judge weight must be a finite number >= 0, not {self.weight}")


class Judge(Protocol):
    """Scores a reply to a request against criteria."""

    name: str
    weight: float
    """Relative weight for the ``weighted`` strategy (>= 0)."""

    async def score(self, request_text: str, reply: str,
                    criteria: str | None = None) -> Verdict:
        """Judge ``reply``; ``criteria=None`` means the judge's own criteria."""
        ...
