"""The ``[budgets]`` table: token budgets and a request rate, per user, group and agent.

Every limit is a number of tokens (input plus output, as the provider reported
them) or requests; ``0`` means unlimited, which is the default. Each model call
reserves its worst case against the limits before it is made
(:mod:`bot.engine.budgets`), so a limit is exceeded by at most one call's reservation. An agent may
override any of them in ``[agents.<name>.budgets]``; what it leaves unset comes
from the top-level table::

    [budgets]
    user_daily_tokens = 200000
    user_requests_per_minute = 6

    [agents.support.budgets]
    user_daily_tokens = 50000     # tighter for the public support agent

Days and months are UTC. Cost budgets work the same way on what the tokens
cost by a price table per model (per million tokens, in any one currency)::

    [budgets]
    user_daily_cost = 0.50
    [budgets.prices.claude-sonnet-5-5]
    input = 3.0
    output = 15.0

A model missing from the table costs nothing (the log says so once).

Prompt caching: token budgets count every input token, cached or not (caching
makes a turn cheaper, not smaller). Cost budgets price input read from the
prompt cache at ``cache_read`` and input written to it at ``cache_write`` per
million; left out, they are Anthropic's ratios to ``input``: 0.1x and 1.25x.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelPrice(BaseModel):
    """What a million tokens of one model cost."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(0.0, ge=0)
    output: float = Field(0.0, ge=0)
    cache_read: float | None = Field(None, ge=0)
    """Per million input tokens read from the prompt cache; ``None``: 0.1 x ``input``."""
    cache_write: float | None = Field(None, ge=0)
    """Per million input tokens written to the prompt cache; ``None``: 1.25 x ``input``."""

    def cost(self, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
             cache_write_tokens: int = 0) -> float:
        """What a run with these token counts cost (the cache counts are parts of
        ``input_tokens``)."""
        read = self.input * 0.1 if self.cache_read is None else self.cache_read
        write = self.input * 1.25 if self.cache_write is None else self.cache_write
        plain = max(0, input_tokens - cache_read_tokens - cache_write_tokens)
        return (plain * self.input + cache_read_tokens * read + cache_write_tokens * write
                + output_tokens * self.output) / 1_000_000


class BudgetConfig(BaseModel):
    """Limits enforced before a run calls the model; 0 is unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_daily_tokens: int = Field(0, ge=0)
    """Tokens one user may spend per UTC day, across chats and agents."""
    user_monthly_tokens: int = Field(0, ge=0)
    group_daily_tokens: int = Field(0, ge=0)
    """Tokens all runs in one group chat may spend per UTC day."""
    group_monthly_tokens: int = Field(0, ge=0)
    agent_daily_tokens: int = Field(0, ge=0)
    """Tokens one agent may spend per UTC day, for everyone together."""
    user_requests_per_minute: int = Field(0, ge=0)
    """Messages from one user that may start a run in any 60 seconds."""
    user_daily_cost: float = Field(0.0, ge=0)
    """Like the token budgets, in the currency of ``prices``."""
    user_monthly_cost: float = Field(0.0, ge=0)
    group_daily_cost: float = Field(0.0, ge=0)
    group_monthly_cost: float = Field(0.0, ge=0)
    agent_daily_cost: float = Field(0.0, ge=0)
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Price per million input and output tokens, by model name."""
    admins_exempt: bool = True
    """Admins (``admins``) are never limited."""

    def merged(self, override: BudgetConfig | None) -> BudgetConfig:
        """These limits with the fields ``override`` sets explicitly replacing them."""
        if override is None or not override.model_fields_set:
            return self
        return self.model_copy(update={name: getattr(override, name)
                                       for name in override.model_fields_set})

    @property
    def limited(self) -> bool:
        """Whether any limit is set."""
        return any((self.user_daily_tokens, self.user_monthly_tokens, self.group_daily_tokens,
                    self.group_monthly_tokens, self.agent_daily_tokens,
                    self.user_requests_per_minute, self.costs_limited))

    @property
    def costs_limited(self) -> bool:
        """Whether any cost limit is set."""
        return any((self.user_daily_cost, self.user_monthly_cost, self.group_daily_cost,
                    self.group_monthly_cost, self.agent_daily_cost))
