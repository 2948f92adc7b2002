"""Token estimates (bot.engine.context): weights by script, long texts counted once."""

from __future__ import annotations

from bot.engine import context
from bot.engine.context import NON_LATIN_CHARS_PER_TOKEN, TokenEstimator


def test_cjk_and_cyrillic_weigh_more_than_their_length_at_the_english_ratio() -> None:
    estimator = TokenEstimator("anthropic")
    text = "漢字" + "Привет" + "ok"
    expected = 2 + 2 * estimator.ratio + 6 / NON_LATIN_CHARS_PER_TOKEN * estimator.ratio
    assert estimator.weight(text) == expected


def test_a_long_text_weighs_the_same_on_every_call_and_is_counted_once() -> None:
    estimator = TokenEstimator("anthropic")
    text = "You are Roost — a helpful agent. Привет, 漢字. " * 40
    first = estimator.weight(text)
    assert text in context._script_counts
    # A different object with the same text is found by value.
    assert estimator.weight("".join(list(text))) == first
    estimator.ratio = 2.0  # the counts do not depend on the calibrated ratio
    dense, other = context._script_counts[text]
    assert estimator.weight(text) == len(text) - dense - other + (
        dense + other / NON_LATIN_CHARS_PER_TOKEN) * 2.0


def test_the_remembered_counts_stay_bounded() -> None:
    estimator = TokenEstimator("anthropic")
    for n in range(context._MEMO_SIZE * 3):
        estimator.weight(f"{n} — " + "x" * context._MEMO_MIN_CHARS)
    assert len(context._script_counts) <= context._MEMO_SIZE
