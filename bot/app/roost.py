"""The running service and its composition root.

:meth:`Roost.create` builds the whole object graph once, each part given its
collaborators as constructor arguments: settings, plugins, store, provider,
plugin state, metrics, the run sink, agents, engine, dispatcher, channels.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from types import MappingProxyType
from typing import Any

from bot.agents.router import AgentResolver, AgentRouter
from bot.app.approvals_command import approvals_command
from bot.app.error_channel import error_channel
from bot.app.http import HealthServer, instrument
from bot.app.offers import (
    apply_tool_groups,
    collect_judges,
    resolve_provider,
    unique_by_name,
)
from bot.app.runtime import AppRuntime
from bot.app.sender import ChannelSender
from bot.app.services import AppServices as Services
from bot.config.settings import Settings, SetupError
from bot.contracts.channel import Channel, ChannelContext, ChannelSpec
from bot.contracts.commands import Command
from bot.contracts.llm import LLMProvider
from bot.contracts.messages import OutboundMessage
from bot.dispatch.dispatcher import Dispatcher, Leftovers
from bot.dispatch.intake import ChatPolicy, PairingPolicy
from bot.engine.approvals import Approvals
from bot.engine.budgets import Budgets
from bot.engine.context import Estimators
from bot.engine.gates import GateChain, InputGuard, all_gates
from bot.engine.requests import CurrentPlugins, PluginSnapshot, RunSink
from bot.engine.run_engine import RunEngine
from bot.observability.metrics import RoostMetrics
from bot.observability.otel import OTelExporter
from bot.pluginhost.manager import ESSENTIAL_PLUGINS, RESTART_HOOKS, PluginHost, get_plugin_manager
from bot.pluginhost.migrations import migrate_plugins
from bot.pluginhost.state import load_disabled, save_state
from bot.scheduling.scheduler import Scheduler
from bot.storage.access import AccessStore
from bot.storage.approvals import ApprovalStore
from bot.storage.channel_state import ChannelStateStore
from bot.storage.chatter import GroupChatter
from bot.storage.claims import Claims, fit_replica_id
from bot.storage.control import Control, open_control
from bot.storage.db import is_postgres_url, retire_columns
from bot.storage.errors import ErrorStore, ResultStore
from bot.storage.inbox import Inbox
from bot.storage.jobs import JobStore
from bot.storage.leader import Leader, check_period, replica_id
from bot.storage.retention import prune_stores
from bot.storage.sessions import SessionStore
from bot.storage.usage import UsageStore

log = logging.getLogger("roost")


class Roost:
    """One Roost service. Build it with :meth:`create`, end it with :meth:`close`."""

    def __init__(self, settings: Settings, host: PluginHost, store: SessionStore,
                 engine: RunEngine, commands: dict[str, Command],
                 channel_specs: dict[str, ChannelSpec], services: Services, *,
                 router: AgentRouter, plugins: CurrentPlugins, metrics: RoostMetrics,
                 channels: dict[str, Channel], sender: ChannelSender, replica: str,
                 leader: Leader, claims: Claims | None, gates: GateChain, policy: ChatPolicy,
                 pairing: PairingPolicy, budgets: Budgets, approvals: Approvals) -> None:
        """Parts :meth:`create` built; ``services`` has its inbox, access and usage stores."""
        assert services.inbox is not None
        self.settings = settings
        self.host = host
        self.store = store
        self.services = services
        self.engine = engine
        self.commands = commands
        self.channel_specs = channel_specs
        self.channels = channels
        self.sender = sender
        self._background: set[asyncio.Future[None]] = set()
        self.inbox: Inbox = services.inbox
        """Inbound messages, run journals and replies awaiting delivery."""
        self.plugins = plugins
        """The current plugin state, shared by the engine, the agents and the metrics."""
        self.metrics = metrics
        """This app's Prometheus metrics, in a registry of its own (``/metrics``)."""
        self.http: HealthServer | None = None
        """The health and metrics server, once :meth:`serve_http` started it."""
        self.replica = replica
        """This process's name among replicas (``hostname-pid-random``, the host name
        shortened to fit PostgreSQL's names; leases, /stop)."""
        self.leader = leader
        """Whether this process leads (always on SQLite; elected on PostgreSQL)."""
        self.control: Control | None = None
        """Commands to and from other replicas (PostgreSQL): /stop, cache invalidation."""
        self._leftovers: Leftovers = ([], [])
        self.router = router
        """The agents; the dispatcher routes chats with it before a run exists, the
        engine resolves each run's agent through it."""
        self.approvals = approvals
        """Asks before tool calls that need approval; decides the prompts' presses."""
        self.runtime = AppRuntime(self)
        """What plugins, commands and jobs receive instead of this object."""
        self.dispatcher = Dispatcher(
            settings, inbox=self.inbox, store=store, engine=engine, router=self.router,
            channels=self.channels, commands=lambda: self.commands, runtime=self.runtime,
            gates=gates, policy=policy, pairing=pairing, budgets=budgets, claims=claims,
            deliveries=metrics, presses=approvals,
            reactions=lambda reaction: host.hooks.roost_reaction(reaction=reaction,
                                                                  app=self.runtime))

    @property
    def provider(self) -> LLMProvider:
        """The LLM provider runs use."""
        return self.engine.provider

    @classmethod
    async def create(cls, settings: Settings, *, host: PluginHost | None = None,
                     provider: LLMProvider | None = None,
                     scheduler_clock: Callable[[], datetime] | None = None) -> Roost:
        """Load plugins, open the database, build the engine and start the scheduler.

        ``provider`` overrides the configured one (tests, embedding).
        ``scheduler_clock`` replaces real time for the scheduler, which then
        fires only when told to (``services.scheduler.run_due``; tests, benches).
        """
        store = await SessionStore.open(settings.database, settings.session_cache_size,
                                        settings.database_pool_size,
                                        settings.database_connect_attempts)
        try:
            # Plugins an admin disabled stay disabled; essential ones cannot be.
            saved = await load_disabled(store.db, store.lock)
            if host is None:
                host = get_plugin_manager(disabled=saved)
            else:  # built by the caller (tests, embedders)
                host.apply_saved(saved)
            # Plugins' own tables before anything uses them; columns Roost retired go
            # only once every plugin that may copy them out has migrated.
            if await migrate_plugins(host, store.db, store.lock):
                await retire_columns(store.db, store.lock)
            if provider is None:
                provider = (await resolve_provider(settings, host)).create(settings)
            plugins = CurrentPlugins(PluginSnapshot.of(
                InputGuard([], settings.guard_mode, settings.guard_modes)))
            # Metrics count each run's spans, then pass them on (OpenTelemetry).
            metrics = RoostMetrics(tools=plugins,
                                   then=OTelExporter.from_environment())
            try:
                scheduler = Scheduler(JobStore(store.db, store.lock), settings,
                                      clock=scheduler_clock, on_fire=metrics.fire)
            except ValueError as exc:  # a bad timezone setting
                raise SetupError(str(exc)) from None
            url = settings.database if isinstance(settings.database, str) else None
            postgres = url is not None and is_postgres_url(url)
            replica = fit_replica_id(replica_id())
            # With replicas, the replies this one commits are its to send.
            inbox = Inbox(store.db, store.lock, store.writer, owner=replica if postgres else None)
            # Pairing codes and spent tokens: one store each, shared by the
            # dispatcher, commands (/pair, /usage, /status) and tests.
            access = AccessStore(store.db, store.lock, store.writer,
                                 ttl=settings.pairing_code_ttl)
            usage = UsageStore(store.db, store.lock, store.writer)
            services = Services(
                store, errors=ErrorStore(store.db, store.lock),
                results=ResultStore(store.db, store.lock), scheduler=scheduler, inbox=inbox,
                access=access, usage=usage, plugin_configs=host.config)
            await prune_stores(services, settings.error_retention_days,
                               trace_days=settings.trace_retention_days)
            await host.validate_configs(settings.plugins)
            channel_specs = unique_by_name(await host.hooks.roost_channels(settings=settings))
            # Routing happens before a run exists (the dispatcher), so the router is built
            # here and handed to both.
            router = AgentRouter(AgentResolver(settings, host, provider, plugins.judges))
            channels: dict[str, Channel] = {}  # the running ones, filled by add_channel
            sender = ChannelSender(channels)
            on_tool_failure, on_large_result = error_channel(services)
            sink = RunSink(on_tool_failure, on_large_result, deliver=sender, export=metrics)
            # Who is answered and how: one chain, its first stages run by the dispatcher,
            # the rest by each run.
            estimators = Estimators()
            policy = ChatPolicy(settings, GroupChatter(inbox.writer))
            pairing = PairingPolicy(settings, access)
            budgets = Budgets(settings, usage, estimators.for_provider)
            gates = GateChain(all_gates(policy, pairing, inbox, budgets, host))
            approvals = Approvals(settings, ApprovalStore(store.db, store.lock, store.writer),
                                  channels, settings.data_dir / "approvals")
            engine = RunEngine(settings, host, store, provider, {}, [], agents=router,
                               plugins=plugins, channels=channels, sink=sink, gates=gates,
                               estimators=estimators, approvals=approvals)
            # Replicas may share this database: one of them long-polls (see add_channel),
            # and each session's messages run on the replica holding its lease.
            leader = Leader(url if postgres else None,
                            check_every=check_period(settings.lease_seconds))
            claims = Claims(store.db, store.lock, replica,
                            lease_seconds=settings.lease_seconds) if postgres else None
            app = cls(settings, host, store, engine, {}, channel_specs, services,
                      router=router, plugins=plugins, metrics=metrics, channels=channels,
                      sender=sender, replica=replica, leader=leader, claims=claims,
                      gates=gates, policy=policy, pairing=pairing, budgets=budgets,
                      approvals=approvals)
        except BaseException:
            await store.close()
            raise
        try:
            await app._begin()
            instrument(app)  # the gauges: breaker states, queue depth, active runs
            await app.refresh_plugins(jobs=False)
            await host.hooks.roost_startup(app=app.runtime)
            jobs = unique_by_name(await host.hooks.roost_scheduled_jobs(settings=settings))
            await _quietly(scheduler.start(app.runtime, list(jobs.values())),
                           "starting the scheduler")
        except BaseException:
            # Nothing of a half-started app may outlive it: the leader's and the control
            # connection's tasks, the heartbeat and leases, the database.
            await app.close()
            raise
        return app

    async def _begin(self) -> None:
        """Join the other replicas, or read what a previous process left."""
        replicas = self.dispatcher.replicas
        if replicas is not None:
            self.leader.start()
            self.control = await open_control(self.store.db, self.replica, self._stop_here,
                                              self._reload_changed)
            # Alive from now on: replies committed before recover() are not taken for a
            # dead replica's; leases are claimed by recover(), once channels deliver.
            await replicas.claims.renew(())
            return
        # Read before any channel receives: what arrives from now on is this process's.
        # With replicas, unfinished entries are claimed (their sessions' leases) and
        # dead replicas' replies taken over (one taker each), not read here.
        self._leftovers = (await self.inbox.undelivered(), await self.inbox.unfinished())

    def plugin_config(self, name: str) -> Any:
        """Plugin ``name``'s validated configuration object, or ``None``."""
        return self.host.config.get(name)

    async def refresh_plugins(self, *, jobs: bool = True) -> None:
        """Collect tools, sanitizers, guard patterns and commands from the enabled plugins.

        Runs at startup and whenever a plugin is enabled or disabled; runs in
        flight keep what they started with. Prompt sections and input checks
        are asked for per run, so they follow without this. ``jobs`` also
        re-syncs the scheduler's system jobs.
        """
        host, settings = self.host, self.settings
        groups: dict[str, str] = {}
        # web_search (plugins/web) picks its engine among these, so they come first.
        self.services = dataclasses.replace(self.services, search_backends=tuple(
            await host.hooks.roost_search_backends(settings=settings)))
        tools = unique_by_name(
            await host.hooks.roost_tools(settings=settings, services=self.services), groups)
        apply_tool_groups(tools, groups)
        sanitizers = list(await host.hooks.roost_output_sanitizers(settings=settings))
        guard = InputGuard(
            list(await host.hooks.roost_guard_patterns(settings=settings)),
            settings.guard_mode, settings.guard_modes)
        # One swap: a run sees the old state or the new one, never a mix.
        self.plugins.replace(PluginSnapshot.of(guard, tools, groups, sanitizers,
                                               await collect_judges(host, settings)))
        # Agents hold judges and filtered tool lists: resolve them again.
        self.router.invalidate()
        commands: dict[str, Command] = {}
        for command in unique_by_name(await host.hooks.roost_commands(settings=settings)).values():
            for name in (command.name, *command.aliases):
                commands.setdefault(name, command)
        commands.setdefault("approvals", approvals_command(self.approvals.store))
        self.commands = commands
        if not jobs:
            return
        unique = list({id(c): c for c in commands.values()}.values())
        for channel in self.channels.values():
            await _quietly(channel.register_commands(unique),
                           f"registering the commands of {channel.name}")
        scheduler = self.services.scheduler
        if scheduler is not None:
            specs = unique_by_name(await host.hooks.roost_scheduled_jobs(settings=settings))
            await _quietly(scheduler.sync_system(list(specs.values())),
                           "updating the scheduled jobs of plugins")

    async def refresh_tools(self) -> None:
        """Collect the enabled plugins' tools again and swap them in, nothing else.

        For plugins whose tools change at run time (an MCP server's list);
        runs in flight keep the tools they started with.
        """
        groups: dict[str, str] = {}
        tools = unique_by_name(await self.host.hooks.roost_tools(
            settings=self.settings, services=self.services), groups)
        apply_tool_groups(tools, groups)
        self.plugins.replace(dataclasses.replace(
            self.plugins.now, tools=MappingProxyType(tools),
            tool_groups=MappingProxyType(groups)))
        self.router.invalidate()

    async def set_plugin_enabled(self, name: str, enabled: bool) -> str:
        """Enable or disable plugin ``name`` now and persist it; returns what happened."""
        host = self.host
        if host.pm.get_plugin(name) is None:
            known = ", ".join(sorted(host.info)) or "none"
            return f"No plugin named {name!r} is loaded (loaded: {known})."
        if not enabled and name in ESSENTIAL_PLUGINS:
            return f"{name} is essential to Roost and cannot be disabled."
        if enabled and name in host.bad_config:
            return (f"{name} stays disabled: {host.errors.get(name, 'invalid configuration')}. "
                    "Fix its configuration and restart Roost.")
        was_enabled = name not in host.disabled
        await save_state(self.store.db, self.store.lock, name, enabled)
        if enabled:
            host.disabled.discard(name)
        else:
            host.disabled.add(name)
        state = "enabled" if enabled else "disabled"
        if was_enabled == enabled:
            return f"{name} is already {state}."
        await self.refresh_plugins()
        log.info("plugin %s %s", name, state)
        if self.control is not None:
            await self.control.invalidate("plugins")  # the other replicas follow
        message = f"{name} is now {state}."
        restart = sorted(set(host.hooks_of(name)) & RESTART_HOOKS)
        if restart:
            message += (f" Its {' and '.join(h.removeprefix('roost_') for h in restart)} "
                        "change only after a restart.")
        return message

    def _stop_here(self, command: str, key: str) -> tuple[int, int]:
        """``/stop`` or ``/stopall`` for session ``key`` asked by another replica."""
        if command == "stopall":
            return self.dispatcher.stop_all(key)
        return (1, 0) if self.dispatcher.stop_oldest(key) else (0, 0)

    async def _reload_changed(self, what: str, name: str) -> None:
        """Reload what another replica changed (``Control.invalidate``)."""
        log.info("reloading %s %s: changed by another replica", what, name)
        if what == "plugins":
            self.host.apply_saved(await load_disabled(self.store.db, self.store.lock),
                                  replace=True)
            await self.refresh_plugins()
        elif what == "agent":
            await self.router.reread()
            self.router.invalidate(name or None)
        elif what == "pairing" and self.services.access is not None:
            self.services.access.forget_cached()

    async def serve_http(self, expected: list[str] | None = None) -> HealthServer | None:
        """Start ``/healthz``, ``/readyz`` and ``/metrics`` if ``http_port`` is set.

        ``expected`` names channels ``/readyz`` waits for before they run (by
        default the configured ones). :meth:`close` stops the server last.
        Raises :class:`SetupError` when the port cannot be bound.
        """
        if not self.settings.http_port or self.http is not None:
            return self.http
        server = HealthServer(self, self.settings.http_host, self.settings.http_port,
                              expected=self.configured_channels() if expected is None
                              else expected)
        await server.start()
        self.http = server
        return server

    def configured_channels(self) -> list[str]:
        """Channels whose credentials are set, which ``roost run`` starts."""
        return [name for name, spec in self.channel_specs.items() if spec.configured(self.settings)]

    async def start_channel(self, name: str) -> Channel:
        """Create and start the channel ``name``; inbound messages go to the dispatcher."""
        spec = self.channel_specs.get(name)
        if spec is None:
            raise SetupError(f"no channel named {name!r}; known: {', '.join(self.channel_specs)}")
        shared_secret_missing(self.settings, name)
        channel = spec.create(self.settings)
        await self.add_channel(channel)
        return channel

    async def send_now(self, message: OutboundMessage) -> str | None:
        """Deliver ``message`` through its channel at once (:class:`ChannelSender`)."""
        return await self.sender(message)

    async def add_channel(self, channel: Channel) -> None:
        """Start an already built channel (tests and embedders use this)."""
        self.channels[channel.name] = channel
        await channel.begin(self.dispatcher.receive, ChannelContext(
            http_routes=self.http,  # its webhook may share the server's port
            # Long polling and Socket Mode on one replica; bot-wide send limits shared.
            leadership=self.leader if is_postgres_url(self.settings.database) else None,
            replicas=self.dispatcher.replicas,
            state=ChannelStateStore(channel.name, self.store.db, self.store.lock,
                                    self.store.writer)))
        unique = {id(c): c for c in self.commands.values()}
        try:
            await channel.register_commands(list(unique.values()))
        except Exception:
            log.exception("channel %s could not register its commands", channel.name)
        log.info("channel %s ready", channel.name)
        if self.services.scheduler is not None:
            # Jobs of this channel that came due while it was down run now.
            await _quietly(self.services.scheduler.channel_started(channel.name),
                           f"catching up the scheduled jobs of {channel.name}")

    async def recover(self) -> None:
        """Finish what a previous process left: replies, unfinished runs, missed messages.

        Call once the channels are started. Channels that cannot redeliver
        (Discord) read back the recently active chats' history.
        """
        leftovers, self._leftovers = self._leftovers, ([], [])
        await self.dispatcher.recover(leftovers)
        if self.dispatcher.replicas is not None:
            await self.dispatcher.replicas.start(self.store.db)
        since = time.time() - self.settings.catch_up_hours * 3600
        for name, channel in self.channels.items():
            if not self.settings.catch_up_chats:
                break
            cursors = await self.inbox.cursors(name, since, self.settings.catch_up_chats)
            if cursors:
                self.background(channel.catch_up(cursors), f"catching up {name}")

    def background(self, work: Awaitable[Any], what: str) -> asyncio.Future[Any]:
        """Run ``work`` in the background; failures are logged, shutdown cancels it."""
        task = asyncio.ensure_future(_quietly(work, what))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def hold_runs(self, work: Awaitable[Any], what: str) -> None:
        """:meth:`background`, and runs starting before ``work`` ends wait for it."""
        self.engine.hold_runs(self.background(work, what))

    async def close(self) -> None:
        """Stop the scheduler and intake, cancel runs, stop channels, close everything."""
        if self.http is not None:
            self.http.begin_shutdown()  # /readyz: 503 from now on; /healthz answers to the end
        if self.services.scheduler is not None:
            await _quietly(self.services.scheduler.close(), "stopping the scheduler")
        for task in list(self._background):
            task.cancel()
        for channel in list(self.channels.values()):
            await _quietly(channel.stop_intake(), f"stopping intake of {channel.name}")
        # Runs first, while channels are still up: runs in flight may finish
        # and deliver within the grace period, and a cancelled run's streaming
        # draft can be withdrawn. The dispatcher refuses new messages meanwhile
        # (channels do not acknowledge them, so platforms deliver them again).
        await self.dispatcher.close(self.settings.shutdown_grace_seconds)
        if self.dispatcher.replicas is not None:
            # Leases and the replies left go to the other replicas now, not after the lease.
            await _quietly(self.dispatcher.replicas.hand_over(), "handing work over")
        for channel in list(self.channels.values()):
            await _quietly(channel.stop(), f"stopping channel {channel.name}")
        await self.engine.compactor.wait()
        await self.host.hooks.roost_shutdown(app=self.runtime)
        if isinstance(self.metrics.then, OTelExporter):
            self.metrics.then.shutdown()
        await _quietly(self.engine.provider.aclose(), "closing the provider")
        await _quietly(self.router.aclose(), "closing the agents' providers")
        for pending in (self.services.errors, self.services.results):
            if pending is not None:
                await _quietly(pending.flush(), "finishing stored errors and results")
        await _quietly(self.leader.close(), "giving up leadership")
        if self.control is not None:
            await _quietly(self.control.close(), "closing the control connection")
        await self.store.close()
        if self.http is not None:
            await _quietly(self.http.close(), "stopping the health and metrics server")


def shared_secret_missing(settings: Settings, channel: str) -> None:
    """Refuse a webhook without an explicit secret on PostgreSQL (:class:`SetupError`).

    Replicas behind a load balancer must all check the same secret: one derived
    or generated per process would make the others refuse the platform's calls.
    """
    if not is_postgres_url(settings.database):
        return
    if (channel == "telegram" and settings.telegram_webhook_url
            and settings.telegram_webhook_secret is None):
        raise SetupError("Telegram webhook mode on PostgreSQL (replicas) needs "
                         "ROOST_TELEGRAM_WEBHOOK_SECRET set explicitly, the same on every replica")
    if (channel == "slack" and settings.slack_app_token is None
            and settings.slack_signing_secret is None):
        raise SetupError("the Slack Events API on PostgreSQL (replicas) needs "
                         "SLACK_SIGNING_SECRET set explicitly, the same on every replica")


async def _quietly(awaitable: Awaitable[Any], what: str) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("%s failed", what)
