"""Budgets and rate limits: checked before a run, reserved and settled around each model call.

The dispatcher asks :meth:`Budgets.check` before it starts a run (a person's
message, a cron job or the heartbeat — scheduled runs count against their
owner, the message's sender) and refuses the run with the returned text when
a limit is already reached or the sender exceeds the request rate (kept in the
database, so a restart or another replica sees it). It then runs the run under
:meth:`Budgets.meter` (:data:`bot.contracts.llm.METER`): each model call of
the run — and of the compaction, memory flush and judges serving it — first
reserves its worst case (the estimated input plus ``max_tokens``, priced by
``[budgets.prices]`` for the cost budgets) against every limit that applies, in
one database transaction shared by all replicas, and is refused when a limit is
reached counting the reservations of calls in flight; after the call the
reservation is replaced by the usage the provider reported. A limit therefore
admits calls until it is reached, and what they spend exceeds it by at most one
call's reservation. A counter reaching 80 % of a limit warns once per period: the
user (or the group) in chat, an agent's budget in the log for the admin.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from bot.config.budgets import BudgetConfig
from bot.config.settings import Settings
from bot.contracts.llm import BudgetRefused, Hold, LLMRequest, Usage
from bot.contracts.messages import InboundMessage
from bot.engine.context import TokenEstimator
from bot.storage.usage import Limit, Scope, Standing, UsageStore, day_of, month_of

log = logging.getLogger("roost.engine.budgets")

RATE_WINDOW = 60.0
"""Seconds over which ``user_requests_per_minute`` counts."""
WARN_AT = 0.8
"""The share of a limit at which its user, group or admin is warned (once per period)."""
HOLD_GRACE = 60.0
"""Seconds a reservation outlives the run timeout before it expires (its process died)."""
WHOSE: dict[Scope, str] = {"user": "Your", "group": "This group's", "agent": "This assistant's"}


def next_month(moment: float) -> str:
    """The first day of the UTC month after ``moment``: ``1 December``."""
    now = datetime.fromtimestamp(moment, UTC)
    first = (now.replace(day=1) + timedelta(days=32)).replace(day=1)
    return f"{first.day} {first:%B}"


def subjects(message: InboundMessage, agent: str, model: str = "",
             job: str = "") -> list[tuple[Scope, str]]:
    """Whose counters a run of ``message`` under ``agent`` adds to (a call of ``model``,
    in scheduled ``job`` when it is one: counted for the usage page, never limited)."""
    found: list[tuple[Scope, str]] = [("user", f"{message.channel}:{message.sender_id}"),
                                      ("agent", agent)]
    if message.chat_type == "group":
        found.append(("group", f"{message.channel}:{message.chat_id}"))
    if model:
        found.append(("model", model))
    if job:
        found.append(("job", job))
    return found


class Budgets:
    """Enforces ``[budgets]`` (per agent: ``[agents.<name>.budgets]``) against the counters."""

    def __init__(self, settings: Settings, usage: UsageStore,
                 estimator_for: Callable[[str], TokenEstimator] = TokenEstimator) -> None:
        """``estimator_for(provider name)`` estimates a request's input tokens (the
        engine's calibrated estimators)."""
        self.settings = settings
        self.usage = usage
        self.estimator_for = estimator_for
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
        # Last: a message refused for its budget does not use up a request.
        if request and limits.user_requests_per_minute:
            wait = await self.usage.admit_request(user, limits.user_requests_per_minute,
                                                  RATE_WINDOW)
            if wait is not None:
                log.info("%s refused: %d requests in the last minute", user,
                         limits.user_requests_per_minute)
                return (f"Too many messages: at most {limits.user_requests_per_minute} per "
                        f"minute. Try again in {max(1, round(wait))} s.")
        return None

    def meter(self, message: InboundMessage, agent: str,
              notify: Callable[[str], None] | None = None, *, job: str = "") -> Payer:
        """The meter of a run serving ``message`` under ``agent`` (see the module);
        ``notify`` tells the chat of an 80 % warning; ``job`` names the scheduled job
        the run is a fire of (``cron:<id>``, ``heartbeat``), if any."""
        return Payer(self, message, agent, notify, job)

    def applying(self, message: InboundMessage, agent: str) -> list[Limit]:
        """The limits ``message``'s runs must fit now (none for an exempt admin)."""
        limits = self.limits(agent)
        if not limits.limited or self.exempt(message, limits):
            return []
        now = self.usage.clock()
        day, month = day_of(now), month_of(now)
        user = f"{message.channel}:{message.sender_id}"
        group = f"{message.channel}:{message.chat_id}" if message.chat_type == "group" else None
        found = [
            Limit("user", user, day, limits.user_daily_tokens, limits.user_daily_cost),
            Limit("user", user, month, limits.user_monthly_tokens, limits.user_monthly_cost),
            Limit("agent", agent, day, limits.agent_daily_tokens, limits.agent_daily_cost),
        ]
        if group is not None:
            found += [
                Limit("group", group, day, limits.group_daily_tokens, limits.group_daily_cost),
                Limit("group", group, month, limits.group_monthly_tokens,
                      limits.group_monthly_cost),
            ]
        return [limit for limit in found if limit.tokens or limit.cost]

    def refusal(self, standing: Standing) -> str:
        """The one line a call refused by ``standing``'s limit answers."""
        limit, now = standing.limit, self.usage.clock()
        daily = limit.period == day_of(now)
        when = "daily" if daily else "monthly"
        whose = WHOSE[limit.scope]
        if limit.tokens and standing.spent + standing.held >= limit.tokens:
            busy = (f", {standing.held:,} reserved by answers in progress" if standing.held
                    else "")
            log.info("%s %s refused: %s budget reached (%d spent, %d reserved, of %d tokens)",
                     limit.scope, limit.subject, when, standing.spent, standing.held,
                     limit.tokens)
            return (f"{whose} {when} limit reached, resets {_resets(daily, now)} "
                    f"({standing.spent:,} of {limit.tokens:,} tokens used{busy}).")
        busy = (f", {standing.held_cost:.2f} reserved by answers in progress"
                if standing.held_cost else "")
        log.info("%s %s refused: %s spending limit reached (%.4f spent, %.4f reserved, of %.4f)",
                 limit.scope, limit.subject, when, standing.cost, standing.held_cost, limit.cost)
        return (f"{whose} {when} spending limit reached, resets {_resets(daily, now)} "
                f"({standing.cost:.2f} of {limit.cost:.2f} spent{busy}).")

    def warning(self, standing: Standing, kind: str) -> str:
        """The 80 % warning for ``standing``'s limit of ``kind`` (``tokens`` or ``cost``)."""
        limit = standing.limit
        when = "daily" if limit.period == day_of(self.usage.clock()) else "monthly"
        who = {"user": "you have", "group": "this group has",
               "agent": "this assistant has"}[limit.scope]
        if kind == "tokens":
            share, what = (standing.spent / limit.tokens,
                           f"{when} token budget ({standing.spent:,} of {limit.tokens:,})")
        else:
            share, what = (standing.cost / limit.cost,
                           f"{when} spending limit ({standing.cost:.2f} of {limit.cost:.2f})")
        used = "all" if share >= 1 else f"{round(WARN_AT * 100)} %"
        return f"Heads-up: {who} used {used} of the {what}."

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


class Payer:
    """The meter of one run (:class:`bot.contracts.llm.Meter`): reserves each model
    call against the limits of the run's sender, group and agent, and settles it."""

    def __init__(self, budgets: Budgets, message: InboundMessage, agent: str,
                 notify: Callable[[str], None] | None, job: str = "") -> None:
        self.budgets = budgets
        self.message = message
        self.agent = agent
        self.notify = notify
        self.job = job
        """The scheduled job this run is a fire of (``cron:<id>``, ``heartbeat``), or ''."""
        self.counted = False
        """Whether a call of this run was counted yet (the run counts once in ``runs``)."""
        self.held_warnings: list[str] | None = []
        """Warnings held until :meth:`release` (after the run's reply); ``None``: at once."""

    def first_spend(self, spent: Usage) -> bool:
        """Whether ``spent`` is the run's first counted spending (it counts as a run)."""
        first = not self.counted and bool(spent.input_tokens or spent.output_tokens)
        self.counted = self.counted or first
        return first

    def tell(self, text: str) -> None:
        """Tell the chat ``text`` — once the run's reply went out."""
        if self.held_warnings is not None:
            self.held_warnings.append(text)
        elif self.notify is not None:
            self.notify(text)

    def release(self) -> None:
        """Send the warnings held so far; later ones go at once (background work)."""
        held, self.held_warnings = self.held_warnings or [], None
        for text in held:
            self.tell(text)

    def estimate(self, request: LLMRequest, provider: str) -> Usage:
        """``request``'s worst case: its estimated input and all of ``max_tokens``."""
        return Usage(self.budgets.estimator_for(provider).request(request), request.max_tokens)

    async def reserve(self, request: LLMRequest, provider: str) -> Hold:
        """Hold the call's worst case; raises :class:`BudgetRefused` when a limit is reached."""
        budgets = self.budgets
        limits = budgets.applying(self.message, self.agent)
        hold = _Hold(self, uuid.uuid4().hex, limits)
        if not limits:
            return hold
        worst = self.estimate(request, provider)
        try:
            standing = await budgets.usage.reserve(
                hold.id, limits, worst.input_tokens + worst.output_tokens,
                budgets.cost(self.agent, request.model, worst),
                budgets.settings.run_timeout + HOLD_GRACE)
        except asyncio.CancelledError:
            # The reservation commits all the same (writes finish once queued): let it go.
            budgets.usage.release(hold.id)
            raise
        if standing is not None:
            raise BudgetRefused(budgets.refusal(standing))
        return hold

    async def charge(self, usage: Usage, model: str) -> None:
        """Count ``usage`` spent without a model call (a transcription)."""
        await _Hold(self, uuid.uuid4().hex,
                    self.budgets.applying(self.message, self.agent)).settle(usage, model)


class _Hold:
    def __init__(self, payer: Payer, hold: str, limits: list[Limit]) -> None:
        self.payer = payer
        self.id = hold
        self.limits = limits

    async def settle(self, usage: Usage | None, model: str) -> None:
        payer, budgets = self.payer, self.payer.budgets
        spent = usage or Usage()
        if not self.limits and not spent.input_tokens and not spent.output_tokens:
            return
        first = payer.first_spend(spent)
        if not self.limits:
            # Nothing reserved, nothing to warn about: counted with the next commit.
            budgets.usage.record(
                subjects(payer.message, payer.agent, model, payer.job), spent.input_tokens,
                spent.output_tokens,
                budgets.cost(payer.agent, model, spent),
                cache_read_tokens=spent.cache_read_tokens,
                cache_write_tokens=spent.cache_write_tokens, runs=1 if first else 0)
            return
        try:
            warned = await budgets.usage.settle(
                self.id, subjects(payer.message, payer.agent, model, payer.job),
                spent.input_tokens,
                spent.output_tokens, budgets.cost(payer.agent, model, spent),
                cache_read_tokens=spent.cache_read_tokens,
                cache_write_tokens=spent.cache_write_tokens, limits=self.limits,
                warn_at=WARN_AT, runs=1 if first else 0)
        except Exception:
            # The hold expires on its own; the spend is lost to the counters.
            log.exception("counting %d tokens of %s failed", spent.input_tokens
                          + spent.output_tokens, payer.message.sender_id)
            return
        for standing, kind in warned:
            text = budgets.warning(standing, kind)
            limit = standing.limit
            passed = (standing.spent >= limit.tokens if kind == "tokens"
                      else standing.cost >= limit.cost)
            # Past the whole limit the next message's refusal says it (and is logged).
            log.log(logging.INFO if passed else logging.WARNING, "%s %s: %s", limit.scope,
                    limit.subject, text)
            if limit.scope != "agent" and not passed:  # an agent's: the admin's, in the log
                payer.tell(text)
