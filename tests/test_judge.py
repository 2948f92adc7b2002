"""Judges, aggregation strategies and the self-correction loop."""

from __future__ import annotations

import asyncio

import pytest

from bot.agents.judge import (
    STRATEGIES,
    CorrectionResult,
    Judge,
    LLMJudge,
    Verdict,
    aggregate,
    correction_message,
    parse_verdict,
    self_correct,
)
from bot.testing.app import scripted
from plugins.scripted_provider import ScriptedProvider

# --------------------------------------------------------------------------- aggregation

SCORES = (0.2, 0.6, 0.9)


def fixed(*scores: float, weights: tuple[float, ...] | None = None) -> list[Verdict]:
    weights = weights or (1.0,) * len(scores)
    pairs = enumerate(zip(scores, weights, strict=True))
    return [Verdict(s, f"r{i}", f"j{i}", w) for i, (s, w) in pairs]


def test_strategies_are_the_six_of_the_spec() -> None:
    assert set(STRATEGIES) == {"mean", "median", "min", "max", "weighted", "vote"}


@pytest.mark.parametrize(("strategy", "score", "passed"), [
    ("mean", (0.2 + 0.6 + 0.9) / 3, False),
    ("median", 0.6, False),
    ("min", 0.2, False),
    ("max", 0.9, True),
    ("weighted", (0.2 * 1 + 0.6 * 1 + 0.9 * 1) / 3, False),
    ("vote", 1 / 3, False),
])
def test_each_strategy(strategy: str, score: float, passed: bool) -> None:
    got_score, got_passed = aggregate(fixed(*SCORES), strategy, 0.7)
    assert got_score == pytest.approx(score)
    assert got_passed is passed


def test_mean_passes_at_the_threshold() -> None:
    score, passed = aggregate(fixed(0.7, 0.7), "mean", 0.7)
    assert score == pytest.approx(0.7) and passed


def test_median_of_an_even_count() -> None:
    score, passed = aggregate(fixed(0.2, 0.6, 0.8, 1.0), "median", 0.7)
    assert score == pytest.approx(0.7) and passed


def test_weighted_uses_judge_weights() -> None:
    score, passed = aggregate(fixed(0.2, 0.9, weights=(1.0, 3.0)), "weighted", 0.7)
    assert score == pytest.approx((0.2 + 2.7) / 4)
    assert passed
    score, passed = aggregate(fixed(0.2, 0.9, weights=(3.0, 1.0)), "weighted", 0.7)
    assert score == pytest.approx((0.6 + 0.9) / 4)
    assert not passed


def test_weighted_needs_positive_total_weight() -> None:
    with pytest.raises(ValueError, match="sum above zero"):
        aggregate(fixed(0.9, weights=(0.0,)), "weighted", 0.7)


def test_vote_needs_a_strict_majority() -> None:
    score, passed = aggregate(fixed(0.8, 0.9, 0.1), "vote", 0.7)
    assert score == pytest.approx(2 / 3) and passed
    assert aggregate(fixed(0.8, 0.1), "vote", 0.7) == (0.5, False)  # a tie does not pass
    assert aggregate(fixed(0.7), "vote", 0.7) == (1.0, True)  # at the threshold counts


def test_aggregate_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="zero verdicts"):
        aggregate([], "mean", 0.7)
    with pytest.raises(ValueError, match="unknown aggregation strategy"):
        aggregate(fixed(0.5), "mode", 0.7)
    with pytest.raises(ValueError, match="threshold"):
        aggregate(fixed(0.5), "mean", 1.5)


def test_verdict_clamps_scores() -> None:
    assert Verdict(1.7).score == 1.0
    assert Verdict(-0.3).score == 0.0
    assert Verdict(float("nan")).score == 0.0
    with pytest.raises(ValueError, match="weight"):
        Verdict(0.5, weight=-1.0)


# --------------------------------------------------------------------------- LLMJudge

CRITERIA = "The reply must answer the question and be polite."


async def judge_answer(text: str) -> tuple[Verdict, ScriptedProvider]:
    provider = scripted({"reply": text})
    judge = LLMJudge(provider, "judge-model", CRITERIA, name="polite")
    verdict = await judge.score("What is 2+2?", "4, obviously.")
    return verdict, provider


async def test_llm_judge_json_and_request() -> None:
    verdict, provider = await judge_answer('{"score": 0.85, "reasons": "Correct but curt."}')
    assert verdict == Verdict(0.85, "Correct but curt.", "polite", 1.0)
    (request,) = provider.requests
    assert request.model == "judge-model"
    assert "JSON" in request.system
    prompt = request.messages[-1].content
    assert CRITERIA in prompt and "What is 2+2?" in prompt and "4, obviously." in prompt


async def test_llm_judge_criteria_override() -> None:
    provider = scripted({"reply": '{"score": 1, "reasons": "fine"}'})
    judge = LLMJudge(provider, "m", CRITERIA)
    await judge.score("q", "a", "Be brief.")
    prompt = provider.requests[0].messages[-1].content
    assert "Be brief." in prompt and CRITERIA not in prompt


async def test_llm_judge_fenced_json_in_prose() -> None:
    verdict, _ = await judge_answer(
        'Here is my grade:\n```json\n{"score": 0.4, "reasons": ["rude", "too short"]}\n```\n'
        "Hope that helps {not json}."
    )
    assert verdict.score == pytest.approx(0.4)
    assert verdict.reasons == "rude; too short"


async def test_llm_judge_embedded_json_skips_objects_without_score() -> None:
    verdict, _ = await judge_answer(
        'Context {"note": 1} then {"score": "0.75", "reasons": "ok"} trailing'
    )
    assert verdict.score == pytest.approx(0.75) and verdict.reasons == "ok"


async def test_llm_judge_bare_number() -> None:
    verdict, _ = await judge_answer("  0.6\n")
    assert verdict.score == pytest.approx(0.6)


async def test_llm_judge_scores_are_clamped() -> None:
    verdict, _ = await judge_answer('{"score": 8, "reasons": "great"}')
    assert verdict.score == 1.0
    verdict, _ = await judge_answer("-2")
    assert verdict.score == 0.0


async def test_llm_judge_garbage_scores_zero_with_a_reason() -> None:
    verdict, _ = await judge_answer("I think this reply is pretty good overall!")
    assert verdict.score == 0.0
    assert "unparseable" in verdict.reasons and "pretty good" in verdict.reasons


def test_parse_verdict_variants() -> None:
    assert parse_verdict("Score: 0.9 because it is right").score == pytest.approx(0.9)
    assert parse_verdict('{"score": true}').score == 0.0  # a bool is not a score
    assert parse_verdict('{"score": NaN}').score == 0.0
    assert parse_verdict('{"score": 0.3}').reasons == ""
    assert parse_verdict("").reasons.startswith("unparseable")


def test_llm_judge_rejects_negative_weight() -> None:
    with pytest.raises(ValueError, match="weight"):
        LLMJudge(scripted({"reply": "1"}), "m", CRITERIA, weight=-1)


# --------------------------------------------------------------------------- self-correction


class Generator:
    """Returns replies in order and records the corrections it was given."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.corrections: list[str | None] = []

    async def __call__(self, correction: str | None) -> str:
        self.corrections.append(correction)
        return self.replies[len(self.corrections) - 1]


def llm_judge(*answers: str, name: str = "llm", weight: float = 1.0) -> LLMJudge:
    provider = scripted(*({"reply": a} for a in answers))
    return LLMJudge(provider, "judge-model", CRITERIA, name=name, weight=weight)


async def test_passes_on_attempt_two_with_a_correction() -> None:
    generate = Generator("draft one", "draft two")
    judge = llm_judge('{"score": 0.3, "reasons": "Missing the actual answer."}',
                      '{"score": 0.9, "reasons": "Good."}', name="accuracy")
    result = await self_correct(generate, [judge], strategy="mean", request_text="q?")
    assert isinstance(result, CorrectionResult)
    assert result.reply == "draft two"
    assert result.passed and result.attempts == 2
    assert result.scores == pytest.approx((0.3, 0.9))
    assert result.score == pytest.approx(0.9)
    assert [v[0].reasons for v in result.verdicts] == ["Missing the actual answer.", "Good."]
    first, second = generate.corrections
    assert first is None
    assert second is not None
    assert "Missing the actual answer." in second and "accuracy" in second
    # The judge saw each draft and the request.
    provider = judge.provider
    assert isinstance(provider, ScriptedProvider)
    prompts = [r.messages[-1].content for r in provider.requests]
    assert "draft one" in prompts[0] and "draft two" in prompts[1] and "q?" in prompts[0]


async def test_passing_first_attempt_does_not_regenerate() -> None:
    generate = Generator("good")
    result = await self_correct(generate, [llm_judge("0.95")], strategy="min")
    assert (result.reply, result.attempts, result.passed) == ("good", 1, True)
    assert generate.corrections == [None]


async def test_cap_returns_the_last_attempt() -> None:
    generate = Generator("a", "b", "c", "d")
    judge = llm_judge(*(f'{{"score": 0.{i}, "reasons": "bad {i}"}}' for i in (1, 2, 3, 4)))
    result = await self_correct(generate, [judge], strategy="mean", max_retries=3)
    assert result.reply == "c"
    assert result.attempts == 3 and not result.passed
    assert len(result.verdicts) == 3
    assert result.score == pytest.approx(0.3)
    assert generate.corrections[0] is None
    assert generate.corrections[1] is not None and "bad 1" in generate.corrections[1]
    assert generate.corrections[2] is not None and "bad 2" in generate.corrections[2]


async def test_max_retries_one_is_a_single_attempt() -> None:
    generate = Generator("only")
    result = await self_correct(generate, [llm_judge("0.1")], strategy="mean", max_retries=1)
    assert (result.reply, result.attempts, result.passed) == ("only", 1, False)


async def test_several_judges_with_weights_and_vote() -> None:
    generate = Generator("r1", "r2")
    strict = llm_judge('{"score": 0.2, "reasons": "wrong tone"}',
                       '{"score": 0.8, "reasons": "ok"}', name="tone", weight=3.0)
    lenient = llm_judge('{"score": 0.9, "reasons": "fine"}',
                        '{"score": 0.9, "reasons": "fine"}', name="facts", weight=1.0)
    result = await self_correct(generate, [strict, lenient], strategy="weighted")
    assert result.attempts == 2 and result.passed
    assert result.scores[0] == pytest.approx((0.6 + 0.9) / 4)
    assert [v.weight for v in result.verdicts[0]] == [3.0, 1.0]
    correction = generate.corrections[1]
    assert correction is not None
    assert "wrong tone" in correction and "fine" not in correction  # only failed verdicts


def test_correction_message_falls_back_to_all_verdicts() -> None:
    # e.g. vote at a high threshold, or mean pulled down: no single verdict is below it.
    text = correction_message([Verdict(0.8, "meh", "a"), Verdict(0.9, "", "b")], 0.6, 0.7)
    assert "meh" in text and "(no reasons given)" in text and "0.60" in text


@pytest.mark.parametrize("bad", [0, 11, -1, 2.5, True])
async def test_max_retries_is_validated(bad: object) -> None:
    generate = Generator("x")
    with pytest.raises(ValueError, match="max_retries"):
        await self_correct(generate, [llm_judge("1")], strategy="mean",
                           max_retries=bad)  # type: ignore[arg-type]
    assert generate.corrections == []  # validated before generating


async def test_other_arguments_are_validated() -> None:
    generate = Generator("x")
    with pytest.raises(ValueError, match="threshold"):
        await self_correct(generate, [llm_judge("1")], strategy="mean", threshold=-0.1)
    with pytest.raises(ValueError, match="strategy"):
        await self_correct(generate, [llm_judge("1")], strategy="mode")
    with pytest.raises(ValueError, match="judge"):
        await self_correct(generate, [], strategy="mean")
    assert generate.corrections == []
    await self_correct(generate, [llm_judge("1")], strategy="mean", max_retries=10)


async def test_a_slow_judge_is_cancelled() -> None:
    provider = scripted({"delay": 30, "reply": "1"})
    slow = LLMJudge(provider, "m", CRITERIA)
    finished = asyncio.Event()
    entered = asyncio.Event()

    class Quick:
        name = "quick"
        weight = 1.0

        async def score(self, request_text: str, reply: str,
                        criteria: str | None = None) -> Verdict:
            entered.set()
            try:
                await asyncio.sleep(30)
            finally:
                finished.set()
            return Verdict(1.0)

    judges: list[Judge] = [slow, Quick()]
    task = asyncio.create_task(self_correct(Generator("r"), judges, strategy="mean"))
    await entered.wait()
    assert provider.requests  # the slow judge's model call is under way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert finished.is_set()  # the sibling judge was cancelled too


async def test_a_failing_judge_propagates_and_stops_the_others() -> None:
    stopped = asyncio.Event()

    class Slow:
        name = "slow"
        weight = 1.0

        async def score(self, request_text: str, reply: str,
                        criteria: str | None = None) -> Verdict:
            try:
                await asyncio.sleep(30)
            finally:
                stopped.set()
            return Verdict(1.0)

    failing = LLMJudge(scripted({"error": "judge model down"}), "m", CRITERIA)
    judges: list[Judge] = [failing, Slow()]
    with pytest.raises(Exception, match="judge model down"):
        await self_correct(Generator("r"), judges, strategy="mean")
    assert stopped.is_set()
