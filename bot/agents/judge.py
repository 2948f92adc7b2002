"""Self-correction: judges score a reply, an aggregator decides, failures are retried.

A :class:`Judge` scores one reply against criteria with a :class:`Verdict`
(``score`` in ``[0, 1]`` and its ``reasons``). :class:`LLMJudge` asks a model
for ``{"score": float, "reasons": str}``. :func:`aggregate` combines the
verdicts of several judges with one of :data:`STRATEGIES`, and
:func:`self_correct` regenerates a reply with a correction message built from
the failed verdicts until the judges pass it or the attempts run out — the
last attempt is returned even if it still fails.

Judges run concurrently; cancelling the task running :func:`self_correct`
cancels the generator or judges in flight and the ``CancelledError``
propagates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bot.contracts.judge import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_THRESHOLD,
    MAX_RETRIES_RANGE,
    STRATEGIES,
    Judge,
    Strategy,
    Verdict,
)
from bot.contracts.llm import ChatMessage, LLMProvider, LLMRequest, metered_complete

log = logging.getLogger("roost.agents.judge")

Generate = Callable[[str | None], Awaitable[str]]
"""``generate(correction)``: a reply; ``None`` the first time, then the correction text."""



# --------------------------------------------------------------------------- LLM judge

JUDGE_SYSTEM = (
    "You are a strict reviewer. You grade an assistant's reply to a user's request "
    "against the given criteria. Answer with one JSON object and nothing else: "
    '{"score": <number from 0.0 (fails completely) to 1.0 (fully meets the criteria)>, '
    '"reasons": "<short explanation; say what to fix if the score is below 1>"}'
)

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_BARE_NUMBER = re.compile(rf"\s*({_NUMBER})\s*\.?\s*")
_LABELLED_NUMBER = re.compile(rf"\bscore\b\W{{0,3}}\s*({_NUMBER})", re.IGNORECASE)


def parse_verdict(text: str) -> Verdict:
    """A verdict from a judge model's answer.

    Accepts, in order: the first JSON object with a numeric ``score`` (fenced
    in a code block or embedded in prose); an answer that is only a number; a
    ``score: <number>`` label. The score is clamped to ``[0, 1]``. Anything else
    gives score 0 with a reason saying the answer could not be parsed.
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        found = _first_scored_object(candidate)
        if found is not None:
            return found
    if (match := _BARE_NUMBER.fullmatch(text)) is not None:
        return _verdict_from_number(match.group(1), "")
    if (match := _LABELLED_NUMBER.search(text)) is not None:
        return _verdict_from_number(match.group(1), text.strip())
    snippet = " ".join(text.split())[:200]
    return Verdict(0.0, f"unparseable judge answer: {snippet!r}")


def _first_scored_object(text: str) -> Verdict | None:
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        score = value.get("score")
        if isinstance(score, str):
            try:
                score = float(score)
            except ValueError:
                continue
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            continue
        if not math.isfinite(score):
            continue
        return Verdict(float(score), _reasons_text(value.get("reasons", value.get("reason"))))
    return None


def _reasons_text(reasons: Any) -> str:
    if reasons is None:
        return ""
    if isinstance(reasons, str):
        return reasons
    if isinstance(reasons, (list, tuple)):
        return "; ".join(str(r) for r in reasons)
    return str(reasons)


def _verdict_from_number(raw: str, reasons: str) -> Verdict:
    value = float(raw)
    if not math.isfinite(value):
        return Verdict(0.0, f"unparseable judge answer: {raw!r}")
    return Verdict(value, reasons)


class LLMJudge:
    """A judge that asks a model for ``{"score": float, "reasons": str}``.

    Provider errors propagate (a judge that cannot be asked has no opinion);
    an answer that cannot be parsed scores 0 (see :func:`parse_verdict`).
    """

    def __init__(self, provider: LLMProvider, model: str, criteria: str, *,
                 name: str = "llm", weight: float = 1.0, max_tokens: int = 512,
                 temperature: float | None = 0.0) -> None:
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"judge weight must be a finite number >= 0, not {weight}")
        self.provider = provider
        self.model = model
        self.criteria = criteria
        self.name = name
        self.weight = weight
        self.max_tokens = max_tokens
        self.temperature = temperature

    def request(self, request_text: str, reply: str, criteria: str | None = None) -> LLMRequest:
        """The model call that grades ``reply``."""
        prompt = (
            f"Criteria:\n{criteria if criteria is not None else self.criteria}\n\n"
            f"User request:\n<request>\n{request_text}\n</request>\n\n"
            f"Assistant reply:\n<reply>\n{reply}\n</reply>\n\n"
            'Grade the reply. Answer only with {"score": <0.0-1.0>, "reasons": "..."}.'
        )
        return LLMRequest(self.model, JUDGE_SYSTEM, (ChatMessage("user", prompt),),
                          max_tokens=self.max_tokens, temperature=self.temperature)

    async def score(self, request_text: str, reply: str,
                    criteria: str | None = None) -> Verdict:
        """Ask the model and parse its verdict."""
        response = await metered_complete(self.provider,
                                          self.request(request_text, reply, criteria))
        verdict = parse_verdict(response.text)
        return replace(verdict, judge=self.name, weight=self.weight)


# --------------------------------------------------------------------------- aggregation


def _check_threshold(threshold: float) -> None:
    if not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 1.0):
        raise ValueError(f"threshold must be between 0 and 1, not {threshold!r}")


def aggregate(verdicts: Sequence[Verdict], strategy: Strategy | str,
              threshold: float = DEFAULT_THRESHOLD) -> tuple[float, bool]:
    """Combine ``verdicts`` into ``(score, passed)`` with ``strategy``.

    Raises ``ValueError`` for no verdicts, an unknown strategy, a threshold
    outside ``[0, 1]``, or ``weighted`` with weights that sum to zero.
    """
    _check_threshold(threshold)
    if not verdicts:
        raise ValueError("cannot aggregate zero verdicts")
    scores = [v.score for v in verdicts]
    if strategy == "vote":
        share = sum(s >= threshold for s in scores) / len(scores)
        return share, share > 0.5
    if strategy == "mean":
        score = statistics.fmean(scores)
    elif strategy == "median":
        score = float(statistics.median(scores))
    elif strategy == "min":
        score = min(scores)
    elif strategy == "max":
        score = max(scores)
    elif strategy == "weighted":
        total = sum(v.weight for v in verdicts)
        if total <= 0:
            raise ValueError("weighted aggregation needs judge weights that sum above zero")
        score = sum(v.score * v.weight for v in verdicts) / total
    else:
        raise ValueError(f"unknown aggregation strategy {strategy!r} "
                         f"(known: {', '.join(STRATEGIES)})")
    return score, score >= threshold


# --------------------------------------------------------------------------- self-correction


@dataclass(frozen=True, slots=True)
class CorrectionResult:
    """The reply :func:`self_correct` settled on and how it got there.

    ``verdicts[i]`` and ``scores[i]`` belong to attempt ``i + 1``; ``reply``,
    ``score`` and ``passed`` to the last attempt.
    """

    reply: str
    attempts: int
    verdicts: tuple[tuple[Verdict, ...], ...]
    scores: tuple[float, ...]
    passed: bool

    @property
    def score(self) -> float:
        return self.scores[-1]


def correction_message(verdicts: Sequence[Verdict], score: float, threshold: float) -> str:
    """The text asking the generator to fix a reply, from the failed verdicts' reasons.

    Uses the verdicts below ``threshold`` (all of them if none is, as can happen
    with ``vote`` or ``mean``).
    """
    failed = [v for v in verdicts if v.score < threshold] or list(verdicts)
    lines = [
        f"Your previous reply did not pass review (score {score:.2f}, "
        f"needed {threshold:.2f}). Reviewer feedback:"
    ]
    for verdict in failed:
        who = verdict.judge or "reviewer"
        reasons = verdict.reasons.strip() or "(no reasons given)"
        lines.append(f"- {who} ({verdict.score:.2f}): {reasons}")
    lines.append("Write a corrected reply that addresses this feedback.")
    return "\n".join(lines)


async def _judge_all(judges: Sequence[Judge], request_text: str, reply: str,
                     criteria: str | None) -> tuple[Verdict, ...]:
    tasks = [asyncio.create_task(j.score(request_text, reply, criteria)) for j in judges]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:
        # Cancellation already reaches the children through gather; a judge's own
        # error does not, so stop the others before propagating.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return tuple(replace(v, judge=v.judge or j.name, weight=j.weight)
                 for j, v in zip(judges, results, strict=True))


async def self_correct(
    generate: Generate,
    judges: Sequence[Judge],
    *,
    strategy: Strategy | str,
    threshold: float = DEFAULT_THRESHOLD,
    max_retries: int = DEFAULT_MAX_RETRIES,
    request_text: str = "",
    criteria: str | None = None,
) -> CorrectionResult:
    """Generate a reply, judge it, and regenerate with a correction until it passes.

    ``max_retries`` (1..10) is the number of attempts in all, as in the spec's
    loop: ``max_retries=1`` judges a single reply and never regenerates. The
    first ``generate`` call gets ``None``; later ones get
    :func:`correction_message` of the failed attempt. ``request_text`` and
    ``criteria`` are passed to every judge (``criteria=None``: each judge's own).
    Returns the first passing attempt, or the last attempt if none passes.
    Judge/generator errors and ``CancelledError`` propagate.
    """
    low, high = MAX_RETRIES_RANGE
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) \
            or not low <= max_retries <= high:
        raise ValueError(f"max_retries must be an integer from {low} to {high}, "
                         f"not {max_retries!r}")
    _check_threshold(threshold)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown aggregation strategy {strategy!r} "
                         f"(known: {', '.join(STRATEGIES)})")
    if not judges:
        raise ValueError("self_correct needs at least one judge")

    all_verdicts: list[tuple[Verdict, ...]] = []
    scores: list[float] = []
    correction: str | None = None
    reply = ""
    passed = False
    for attempt in range(1, max_retries + 1):
        reply = await generate(correction)
        verdicts = await _judge_all(judges, request_text, reply, criteria)
        score, passed = aggregate(verdicts, strategy, threshold)
        all_verdicts.append(verdicts)
        scores.append(score)
        if passed:
            break
        log.info("self-correction attempt %d/%d failed (score %.2f < %.2f)",
                 attempt, max_retries, score, threshold)
        correction = correction_message(verdicts, score, threshold)
    return CorrectionResult(reply, len(all_verdicts), tuple(all_verdicts), tuple(scores),
                            passed)
