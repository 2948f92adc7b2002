"""The ``[budgets]`` table: token budgets and a request rate, per user, group and agent.

Every limit is a number of tokens (input plus output, as the provider reported
them) or requests; ``0`` means unlimited, which is the default. An agent may
override any of them in ``[agents.<name>.budgets]``; what it leaves unset comes
from the top-level table::

    [budgets]
    user_daily_tokens = 200000
    user_requests_per_minute = 6

    [agents.support.budgets]
    user_daily_tokens = 50000     # tighter for the public support agent

Days and months are UTC. Cost budgets (a price table per model) are not
implemented: budgets count tokens.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
                    self.user_requests_per_minute))
