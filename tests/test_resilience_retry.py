"""The shared retry policy and error classifier (bot.resilience.retry) on their own."""

from __future__ import annotations

import random

import pytest

from bot.resilience.retry import (
    RetryPolicy,
    classify,
    classify_code,
    classify_status,
    error_code,
    is_retryable_status,
    parse_retry_after,
)


class Edge(random.Random):
    """``uniform(a, b)`` always returns ``b`` (the top of the jitter range)."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_doubles_from_the_base_and_stops_at_the_cap() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0, jitter=0.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_very_long_outage_does_not_overflow_the_backoff() -> None:
    policy = RetryPolicy(base_delay=1.0, multiplier=1e10, max_delay=30.0, jitter=0.0)
    assert policy.delay(10_000) == 30.0


def test_jitter_both_ways_stays_within_its_share_and_up_never_shortens() -> None:
    both = RetryPolicy(base_delay=1.0, jitter=0.1)
    up = RetryPolicy(base_delay=1.0, jitter=0.1, jitter_mode="up")
    rng = random.Random(7)
    both_samples = [both.delay(1, rng=rng) for _ in range(300)]
    up_samples = [up.delay(1, rng=rng) for _ in range(300)]
    assert all(0.9 <= d <= 1.1 for d in both_samples) and min(both_samples) < 0.95
    assert all(1.0 <= d <= 1.1 for d in up_samples)
    assert up.delay(1, rng=Edge()) == pytest.approx(1.1)


def test_a_servers_retry_after_lengthens_the_wait_up_to_its_cap() -> None:
    policy = RetryPolicy(base_delay=0.5, jitter=0.0, max_retry_after=30.0)
    assert policy.delay(1, retry_after=7.0) == 7.0
    assert policy.delay(1, retry_after=0.1) == 0.5
    assert policy.delay(1, retry_after=600.0) == 30.0
    assert policy.honour(-3.0) == 0.0


def test_a_fixed_schedule_repeats_its_last_delay_and_counts_its_retries() -> None:
    policy = RetryPolicy.fixed(5.0, 30.0, 120.0)
    assert [policy.delay(n) for n in range(1, 6)] == [5.0, 30.0, 120.0, 120.0, 120.0]
    assert policy.retries == 3 and policy.attempts == 4


def test_the_total_budget_is_checked_only_when_set() -> None:
    assert RetryPolicy().within_total(1e9)
    assert RetryPolicy(max_total=2.0).within_total(2.0)
    assert not RetryPolicy(max_total=2.0).within_total(2.01)


@pytest.mark.parametrize(
    ("status", "expected"),
    [(429, "rate_limited"), (500, "transient"), (503, "transient"), (408, "transient"),
     (425, "transient"), (409, "permanent"), (400, "permanent"), (404, "permanent"),
     (200, None), (302, None)],
)
def test_statuses_are_classified(status: int, expected: str | None) -> None:
    assert classify_status(status) == expected


def test_callers_name_their_own_retryable_statuses() -> None:
    providers = frozenset({408, 409, 429})
    assert is_retryable_status(409, providers) and not is_retryable_status(425, providers)
    assert is_retryable_status(429, frozenset()) and not is_retryable_status(408, frozenset())


def test_retry_after_values_are_read_leniently() -> None:
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after(3) == 3.0
    assert parse_retry_after("-1") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert parse_retry_after(None, 1.0) == 1.0
    assert parse_retry_after(True, 1.0) == 1.0


class StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"failed with {status_code}")
        self.status_code = status_code


def test_codes_come_from_status_type_and_text() -> None:
    assert error_code(StatusError(502)) == "502"
    assert error_code(TimeoutError()) == "TIMEOUT"
    assert error_code(ConnectionRefusedError()) == "NETWORK"
    assert error_code(RuntimeError("Too Many Requests")) == "RATE_LIMITED"
    assert error_code(IsADirectoryError()) == "OS_ERROR"
    assert error_code(KeyError("k")) == "KeyError"
    assert error_code("nothing telling", default="TOOL_ERROR") == "TOOL_ERROR"


def test_classification_reads_codes_and_falls_back_by_kind() -> None:
    assert classify_code("rate_limited") == "rate_limited"
    assert classify_code("CONNECTION_RESET") == "transient"
    assert classify_code("not_found") == "permanent"
    assert classify_code("SOMETHING_ELSE") is None
    assert classify(StatusError(429)) == "rate_limited"
    assert classify(StatusError(401)) == "permanent"
    assert classify(RuntimeError("boom")) == "transient"
    assert classify("the widget broke") == "permanent"
    assert classify(RuntimeError("boom"), unknown="permanent") == "permanent"
