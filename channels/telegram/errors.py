"""Every aiogram error mapped to what the caller does next, and short log lines for errors."""

from __future__ import annotations

import traceback
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import aiohttp
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramConflictError,
    TelegramEntityTooLarge,
    TelegramForbiddenError,
    TelegramMigrateToChat,
    TelegramNetworkError,
    TelegramNotFound,
    TelegramRetryAfter,
    TelegramServerError,
    TelegramUnauthorizedError,
)

from bot.resilience.retry import RetryPolicy
from channels.delivery import RateLimited, Transient

T = TypeVar("T")

POLL_BACKOFF_CAP = 30.0
"""The longest pause between failed ``getUpdates`` calls, in seconds."""


class ChatMigrated(Exception):
    """A group became a supergroup; calls must go to ``chat_id`` from now on."""

    def __init__(self, chat_id: int) -> None:
        super().__init__(f"the chat moved to {chat_id}")
        self.chat_id = chat_id


async def translated(call: Awaitable[T]) -> T:
    """Await a Bot API call, mapping every aiogram error to what the caller does next.

    - ``TelegramRetryAfter`` (429) → :class:`RateLimited`: wait, then retry (the
      rate limiter holds the call's chat, or the whole bot, meanwhile);
    - ``TelegramMigrateToChat`` → :class:`ChatMigrated`: call the new chat;
    - ``TelegramServerError`` and ``RestartingTelegram`` (5xx),
      ``ClientDecodeError`` (an HTML 502/504 page from nginx, or a garbled
      body) and ``TelegramNetworkError`` (resets before or after the call,
      timeouts) → :class:`Transient`: back off and retry. A reset after a
      ``sendMessage`` took effect makes the retry a duplicate; that is the
      price of never losing a reply (the Bot API has no idempotency key).
    - ``TelegramBadRequest``, ``TelegramForbiddenError``, ``TelegramNotFound``,
      ``TelegramUnauthorizedError``, ``TelegramEntityTooLarge``,
      ``TelegramConflictError`` and any other API error are permanent: raised
      as they are (callers read the 400 descriptions) and never retried.
    """
    try:
        return await call
    except TelegramRetryAfter as exc:
        raise RateLimited(float(exc.retry_after)) from exc
    except TelegramMigrateToChat as exc:
        raise ChatMigrated(exc.migrate_to_chat_id) from exc
    except (TelegramBadRequest, TelegramForbiddenError, TelegramNotFound,
            TelegramUnauthorizedError, TelegramEntityTooLarge, TelegramConflictError):
        # TelegramEntityTooLarge derives from TelegramNetworkError: caught here first.
        raise
    except TelegramServerError as exc:  # RestartingTelegram included
        raise Transient(f"server error: {exc.message}") from exc
    except ClientDecodeError as exc:
        raise Transient(f"undecodable answer ({describe_error(exc)})") from exc
    except TelegramNetworkError as exc:
        raise Transient(f"network: {exc.message}") from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        # aiogram wraps these; kept in case an error escapes its wrapping.
        raise Transient(f"network: {type(exc).__name__}: {exc}") from exc


def describe_error(exc: BaseException) -> str:
    """One short line for a log: aiogram's ClientDecodeError would print a whole HTML page."""
    if isinstance(exc, ClientDecodeError):
        return f"{exc.message}: {type(exc.original).__name__}"
    if isinstance(exc, TelegramAPIError):
        return f"{type(exc).__name__}: {exc.message}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def backoff(base: float, failures: int) -> float:
    """Exponential pause with ±25 % jitter, capped, after ``failures`` failures in a row."""
    policy = RetryPolicy(base_delay=base, max_delay=POLL_BACKOFF_CAP, jitter=0.25)
    return min(POLL_BACKOFF_CAP, policy.delay(failures))


def entity_error(exc: TelegramBadRequest) -> bool:
    """Whether Telegram could not parse the HTML (the text can still go as plain text)."""
    return "can't parse entities" in exc.message.lower()


def not_modified(exc: TelegramBadRequest) -> bool:
    """Whether an edit was refused because the message already shows exactly that."""
    return "message is not modified" in exc.message.lower()


def where(exc: BaseException) -> str:
    """The exception and the innermost line it came from, on one line."""
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    place = f" at {Path(frame[0].filename).name}:{frame[0].lineno}" if frame else ""
    return f"{describe_error(exc)}{place}"
