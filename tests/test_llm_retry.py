"""with_retries on its own, with plain attempt functions: paths the fakes cannot stage.

The provider tests drive the same code through the real SDKs; here an
attempt is a small coroutine, so the test can choose exactly when the
breaker opens relative to a failing stream.
"""

from __future__ import annotations

import pytest

from bot.contracts.llm import OnText, ProviderError
from bot.resilience.breaker import BreakerPolicy, CircuitBreaker
from plugins.provider_retry import AttemptFailed, OnOpen, RetryPolicy, with_retries

POLICY = RetryPolicy(attempts=6, base_delay=0.001)


async def test_a_stream_cut_after_others_opened_the_breaker_voids_its_text_then_holds() -> None:
    breaker = CircuitBreaker(BreakerPolicy(threshold=3, base_delay=0.02, max_delay=0.05))
    seen: list[str | tuple[int, int]] = []
    attempts = 0

    async def attempt(on_text: OnText | None, opened: OnOpen) -> str:
        nonlocal attempts
        attempts += 1
        assert on_text is not None
        if attempts == 1:
            opened()
            on_text("Half an")
            # Meanwhile three other calls fail: the outage opens the breaker
            # while this stream is still running, then this one is cut too.
            for _ in range(3):
                breaker.record_failure(await breaker.admit(), "overloaded (529)")
            raise AttemptFailed(ProviderError("connection cut", retryable=True))
        on_text("The whole answer.")
        return "The whole answer."

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        seen.append((attempt, max_attempts))

    result = await with_retries(
        attempt, POLICY, on_text=seen.append, on_retry=on_retry, breaker=breaker
    )

    # (1, 6): the first attempt's text is void and it did not count, as the
    # outage is to blame; (0, 0): the call is held; then the probe answers.
    assert seen == ["Half an", (1, 6), (0, 0), "The whole answer."]
    assert result == "The whole answer."
    assert breaker.state == "closed"


async def test_a_non_retryable_error_after_text_is_raised_at_once() -> None:
    calls: list[tuple[int, int, str]] = []

    async def attempt(on_text: OnText | None, opened: OnOpen) -> str:
        opened()
        assert on_text is not None
        on_text("Some words")
        raise AttemptFailed(ProviderError("bad request (400)", status=400))

    async def on_retry(attempt: int, max_attempts: int, error: str) -> None:
        calls.append((attempt, max_attempts, error))

    breaker = CircuitBreaker()
    with pytest.raises(ProviderError) as caught:
        await with_retries(
            attempt, POLICY, on_text=lambda _: None, on_retry=on_retry, breaker=breaker
        )

    assert caught.value.status == 400
    assert calls == []
    assert breaker.state == "closed"


def test_provider_policy_keeps_its_numbers_on_the_shared_policy_type() -> None:
    policy = RetryPolicy()
    assert (policy.attempts, policy.base_delay) == (6, 0.5)
    # 0.5 s doubling, at most 8 s, lengthened by up to a tenth, never shortened.
    waits = [policy.delay(n) for n in range(1, 8)]
    nominal = [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert all(w0 <= w <= w0 * 1.1 for w, w0 in zip(waits, nominal, strict=True))
    # A server's retry-after wins up to 30 s.
    assert policy.delay(1, retry_after=12.0) == 12.0
    assert policy.delay(1, retry_after=300.0) == 30.0
    assert RetryPolicy(3, 0.001).attempts == 3
