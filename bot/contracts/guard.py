"""The input-guard contract: patterns plugins offer and input checks' verdicts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GuardPattern:
    """A named regular expression that flags a likely prompt injection."""

    name: str
    pattern: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class InputCheck:
    """An input filter's verdict on a user message.

    ``text`` replaces the message text when set; ``refusal`` stops the run and
    is sent to the user instead of calling the model; ``note`` is appended to
    what the model sees (for example, that the input was shortened).
    """

    text: str | None = None
    refusal: str | None = None
    note: str | None = None
