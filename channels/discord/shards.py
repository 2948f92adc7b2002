"""Gateway sessions: the one unsharded session, or one per shard this process holds.

Discord sends a guild's events to shard ``(guild_id >> 22) % shard_count`` and
DMs to shard 0; each shard is one gateway session (IDENTIFY with ``shard: [id,
count]``). ``discord_shard_count`` shards are run as follows:

* **One process** (SQLite: no ``leadership``): it runs every shard, or the
  one unsharded session when the count is 1 (as before sharding).
* **Replicas** (PostgreSQL): the app's leader election (the channel's
  ``leadership``) hands out :class:`ShardLeases` (``bot.storage.leader.Leases``:
  one advisory lock per shard, spread over the replicas). A replica runs a
  session per shard it holds, closes one whose lease it lost, and opens one for
  each it took, catching up the shard's recently active channels from their
  history (:meth:`Sessions.took_over`). Every replica sends: REST calls go
  through a client of their own that never connects to the gateway, so a
  replica holding no shard still delivers the replies of the runs it claims.

:class:`Sessions` runs them and reports their health; the REST calls go through
:class:`Rest`, messages to :class:`Inbound` and commands to :class:`Interactions`.

Discord closes a session with 4010 (Invalid shard) or 4011 (Sharding required)
when the setting is wrong: that is one clear error line and the session is not
retried (at start, :meth:`DiscordChannel.start` fails with that line).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol, runtime_checkable

import discord

from bot.config.settings import Settings, SetupError
from bot.contracts.channel import READY, ChannelHealth, Leadership
from bot.resilience.retry import RetryPolicy
from channels.discord.changes import Changes, skip_partial_updates
from channels.discord.common import NO_PINGS, Intake, log
from channels.discord.endpoints import Endpoints
from channels.discord.gateway import GatewayClient, guard_frames, guard_parsers
from channels.discord.inbound import Inbound
from channels.discord.interactions import Interactions
from channels.discord.rest import Rest
from channels.inflight import InFlight

SHARDING_CLOSE_CODES = (4010, 4011)
"""Discord's close codes for a wrong shard setting: Invalid shard, Sharding required."""
DISCORD_EPOCH_MS = 1_420_070_400_000
"""Discord ids count milliseconds from 2015-01-01 in their top 42 bits."""
_RECONNECT = RetryPolicy(base_delay=0.5, max_delay=30.0, jitter=0.0)
"""Pauses before reconnecting after an unexpected gateway error: 0.5 s doubling to 30 s."""
TAKEOVER_MARGIN = 10.0
"""Seconds read back before the lease when taking a shard over (clock skew, a slow start)."""


class ShardLeases(Protocol):
    """The shards this replica holds among the replicas (``bot.storage.leader.Leases``)."""

    held: frozenset[int]
    count: int
    check_every: float

    def start(self) -> None:
        """Begin contending in the background."""

    async def close(self) -> None:
        """Give every held shard back at once."""

    async def wait_changed(self) -> frozenset[int]:
        """Return the held shards once they changed."""

    async def wait_balanced(self) -> frozenset[int]:
        """Return the held shards once the first round of taking them is over."""


@runtime_checkable
class SharesOffer(Protocol):
    """The app's leader election, which hands out shard leases too (replicas only)."""

    def shares(self, count: int) -> ShardLeases:
        """Leases on ``count`` shards among the replicas; not started."""


def snowflake_at(seconds: float) -> int:
    """The smallest Discord id of a message sent at Unix time ``seconds``."""
    return max(0, int(seconds * 1000) - DISCORD_EPOCH_MS) << 22


class Sessions:
    """The gateway sessions: opened at start (one, or one per shard held), followed with
    the shard leases, reported as the channel's health, closed at stop."""

    def __init__(self, settings: Settings, *, token: str, intake: Intake, rest: Rest,
                 inbound: Inbound, interactions: Interactions, changes: Changes,
                 inflight: InFlight,
                 endpoints: Endpoints, guild_ready_timeout: float, ready_timeout: float,
                 max_ratelimit_timeout: float) -> None:
        """``guild_ready_timeout`` is how long discord.py waits for further guilds
        before ``on_ready``; ``ready_timeout`` bounds the whole start; discord.py waits
        out 429s up to ``max_ratelimit_timeout`` seconds by itself."""
        self.settings = settings
        self._token = token
        self.intake = intake
        self.rest = rest
        self.inbound = inbound
        self.interactions = interactions
        self.changes = changes
        self.inflight = inflight
        self.endpoints = endpoints
        self.guild_ready_timeout = guild_ready_timeout
        self.ready_timeout = ready_timeout
        self.max_ratelimit_timeout = max_ratelimit_timeout
        self.clients: dict[int | None, GatewayClient] = {}
        """The gateway sessions this process runs, by shard (``None``: unsharded)."""
        self.runners: dict[int, asyncio.Task[None]] = {}
        """The task keeping each shard's session connected."""
        self._runner: asyncio.Task[None] | None = None
        """The unsharded session's task."""
        self._leases: ShardLeases | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._failures: dict[int, int] = {}
        self._stopping = False
        self._started = False
        """Whether :meth:`start` returned: until then it reports failures itself."""
        self._health = ChannelHealth(False, "connecting")
        """The health while no session runs: connecting, or (sharded) ready to send
        while other replicas hold every shard."""

    @property
    def shard_count(self) -> int:
        """``discord_shard_count``: how many shards the bot's guilds are split into."""
        return int(getattr(self.settings, "discord_shard_count", 1))

    @property
    def stopping(self) -> bool:
        """Whether :meth:`begin_stop` was called."""
        return self._stopping

    def health(self) -> ChannelHealth:
        """Ready while every gateway session is up (READY or RESUMED since the last drop).

        A shard's problem is named with its shard.
        """
        for shard, client in sorted(self.clients.items(), key=lambda s: s[0] or 0):
            if not client.health.ready:
                return client.health if shard is None else ChannelHealth(
                    False, f"shard {shard}: {client.health.detail}")
        return READY if self.clients else self._health

    async def start(self, leadership: Leadership | None) -> None:
        """Log in, connect and return once the sessions this process runs are ready.

        Sharded (``discord_shard_count`` above 1, or replicas sharing shards through
        ``leadership``): once the shards this process took are ready. Raises what kept
        the session from connecting (:class:`SetupError` for a wrong shard setting).
        """
        self.endpoints.redirect()
        if self._leases is None and isinstance(leadership, SharesOffer):
            self._leases = leadership.shares(self.shard_count)
        if self._leases is not None or self.shard_count > 1:
            await self._start_shards()
            return
        client = self._new_client()
        self.rest.use(client)
        self.clients[None] = client
        self._runner = asyncio.create_task(self._run(client), name="discord-gateway")
        ready = asyncio.create_task(client.connected.wait())
        try:
            done, _ = await asyncio.wait({ready, self._runner}, timeout=self.ready_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if ready not in done:
            runner, self._runner = self._runner, None
            runner.cancel()
            await client.close()
            await asyncio.gather(runner, return_exceptions=True)
            self.endpoints.restore()
            failure = None if runner.cancelled() else runner.exception()
            if isinstance(failure, SetupError):
                raise failure  # 4010/4011: a setting to change, said in one line
            if failure is not None:
                raise RuntimeError(f"Discord did not connect: {failure}") from failure
            raise TimeoutError(f"Discord was not ready within {self.ready_timeout:g}s")
        self._runner.add_done_callback(lambda task: self._gateway_ended(client, task))
        self._started = True
        assert client.user is not None
        log.info("discord: connected as %s (id %s)", client.user, client.user.id)

    def begin_stop(self) -> None:
        """Shutting down: a session dropping from now on is no problem to report."""
        self._stopping = True

    async def stop(self) -> None:
        """Close every session and the REST client; put discord.py's endpoints back."""
        self._stopping = True
        await self._stop_shards()
        if self.rest.client is not None:
            await self.rest.client.close()
        if self._runner is not None:
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        self.endpoints.restore()

    # -- GatewayEvents ------------------------------------------------------------

    def session_ready(self, client: GatewayClient, *, again: bool) -> None:
        """A READY: catch up after a reconnect that could not resume, or after taking a
        shard over; the shard's failures are forgotten."""
        if again:
            self.inbound.reconnected()
        elif client.taken_at is not None:
            # Nobody received this shard between its previous holder's end and now.
            self.inflight.spawn(self.took_over(client))
        if client.shard_id is not None:
            self._failures.pop(client.shard_id, None)

    async def message(self, message: discord.Message) -> None:
        """A message: to :class:`Inbound`."""
        await self.inbound.message(message)

    async def interaction(self, interaction: discord.Interaction[discord.Client]) -> None:
        """A button pressed: to :class:`Changes`; a command used: to :class:`Interactions`."""
        if interaction.type is discord.InteractionType.component:
            await self.changes.press(interaction)
            return
        await self.interactions.interaction(interaction)

    async def edited(self, payload: discord.RawMessageUpdateEvent) -> None:
        """A message updated: to :class:`Changes`."""
        await self.changes.edited(payload)

    async def deleted(self, channel_id: int, message_ids: list[int],
                      guild_id: int | None) -> None:
        """Messages deleted: to :class:`Changes`."""
        await self.changes.deleted(channel_id, message_ids, guild_id)

    async def reaction(self, payload: discord.RawReactionActionEvent) -> None:
        """A reaction added or removed: to :class:`Changes`."""
        await self.changes.reaction(payload)

    # -- sessions -----------------------------------------------------------------

    def _new_client(self, taken_at: float | None = None, **shard: int) -> GatewayClient:
        """A guarded client (``shard_id``/``shard_count`` for one shard's session,
        ``taken_at`` when it was taken over from another replica)."""
        intents = discord.Intents.default()
        intents.message_content = True
        client = GatewayClient(self, taken_at=taken_at, intents=intents,
                               guild_ready_timeout=self.guild_ready_timeout,
                               allowed_mentions=NO_PINGS,
                               max_ratelimit_timeout=self.max_ratelimit_timeout, **shard)
        guard_parsers(client)
        skip_partial_updates(client)
        guard_frames(client)
        return client

    async def _run(self, client: GatewayClient) -> None:
        """Log in and keep the gateway connected until the client is closed.

        ``connect(reconnect=True)`` already resumes after network errors and
        Discord's own close codes. Anything else escaping it (a frame that is
        not JSON, a bug) would end the client for good, so it is logged and
        the connection is made again. Close codes 4010/4011 (the shard
        setting is wrong) raise :class:`SetupError` saying what to change.
        """
        await client.login(self._token)
        failures = 0
        while not client.is_closed():
            started = time.monotonic()
            try:
                await client.connect(reconnect=True)
            except discord.ConnectionClosed as exc:
                if exc.code in SHARDING_CLOSE_CODES:
                    raise SetupError(await self._sharding_problem(client, exc.code)) from None
                raise  # bad token, missing intents, other close codes: not recoverable
            except discord.ClientException:
                raise
            except Exception:
                if client.is_closed() or self._stopping:
                    return
                failures += 1
                delay = _RECONNECT.delay(failures)
                client.not_ready("gateway error; reconnecting")
                log.exception("discord: unexpected gateway error; reconnecting in %.1fs",
                              delay)
                if client.ws is not None:
                    with contextlib.suppress(Exception):
                        # 4000 keeps the session resumable on Discord's side.
                        await client.ws.close(code=4000)
                await asyncio.sleep(delay)
                if time.monotonic() - started > 60:
                    failures = 0  # it had been up for a while: the backoff starts over

    def _gateway_ended(self, client: GatewayClient, task: asyncio.Task[None]) -> None:
        """A session's runner ended: said once, and shown by :meth:`health` until a restart.

        A wrong shard setting (:class:`SetupError`) is one line without a traceback;
        the session is not retried (it would be refused again, in a loop).
        """
        if (task.cancelled() or task.exception() is None or self._stopping
                or not self._started):  # start() raises it instead
            return
        failure = task.exception()
        if isinstance(failure, SetupError):
            log.error("discord: %s", failure)
            client.not_ready("refused by Discord: shard setting; see the log")
            return
        shard = client.shard_id
        if (shard is not None and self.clients.get(shard) is client
                and not isinstance(failure, discord.ClientException)):
            # A held shard must not stay dead (no other replica would take it): a
            # transient failure (its login's REST call) opens it again after a pause.
            failures = self._failures[shard] = self._failures.get(shard, 0) + 1
            delay = _RECONNECT.delay(failures)
            log.error("discord: shard %d's session ended (%s: %s); opening it again in "
                      "%.1fs", shard, type(failure).__name__, failure, delay)
            client.not_ready("session ended; reopening")
            self.inflight.spawn(self._reopen(shard, client, delay))
            return
        log.error("discord: the gateway connection ended", exc_info=failure)
        client.not_ready(f"the gateway connection ended ({type(failure).__name__}); "
                         "restart Roost")

    async def _reopen(self, shard: int, client: GatewayClient, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.clients.get(shard) is client and not self._stopping:
            await self._close_shard(shard)
            self._open_shard(shard, taken_over=True)

    async def _start_shards(self) -> None:
        """Log the REST client in, take shards, return once the ones taken are ready."""
        self._failures = {}
        rest = self._new_client()
        self.rest.use(rest)
        await rest.login(self._token)
        leases = self._leases
        if leases is None:
            held = frozenset(range(self.shard_count))
        else:
            leases.start()
            held = await asyncio.wait_for(leases.wait_balanced(), self.ready_timeout)
        self._health = READY  # able to send even while other replicas hold every shard
        for shard in sorted(held):
            # Replicas: a free shard may have been another's a moment ago (it died).
            self._open_shard(shard, taken_over=leases is not None)
        waits = {shard: asyncio.ensure_future(self.clients[shard].connected.wait())
                 for shard in sorted(held)}
        try:
            for shard, ready in waits.items():
                runner = self.runners[shard]
                await asyncio.wait({ready, runner}, timeout=self.ready_timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
                if runner.done() and not runner.cancelled() and runner.exception():
                    raise runner.exception() or RuntimeError
                if not ready.done():
                    raise TimeoutError(f"Discord shard {shard} was not ready within "
                                       f"{self.ready_timeout:g}s")
        finally:
            for ready in waits.values():
                ready.cancel()
        if leases is not None:
            self._keeper = asyncio.create_task(self._keep(leases), name="discord-shards")
        self._started = True
        assert rest.user is not None
        log.info("discord: connected as %s (id %s); shards %s of %d run here", rest.user,
                 rest.user.id, ",".join(map(str, sorted(held))) or "none", self.shard_count)

    def _open_shard(self, shard: int, *, taken_over: bool = False) -> None:
        client = self._new_client(time.time() if taken_over else None, shard_id=shard,
                                  shard_count=self.shard_count)
        self.clients[shard] = client
        runner = asyncio.create_task(self._run(client), name=f"discord-shard-{shard}")
        runner.add_done_callback(lambda task: self._gateway_ended(client, task))
        self.runners[shard] = runner

    async def _close_shard(self, shard: int) -> None:
        client = self.clients.pop(shard, None)
        runner = self.runners.pop(shard, None)
        if client is not None:
            await client.close()
        if runner is not None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    async def _keep(self, leases: ShardLeases) -> None:
        """Follow the leases: close the sessions of shards lost, open those taken."""
        while True:
            held = await leases.wait_changed()
            try:
                for shard in sorted(s for s in self.clients if s is not None
                                    and s not in held):
                    log.info("discord: shard %d of %d is no longer held here; closing its "
                             "session (another replica takes it)", shard, self.shard_count)
                    await self._close_shard(shard)
                for shard in sorted(held - set(self.clients)):
                    log.info("discord: took shard %d of %d; connecting", shard,
                             self.shard_count)
                    self._open_shard(shard, taken_over=True)
            except Exception:
                # Never stop following: a replica that did would never take a shard over.
                log.exception("discord: following the shard leases failed")

    async def release_shards(self) -> None:
        """Give the leases back at once (shutdown): other replicas take the shards over.

        The sessions stay open until :meth:`stop`, for interactions being answered.
        """
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        if self._leases is not None:
            await self._leases.close()

    async def _stop_shards(self) -> None:
        await self.release_shards()
        for shard in [s for s in self.clients if s is not None]:
            await self._close_shard(shard)

    async def took_over(self, client: GatewayClient) -> None:
        """Read back what the shard's channels got since a lease before it was taken over.

        Between its previous holder's end and this session's READY, nobody received
        the shard's events and Discord does not replay them. The guild channels
        whose newest message is younger than ``lease_seconds`` (plus a margin) are
        read after that time (ids are timestamps); on replicas this runs for the
        shards taken at start too, since a free shard may be a dead replica's;
        the core drops what it already has (same message id). DMs (shard 0) are
        not read back: a DM channel is only known once a message arrives in it.
        """
        lease = float(getattr(self.settings, "lease_seconds", 30.0))
        after = snowflake_at((client.taken_at or time.time()) - lease - TAKEOVER_MARGIN)
        for guild in list(client.guilds):
            for channel in guild.text_channels:
                if not self.intake.open:
                    return
                newest = channel.last_message_id or 0
                if newest > after:
                    with contextlib.suppress(Exception):  # logged by the history reader
                        await self.inbound.catch_up_history(channel, channel.id, after)

    async def _sharding_problem(self, client: GatewayClient, code: int) -> str:
        """One line saying what to change after close code 4010 or 4011."""
        shard = f"shard {client.shard_id} of {client.shard_count}" \
            if client.shard_id is not None else "the unsharded session"
        if code == 4010:
            return (f"Discord refused {shard} (close code 4010, Invalid shard): set "
                    "ROOST_DISCORD_SHARD_COUNT to the same value on every replica")
        advice = "more"
        rest = self.rest.client
        if rest is not None and not rest.is_closed():
            with contextlib.suppress(Exception):
                recommended, _, _ = await rest.http.get_bot_gateway()
                advice = f"at least {recommended} (Discord's recommendation)"
        return (f"Discord refused {shard} (close code 4011, Sharding required: the bot is "
                f"in too many guilds for {client.shard_count or 1} shard(s)); set "
                f"ROOST_DISCORD_SHARD_COUNT to {advice}")
