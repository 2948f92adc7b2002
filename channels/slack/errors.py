"""The one mapping of slack_sdk's and aiohttp's failures for :func:`channels.delivery.deliver`."""

from __future__ import annotations

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.webhook.async_client import AsyncWebhookClient

from channels.delivery import RateLimited, Transient
from channels.slack.common import TRANSIENT_ERRORS, retry_after


def delivery_error(exc: BaseException) -> BaseException:
    """What a Web API failure means to :func:`deliver`; ``exc`` itself if it is for good.

    The one mapping of everything slack_sdk and aiohttp raise:

    * 429 (or ``error: ratelimited``) → :class:`RateLimited` with ``Retry-After``;
    * any 5xx, whatever its body (an HTML error page from a proxy included),
      and the error codes Slack uses for its own trouble → :class:`Transient`;
    * an answer that is not Slack's JSON (slack_sdk raises ``SlackApiError``
      around aiohttp's response, or with no ``error`` to read) → :class:`Transient`;
    * connection errors: aiohttp's ``ClientError`` (resets, server
      disconnects, payload errors), ``TimeoutError``, ``OSError`` → :class:`Transient`;
    * any other ``SlackApiError`` (``channel_not_found``, ``not_in_channel``,
      ``invalid_auth``, ``msg_too_long``...) and everything else → permanent.
    """
    if isinstance(exc, SlackApiError):
        response = exc.response
        # slack_sdk wraps aiohttp's own response (``status``, no ``data``)
        # when the body could not be decoded, its AsyncSlackResponse otherwise.
        raw_status = getattr(response, "status_code", None)
        if not isinstance(raw_status, int):
            raw_status = getattr(response, "status", 0)
        status = raw_status if isinstance(raw_status, int) else 0
        data = getattr(response, "data", None)
        code = data.get("error") if isinstance(data, dict) else None
        if status == 429 or code == "ratelimited":
            return RateLimited(retry_after(getattr(response, "headers", None)))
        if status >= 500:
            return Transient(f"Slack answered HTTP {status}")
        if code in TRANSIENT_ERRORS:
            return Transient(f"Slack answered {code}")
        if not isinstance(code, str) or not code:
            return Transient(f"Slack's answer (HTTP {status}) could not be read")
        return exc
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return Transient(f"{type(exc).__name__}: {exc}")
    return exc


async def post_response(webhook: AsyncWebhookClient, text: str) -> None:
    """Post one ephemeral reply to a response_url, errors translated for deliver()."""
    try:
        response = await webhook.send(text=text, response_type="ephemeral")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise Transient(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code == 429:
        raise RateLimited(retry_after(response.headers))
    if response.status_code >= 500:
        raise Transient(f"response_url answered HTTP {response.status_code}")
    if response.status_code != 200:
        raise RuntimeError(f"response_url answered HTTP {response.status_code}: "
                           f"{response.body[:200]}")
