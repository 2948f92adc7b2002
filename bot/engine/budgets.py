"""Budgets and rate limits, checked before a run calls the model.

The dispatcher asks :meth:`Budgets.check` before it starts a run (a person's
message, a cron job or the heartbeat — scheduled runs count against their
owner, the message's sender) and refuses the run with the returned text when
a limit is reached; :meth:`Budgets.record` adds what the provider reported
for a finished run to the counters (:mod:`bot.storage.usage`). Token limits
compare the tokens already spent in the UTC day or month with the limit, so
the run that crosses a limit finishes and the next one is refused. Cost
limits do the same with what the tokens cost by ``[budgets.prices]``. The
request rate is kept in memory: a restart forgets the last minute.
"""

from __future__ import annotations

import logging
from collections import deque
from datetime import UTC, datetime, timedelta

from bot.config.budgets import BudgetConfig
from bot.config.settings import Settings
from bot.contracts.llm import Usage
from bot.contracts.messages import InboundMessage
from bot.storage.usage import Scope, UsageStore, day_of, month_of

log = logging.getLogger("roost.engine.budgets")

RATE_WINDOW = 60.0
"""Seconds over which ``user_requests_per_minute`` counts."""


def next_month(moment: float) -> str:
    """The first day of the UTC month after ``moment``: ``1 December``."""
    now = datetime.fromtimestamp(moment, UTC)
    first = (now.replace(day=1) + timedelta(days=32)).replace(day=1)
    return f"{first.day} {first:%B}"


def subjects(message: InboundMessage, agent: str) -> list[tuple[Scope, str]]:
    """Whose counters a run of ``message`` under ``agent`` adds to."""
    found: list[tuple[Scope, str]] = [("user", f"{message.channel}:{message.sender_id}"),
                                      ("agent", agent)]
    if message.chat_type == "group":
        found.append(("group", f"{message.channel}:{message.chat_id}"))
    return found


class Budgets:
    """Enforces ``[budgets]`` (per agent: ``[agents.<name>.budgets]``) against the counters."""

    def __init__(self, settings: Settings, usage: UsageStore) -> None:
        self.settings = settings
        self.usage = usage
        self._requests: dict[str, deque[float]] = {}
        self._unpriced: set[str] = set()

    def limits(self, agent: str) -> BudgetConfig:
        """The limits in force for ``agent``'s runs."""
        return self.settings.budgets_for(agent)

    def exempt(self, message: InboundMessage, limits: BudgetConfig) -> bool:
        """Whether ``message``'s sender is not limited (an admin, by default)."""
        return limits.admins_exempt and self.settings.is_admin(message.channel,
                                                               message.sender_id)

    async def check(self, message: InboundMessage, agent: str, *,
                    request: bool = True) -> str | None:
        """``None`` if a run of ``message`` may call the model, else the reply saying why not.

        ``request``: the run answers a person's message and counts against the
        request rate (scheduled runs count only against the token budgets).
        """
        limits = self.limits(agent)
        if not limits.limited or self.exempt(message, limits):
            return None
        now = self.usage.clock()
        user = f"{message.channel}:{message.sender_id}"
        recent: deque[float] | None = None
        if request and limits.user_requests_per_minute:
            recent = self._requests.setdefault(user, deque())
            while recent and recent[0] <= now - RATE_WINDOW:
                recent.popleft()
            if len(recent) >= limits.user_requests_per_minute:
                wait = max(1, round(recent[0] + RATE_WINDOW - now))
                log.info("%s refused: %d requests in the last minute", user, len(recent))
                return (f"Too many messages: at most {limits.user_requests_per_minute} per "
                        f"minute. Try again in {wait} s.")
        day, month = day_of(now), month_of(now)
        group = f"{message.channel}:{message.chat_id}" if message.chat_type == "group" else None
        checks: list[tuple[int, Scope, str | None, str, str]] = [
            (limits.user_daily_tokens, "user", user, day, "Your"),
            (limits.user_monthly_tokens, "user", user, month, "Your"),
            (limits.group_daily_tokens, "group", group, day, "This group's"),
            (limits.group_monthly_tokens, "group", group, month, "This group's"),
            (limits.agent_daily_tokens, "agent", agent, day, "This assistant's"),
        ]
        for limit, scope, subject, period, whose in checks:
            if not limit or subject is None:
                continue
            spent = await self.usage.spent(scope, subject, period)
            if spent < limit:
                continue
            daily = period == day
            log.info("%s refused: %s %s budget spent (%d of %d tokens)", user, scope,
                     "daily" if daily else "monthly", spent, limit)
            return (f"{whose} {'daily' if daily else 'monthly'} limit reached, resets "
                    f"{_resets(daily, now)} ({spent:,} of {limit:,} tokens used).")
        costs: list[tuple[float, Scope, str | None, str, str]] = [
            (limits.user_daily_cost, "user", user, day, "Your"),
            (limits.user_monthly_cost, "user", user, month, "Your"),
            (limits.group_daily_cost, "group", group, day, "This group's"),
            (limits.group_monthly_cost, "group", group, month, "This group's"),
            (limits.agent_daily_cost, "agent", agent, day, "This assistant's"),
        ]
        for cap, scope, subject, period, whose in costs:
            if not cap or subject is None:
                continue
            cost = await self.usage.cost(scope, subject, period)
            if cost < cap:
                continue
            daily = period == day
            log.info("%s refused: %s %s spending limit reached (%.4f of %.4f)", user, scope,
                     "daily" if daily else "monthly", cost, cap)
            return (f"{whose} {'daily' if daily else 'monthly'} spending limit reached, resets "
                    f"{_resets(daily, now)} ({cost:.2f} of {cap:.2f} spent).")
        if recent is not None:
            recent.append(now)
        return None

    def record(self, message: InboundMessage, agent: str, usage: Usage,
               model: str = "") -> None:
        """Count a finished run's tokens (and their cost with ``model``'s price) for its
        sender, group and agent."""
        if not usage.input_tokens and not usage.output_tokens:
            return
        self.usage.record(subjects(message, agent), usage.input_tokens, usage.output_tokens,
                          self.cost(agent, model, usage),
                          cache_read_tokens=usage.cache_read_tokens,
                          cache_write_tokens=usage.cache_write_tokens)

    def cost(self, agent: str, model: str, usage: Usage) -> float:
        """What ``usage`` of ``model`` costs by the agent's price table (0 when unpriced)."""
        prices = self.limits(agent).prices
        if not prices:
            return 0.0
        price = prices.get(model)
        if price is None:
            if model not in self._unpriced:
                self._unpriced.add(model)
                log.warning("model %r has no price in [budgets.prices]; its runs cost 0 for "
                            "the cost budgets", model)
            return 0.0
        return price.cost(usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
                          usage.cache_write_tokens)

    async def describe(self, message: InboundMessage, agent: str) -> list[str]:
        """Lines for ``/status``: the sender's tokens today and this month against the limits."""
        limits = self.limits(agent)
        now = self.usage.clock()
        user = f"{message.channel}:{message.sender_id}"
        today = await self.usage.spent("user", user, day_of(now))
        month = await self.usage.spent("user", user, month_of(now))

        def against(limit: int) -> str:
            return f" of {limit:,}" if limit else " (no limit)"

        lines = [f"Your tokens: today {today:,}{against(limits.user_daily_tokens)}, "
                 f"this month {month:,}{against(limits.user_monthly_tokens)} (UTC)"]
        cached = await self.usage.totals("user", user, day_of(now))
        if cached.cache_read_tokens or cached.cache_write_tokens:
            lines.append(f"Prompt cache today: {cached.cache_read_tokens:,} input tokens read "
                         f"(billed at 0.1x), {cached.cache_write_tokens:,} written (1.25x)")
        if message.chat_type == "group" and (limits.group_daily_tokens
                                             or limits.group_monthly_tokens):
            group = f"{message.channel}:{message.chat_id}"
            g_day = await self.usage.spent("group", group, day_of(now))
            g_month = await self.usage.spent("group", group, month_of(now))
            lines.append(f"This group's tokens: today {g_day:,}"
                         f"{against(limits.group_daily_tokens)}, this month {g_month:,}"
                         f"{against(limits.group_monthly_tokens)}")
        if limits.prices or limits.costs_limited:
            c_day = await self.usage.cost("user", user, day_of(now))
            c_month = await self.usage.cost("user", user, month_of(now))

            def cap(limit: float) -> str:
                return f" of {limit:.2f}" if limit else " (no limit)"

            lines.append(f"Your spending: today {c_day:.2f}{cap(limits.user_daily_cost)}, "
                         f"this month {c_month:.2f}{cap(limits.user_monthly_cost)}")
        if limits.user_requests_per_minute:
            lines.append(f"Rate limit: {limits.user_requests_per_minute} messages per minute")
        if self.exempt(message, limits) and limits.limited:
            lines.append("You are an admin: budgets do not apply to you.")
        return lines


def _resets(daily: bool, now: float) -> str:
    return "at 00:00 UTC" if daily else f"on {next_month(now)} at 00:00 UTC"
