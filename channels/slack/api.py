"""Slack's HTTP endpoints as the adapter calls them: the Web API and response_urls.

:class:`SlackApi` opens the Web API client at start (``auth.test`` checks the
bot token) and makes each call through :func:`deliver`, with Slack's errors
mapped by :func:`delivery_error` and counted in flight.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse
from slack_sdk.webhook.async_client import AsyncWebhookClient

from channels.delivery import DeliveryPolicy, deliver
from channels.inflight import InFlight
from channels.slack.common import (
    MESSAGE_LIMIT,
    RESPONSE_URL_USES,
    api_base,
    error_code,
    log,
    sdk_log,
)
from channels.slack.errors import delivery_error, post_response
from channels.slack_format import split_for_slack

if TYPE_CHECKING:
    from bot.config.settings import Settings

T = TypeVar("T")


class SlackApi:
    """The Web API client (once :meth:`open` passed ``auth.test``) and every call through it."""

    def __init__(self, settings: Settings, inflight: InFlight, *, policy: DeliveryPolicy,
                 timeout: int) -> None:
        """``timeout`` bounds each Web API call (seconds); an answer that takes longer
        counts as a transient failure. ``policy`` tunes the retries."""
        self.settings = settings
        self.inflight = inflight
        self.policy = policy
        self.timeout = timeout
        self.bot_user_id = ""
        self.bot_id = ""
        self._web: AsyncWebClient | None = None

    @property
    def started(self) -> bool:
        """Whether :meth:`open` made the client."""
        return self._web is not None

    @property
    def web(self) -> AsyncWebClient:
        """The Web API client; raises before :meth:`open`."""
        if self._web is None:
            raise RuntimeError("the Slack channel is not started")
        return self._web

    async def open(self, bot_token: str) -> None:
        """Make the client and check the token with ``auth.test`` (who the bot is)."""
        # No SDK retry handlers: deliver() owns retries, and two layers of them
        # could post one reply twice.
        self._web = AsyncWebClient(token=bot_token,
                                   base_url=api_base(self.settings.slack_api_base),
                                   retry_handlers=[], logger=sdk_log, timeout=self.timeout)
        try:
            auth = await self._web.auth_test()
        except SlackApiError as exc:
            raise RuntimeError(f"Slack refused SLACK_BOT_TOKEN: auth.test answered "
                               f"{error_code(exc) or exc.response.status_code}") from exc
        self.bot_user_id = str(auth.get("user_id") or "")
        self.bot_id = str(auth.get("bot_id") or "")

    async def call(self, method: str, call: Callable[..., Awaitable[AsyncSlackResponse]],
                   policy: DeliveryPolicy, **params: Any) -> AsyncSlackResponse:
        """A Web API call with Slack's errors translated for :func:`deliver`."""
        async def attempt() -> AsyncSlackResponse:
            try:
                return await call(**params)
            except Exception as exc:
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc

        return await self.inflight.tracked(deliver(attempt, what=f"Slack {method}",
                                                   policy=policy))

    async def respond(self, response_url: str, text: str) -> None:
        """Post ``text`` to a slash command's ``response_url`` (ephemeral), split as needed."""
        pieces = split_for_slack(text, MESSAGE_LIMIT)
        if len(pieces) > RESPONSE_URL_USES:
            log.warning("Slack: a command reply has %d parts; a response_url takes %d",
                        len(pieces), RESPONSE_URL_USES)
            del pieces[RESPONSE_URL_USES:]
        webhook = AsyncWebhookClient(response_url, retry_handlers=[], logger=sdk_log)
        for piece in pieces:
            await self.inflight.tracked(deliver(functools.partial(post_response, webhook, piece),
                                                what="Slack response_url", policy=self.policy))
