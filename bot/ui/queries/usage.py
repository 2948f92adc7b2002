"""The usage page's figures: tokens and cost per day and per subject, and budget gauges.

Everything comes from the budgets' own counters (:mod:`bot.storage.usage`, the
``usage`` table: per UTC day and month, per user, group, agent, model and scheduled
job) and the limits of ``[budgets]`` as :mod:`bot.engine.budgets` enforces them, so
the page shows what the budgets see. Every query is bounded by a day range on the
counters' primary key (scope, period, subject).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

from bot.config.budgets import BudgetConfig
from bot.config.settings import Settings
from bot.engine.budgets import WARN_AT
from bot.storage.sessions import SessionStore
from bot.storage.usage import Scope, day_of, month_of
from bot.ui.queries.opsdb import rows

SCOPES: tuple[Scope, ...] = get_args(Scope)
"""Every counter scope, in the page's order."""
MAX_DAYS = 366
"""The longest range the page shows."""
TOP = 10
"""Subjects listed per scope."""
TOP_DAYS = 31
"""The most recent days the top-subject tables sum (a longer range still charts every
day): a busy month of per-user day counters is what a page can read within its time."""
GAUGES_SHOWN = 50
"""Counters near or over a limit listed per limit."""

_SUMS = ("SUM(input_tokens), SUM(output_tokens), SUM(cache_read_tokens),"
         " SUM(cache_write_tokens), SUM(cost), SUM(runs)")


@dataclass(frozen=True, slots=True)
class Totals:
    """Counters summed over a range: of one day, or one subject."""

    key: str
    """The day (``2026-11-27``) or the subject."""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float = 0.0
    runs: int = 0

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    @property
    def cache_hit(self) -> float:
        """Of the input tokens, the share read from the provider's prompt cache."""
        return self.cache_read_tokens / self.input_tokens if self.input_tokens else 0.0


@dataclass(frozen=True, slots=True)
class Gauge:
    """One counter against one of its limits (what :class:`bot.engine.budgets.Budgets`
    refuses at): ``share`` of it spent, ``state`` ``near`` from 80 % and ``over`` at 100 %."""

    scope: Scope
    subject: str
    window: Literal["daily", "monthly"]
    kind: Literal["tokens", "cost"]
    spent: float
    limit: float

    @property
    def share(self) -> float:
        """Spent over limit (1.0 and more: reached)."""
        return self.spent / self.limit if self.limit else 0.0

    @property
    def state(self) -> str:
        """``over`` (the limit refuses), ``near`` (past the 80 % warning) or ``ok``."""
        return "over" if self.share >= 1 else "near" if self.share >= WARN_AT else "ok"


@dataclass(frozen=True, slots=True)
class LimitRow:
    """One limit of ``[budgets]`` in force, and the counters near or over it."""

    scope: Scope
    window: Literal["daily", "monthly"]
    kind: Literal["tokens", "cost"]
    limit: float
    agent: str
    """The agent whose ``[agents.<name>.budgets]`` sets it; '' for ``[budgets]``."""
    gauges: list[Gauge]


@dataclass(frozen=True, slots=True)
class UsageReport:
    """The usage page: a day range (UTC, inclusive), its days, its top subjects per scope,
    and the budget limits with who is near or over them today and this month."""

    first_day: str
    last_day: str
    days: list[Totals]
    total: Totals
    top_first_day: str
    """The first day the ``top`` tables sum (at most :data:`TOP_DAYS` days)."""
    top: dict[str, list[Totals]]
    limits: list[LimitRow]
    today: str
    month: str

    @property
    def peak_tokens(self) -> int:
        """The most tokens of any day in the range (the charts' scale)."""
        return max((d.tokens for d in self.days), default=0)

    @property
    def peak_cost(self) -> float:
        """The highest cost of any day in the range."""
        return max((d.cost for d in self.days), default=0.0)


def day_range(days: int, now: float) -> tuple[str, str, list[str]]:
    """The first and last UTC day of the ``days`` ending today, and every day between."""
    days = max(1, min(MAX_DAYS, days))
    today = datetime.fromtimestamp(now, UTC).date()
    every = [(today - timedelta(days=n)).isoformat() for n in range(days - 1, -1, -1)]
    return every[0], every[-1], every


async def usage_report(store: SessionStore, settings: Settings, *, days: int = 30,
                       now: float, top: int = TOP) -> UsageReport:
    """Usage over the ``days`` ending today (UTC) and the budgets' standing now."""
    first, last, every = day_range(days, now)
    # Every run's spend is counted for its agent: the agents' counters sum to the total.
    per_day = {str(r[0]): _totals(r) for r in await rows(
        store,
        f"SELECT period, {_SUMS} FROM usage WHERE scope = 'agent' AND period >= ?"
        " AND period <= ? AND length(period) = 10 GROUP BY period", (first, last))}
    series = [per_day.get(day, Totals(day)) for day in every]
    total = Totals("total", sum(d.input_tokens for d in series),
                   sum(d.output_tokens for d in series),
                   sum(d.cache_read_tokens for d in series),
                   sum(d.cache_write_tokens for d in series), sum(d.cost for d in series),
                   sum(d.runs for d in series))
    top_first = every[-min(len(every), TOP_DAYS)]
    # One query per scope; on PostgreSQL each takes a pooled connection, so they overlap.
    found = await asyncio.gather(*(rows(
        store,
        f"SELECT subject, {_SUMS} FROM usage WHERE scope = ? AND period >= ?"
        " AND period <= ? AND length(period) = 10 GROUP BY subject"
        " HAVING SUM(input_tokens + output_tokens) > 0 OR SUM(cost) > 0"
        " ORDER BY SUM(input_tokens + output_tokens) DESC, subject LIMIT ?",
        (scope, top_first, last, top)) for scope in SCOPES))
    tops: dict[str, list[Totals]] = {
        scope: [_totals(r) for r in got] for scope, got in zip(SCOPES, found, strict=True)}
    return UsageReport(first, last, series, total, top_first, tops,
                       await budget_limits(store, settings, now), day_of(now), month_of(now))


def _totals(row: Any) -> Totals:
    return Totals(str(row[0]), int(row[1] or 0), int(row[2] or 0), int(row[3] or 0),
                  int(row[4] or 0), float(row[5] or 0), int(row[6] or 0))


def limits_in_force(settings: Settings) -> list[tuple[str, BudgetConfig]]:
    """``[budgets]`` (agent '') and each agent's merged limits that differ from it."""
    found: list[tuple[str, BudgetConfig]] = [("", settings.budgets)]
    for agent in sorted(settings.agents):
        merged = settings.budgets_for(agent)
        if merged != settings.budgets:
            found.append((agent, merged))
    return found


_CAPS: tuple[tuple[Scope, Literal["daily", "monthly"], str, str], ...] = (
    ("user", "daily", "user_daily_tokens", "user_daily_cost"),
    ("user", "monthly", "user_monthly_tokens", "user_monthly_cost"),
    ("group", "daily", "group_daily_tokens", "group_daily_cost"),
    ("group", "monthly", "group_monthly_tokens", "group_monthly_cost"),
    ("agent", "daily", "agent_daily_tokens", "agent_daily_cost"),
)
"""Each budget field: whose counter it limits, over which period."""


async def budget_limits(store: SessionStore, settings: Settings, now: float) -> list[LimitRow]:
    """Every limit set, with the counters at or past :data:`WARN_AT` of it now.

    A user's or group's counter spans agents; a limit an agent overrides applies to
    the runs under that agent, so it is listed with that agent's name. An agent's
    own daily limit is checked against that agent's counter only.
    """
    day, month = day_of(now), month_of(now)
    found: list[LimitRow] = []
    for agent, limits in limits_in_force(settings):
        for scope, window, tokens_field, cost_field in _CAPS:
            period = day if window == "daily" else month
            kinds: tuple[tuple[Literal["tokens", "cost"], str], ...] = (
                ("tokens", tokens_field), ("cost", cost_field))
            for kind, field in kinds:
                cap = float(getattr(limits, field))
                if not cap:
                    continue
                if agent and float(getattr(settings.budgets, field)) == cap:
                    continue  # the same limit as [budgets]: listed there
                found.append(LimitRow(scope, window, kind, cap, agent, await _near(
                    store, scope, period, window, kind, cap,
                    agent if scope == "agent" else "")))
    return found


async def _near(store: SessionStore, scope: Scope, period: str,
                window: Literal["daily", "monthly"], kind: Literal["tokens", "cost"],
                cap: float, agent: str) -> list[Gauge]:
    measure = "input_tokens + output_tokens" if kind == "tokens" else "cost"
    only = " AND subject = ?" if agent else ""
    # Token counters are whole numbers: the first that reaches 80 % (PostgreSQL types
    # the parameter as the column's integer).
    floor: float = math.ceil(WARN_AT * cap) if kind == "tokens" else WARN_AT * cap
    params: tuple[object, ...] = (scope, period, floor)
    if agent:
        params += (agent,)
    found = await rows(
        store,
        f"SELECT subject, {measure} FROM usage WHERE scope = ? AND period = ?"
        f" AND {measure} >= ?{only} ORDER BY {measure} DESC, subject LIMIT ?",
        (*params, GAUGES_SHOWN))
    return [Gauge(scope, str(r[0]), window, kind, float(r[1]), cap) for r in found]
