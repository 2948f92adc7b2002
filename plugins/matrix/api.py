"""The bot's Matrix account: login, every client-server call, and what the calls' errors mean.

All calls go through :meth:`MatrixApi.call`, which maps matrix-nio's answers onto the
channel kit's: ``429``/``M_LIMIT_EXCEEDED`` becomes :class:`~roost.channels.RateLimited`
with the server's ``retry_after_ms``; a 5xx, a page that is not JSON, a reset or a timeout
:class:`~roost.channels.Transient`; any other error answer :class:`MatrixError` (final).
matrix-nio's own retry loops are off, so there is one retry layer (:func:`deliver`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import nio
import nio.crypto

from plugins.matrix.config import MatrixConfig
from roost import MediaError
from roost.channels import (
    BOT,
    DeliveryPolicy,
    RateLimited,
    RateLimiter,
    SetupError,
    Transient,
    deliver,
    fetch_capped,
    short,
)

log = logging.getLogger("roost.channels.matrix")

LOGIN_KEY = "login"
"""The channel note holding the device a password login created (JSON)."""
MXC = re.compile(r"mxc://([A-Za-z0-9.:\[\]-]{1,255})/([A-Za-z0-9_-]{1,255})")
"""A content URI as servers mint them; anything else in an event is not fetched."""
DEFAULT_UPLOAD_LIMIT = 50 * 1024 * 1024


class MatrixError(Exception):
    """The homeserver refused a call for good (``errcode`` says why)."""

    def __init__(self, what: str, errcode: str, message: str, status: int) -> None:
        super().__init__(f"{what}: {errcode or status} {short(message, 200)}".strip())
        self.errcode = errcode
        self.status = status


def refused(exc: BaseException) -> bool:
    """Whether a failed call certainly showed nothing (an answer that refused it)."""
    return isinstance(exc, RateLimited | MatrixError)


def failure(what: str, answer: Any) -> Exception | None:
    """What a matrix-nio answer means: ``None`` for success, else the error to raise."""
    if not isinstance(answer, nio.ErrorResponse):
        return None
    transport = getattr(answer, "transport_response", None)
    status = int(getattr(transport, "status", 0) or 0)
    errcode = str(answer.status_code or "")
    if status == 429 or errcode == "M_LIMIT_EXCEEDED":
        wait = answer.retry_after_ms
        # Synapse limits an account, not a room: the wait holds every call.
        return RateLimited(wait / 1000 if isinstance(wait, int | float) and wait > 0 else 1.0,
                           scope=BOT)
    if status >= 500 or status == 0:
        return Transient(f"HTTP {status or '?'} {short(answer.message, 120)}")
    return MatrixError(what, errcode, str(answer.message or ""), status)


class MatrixApi:
    """One logged-in matrix-nio client and the rate limiter every call goes through."""

    def __init__(self, config: MatrixConfig, *, policy: DeliveryPolicy,
                 store: Path | None = None, limiter: RateLimiter | None = None,
                 timeout: float = 30.0) -> None:
        self.config = config
        self.store = store
        """Where the device's encryption keys are kept (``None``: no encryption)."""
        self.policy = policy
        self.limiter = limiter or RateLimiter()
        self.timeout = timeout
        self.homeserver = (config.homeserver or "").rstrip("/")
        self.user_id = config.user_id or ""
        self.client: Any = None
        self.session: aiohttp.ClientSession | None = None
        self.display_name = ""
        self.upload_limit = DEFAULT_UPLOAD_LIMIT

    @property
    def started(self) -> bool:
        """Whether :meth:`open` logged in."""
        return self.client is not None and bool(self.client.access_token)

    async def open(self, notes: Any) -> None:
        """Log in (the configured token, a device kept from an earlier password login, or
        the password once), check the token with ``whoami`` and read the bot's name."""
        encrypting = self.encrypting
        config = nio.AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0,
                                       request_timeout=self.timeout,
                                       encryption_enabled=encrypting, store_sync_tokens=False)
        store = ""
        if encrypting and self.store is not None:
            await asyncio.to_thread(self.store.mkdir, mode=0o700, parents=True, exist_ok=True)
            store = str(self.store)
        self.client = nio.AsyncClient(self.homeserver, self.user_id, store_path=store,
                                      config=config)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        token, device = await self._credentials(notes)
        owner, device = await self.call("whoami", lambda: self._whoami(token, device),
                                         raw=True)
        if owner != self.user_id:
            raise SetupError(f"MATRIX_ACCESS_TOKEN belongs to {owner}, not "
                             f"MATRIX_USER_ID {self.user_id}")
        if encrypting and not device:
            raise SetupError("the Matrix token names no device: encryption needs one "
                             "(log in with MATRIX_PASSWORD, or set encryption = false)")
        # With a store, this loads (or creates) the device's keys.
        self.client.restore_login(self.user_id, device, token)
        await self.upkeep()
        try:
            name = await self.call("displayname", lambda: self.client.get_displayname(
                self.user_id))
            self.display_name = str(name.displayname or "")
        except MatrixError:
            self.display_name = ""
        try:
            media = await self.call("media config", self._media_config)
            limit = media.get("m.upload.size")
            if isinstance(limit, int) and limit > 0:
                self.upload_limit = limit
        except (MatrixError, Transient, RateLimited):
            log.info("Matrix: no media config; uploads limited to %d bytes", self.upload_limit)

    @property
    def encrypting(self) -> bool:
        """Whether end-to-end encryption is on (configured, and matrix-nio[e2e] installed)."""
        return bool(self.config.encryption and self.store is not None
                    and getattr(nio.crypto, "ENCRYPTION_ENABLED", False))

    async def upkeep(self) -> None:
        """The key traffic an encrypting device owes after each sync: upload its one-time
        keys, learn the devices of the people in its rooms, claim keys to reach them, and
        send the to-device messages that carry room keys. A failure is retried next time."""
        client = self.client
        if client is None or client.olm is None:
            return
        try:
            if client.should_upload_keys:
                await self.once("keys upload", client.keys_upload)
            if client.should_query_keys:
                await self.once("keys query", client.keys_query)
            if client.should_claim_keys:
                users = client.get_users_for_key_claiming()
                await self.once("keys claim", lambda: client.keys_claim(users))
            await client.send_to_device_messages()
        except (MatrixError, RateLimited, Transient, nio.LocalProtocolError) as exc:
            log.warning("Matrix: key upkeep failed (%s); tried again after the next sync",
                        short(exc, 120))

    async def _credentials(self, notes: Any) -> tuple[str, str]:
        if self.config.access_token is not None:
            return self.config.access_token.get_secret_value(), ""
        kept = await notes.get(LOGIN_KEY)
        if kept:
            try:
                saved = json.loads(kept)
            except ValueError:
                saved = {}
            if isinstance(saved, dict) and saved.get("user_id") == self.user_id \
                    and saved.get("homeserver") == self.homeserver \
                    and isinstance(saved.get("access_token"), str):
                return saved["access_token"], str(saved.get("device_id") or "")
        assert self.config.password is not None
        password = self.config.password.get_secret_value()
        answer = await self.call("login", lambda: self.client.login(
            password, device_name=self.config.device_name))
        await notes.put(LOGIN_KEY, json.dumps({
            "homeserver": self.homeserver, "user_id": self.user_id,
            "device_id": answer.device_id, "access_token": answer.access_token}))
        log.info("Matrix: logged in as %s, device %s (kept for the next start)",
                 self.user_id, answer.device_id)
        return str(answer.access_token), str(answer.device_id)

    async def _whoami(self, token: str, device: str) -> tuple[str, str]:
        """Whose ``token`` is and its device (``device`` if the server does not say)."""
        assert self.session is not None
        try:
            async with self.session.get(
                    f"{self.homeserver}/_matrix/client/v3/account/whoami",
                    headers={"Authorization": f"Bearer {token}"}) as response:
                status, body = response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Transient(f"{type(exc).__name__}: {short(exc, 120)}") from exc
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        data = data if isinstance(data, dict) else {}
        if status == 429:
            wait = data.get("retry_after_ms")
            raise RateLimited(wait / 1000 if isinstance(wait, int) and wait > 0 else 1.0)
        if status >= 500:
            raise Transient(f"HTTP {status}")
        if status in (401, 403):
            raise SetupError(f"the homeserver refused the Matrix token of {self.user_id} "
                             f"({short(str(data.get('errcode') or status), 40)})")
        owner = data.get("user_id")
        if status != 200 or not isinstance(owner, str):
            raise MatrixError("whoami", str(data.get("errcode") or ""), body, status)
        found = data.get("device_id")
        return owner, found if isinstance(found, str) and found else device

    async def _media_config(self) -> Any:
        response = await self.client.send(
            "GET", "/_matrix/client/v1/media/config",
            headers={"Authorization": f"Bearer {self.client.access_token}"})
        if response.status == 200:
            data = await response.json()
            return data if isinstance(data, dict) else {}
        raise MatrixError("media config", "", f"HTTP {response.status}", response.status)

    async def call(self, what: str, call: Callable[[], Awaitable[Any]], *,
                   scope: str = BOT, policy: DeliveryPolicy | None = None,
                   raw: bool = False) -> Any:
        """``call()`` through the limiter and :func:`deliver`; its answer, or the mapped
        error after the retries. Calls in one ``scope`` (a room) go one at a time, and a
        429 holds every call (the limit is the account's). ``raw``: ``call`` raises the
        kit's errors itself (else its answer is mapped)."""
        async def attempt() -> Any:
            async with self.limiter.slot(scope):
                return await (call() if raw else self.once(what, call))
        return await deliver(attempt, what=f"Matrix {what}", policy=policy or self.policy)

    async def once(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` once, its failure mapped (no waiting, no retry)."""
        try:
            answer = await call()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Transient(f"{type(exc).__name__}: {short(exc, 120)}") from exc
        except nio.LocalProtocolError as exc:
            # An encrypted room not synced yet (a reply redelivered right after a start).
            raise Transient(f"{what}: {short(exc, 120)}") from exc
        error = failure(what, answer)
        if isinstance(error, RateLimited):
            self.limiter.block(BOT, error.retry_after)
        if error is not None:
            raise error
        return answer

    async def download(self, url: str, limit: int, what: str) -> bytes:
        """The bytes of ``mxc://server/id`` through the authenticated media endpoint."""
        match = MXC.fullmatch(url)
        if match is None or self.session is None:
            raise MediaError(f"{what}: not a Matrix content URI")
        server, media_id = match.groups()

        def check(response: aiohttp.ClientResponse) -> None:
            if response.status != 200:
                raise MediaError(f"{what}: the homeserver answered {response.status}")

        return await fetch_capped(
            self.session, f"{self.homeserver}/_matrix/client/v1/media/download/{server}/"
            f"{media_id}", limit, check=check, what=what, policy=self.policy,
            headers={"Authorization": f"Bearer {self.client.access_token}"},
            allow_redirects=False)

    async def close(self) -> None:
        """Close the HTTP sessions (the device stays logged in)."""
        if self.session is not None:
            await self.session.close()
        if self.client is not None:
            await self.client.close()
