"""Run events: what observers of a run are told, and when."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

EventType = Literal[
    "run.started",
    "activity",
    "chunk",
    "tool.call",
    "tool.result",
    "block.reply",
    "run.retrying",
    "run.completed",
    "run.failed",
    "run.cancelled",
]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event in a run's life, delivered to every ``roost_run_event`` hook.

    Payloads: ``run.started`` {message}; ``activity`` {phase}; ``chunk``
    {content}; ``tool.call`` {name, id, arguments, read_only}; ``tool.result`` {name, id,
    is_error, result}; ``block.reply`` {content}; ``run.retrying`` {attempt,
    maxAttempts, error}; ``run.completed`` {content, usage, silent};
    ``run.failed`` {error}; ``run.cancelled`` {reason, usage}.
    """

    type: EventType
    run_id: str
    session_key: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
