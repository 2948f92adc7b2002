"""What the Control UI's operator does to a conversation, by the functions the chat
commands and the engine use: stop its oldest running run (``/stop``: here, else on the
replica running it, over the control channel), reset it (``/new``), compact it now
(the post-run compaction, started by hand).

Each returns a short outcome code the page turns into a notice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.contracts.llm import agent_of

if TYPE_CHECKING:
    from bot.app.roost import Roost


async def stop_run(app: Roost, key: str) -> str:
    """``stopped`` when a run of session ``key`` was stopped (here or on another
    replica), else ``idle`` — what ``/stop`` answers in the chat."""
    runtime = app.runtime
    if runtime.stop_oldest(key):
        return "stopped"
    runs, _ = await runtime.stop_elsewhere(key, "stop")
    return "stopped" if runs else "idle"


async def reset_session(app: Roost, key: str) -> int:
    """Archive session ``key`` and start an empty one (``/new``); the new one's id."""
    return (await app.store.reset(key)).id


async def compact_now(app: Roost, key: str) -> str:
    """Summarize all but the last few messages of session ``key`` now, as the
    post-run compaction does, under its agent's model: ``compacted``,
    ``not-compacted`` (too short, or the session changed meanwhile) or ``busy``
    (a compaction of it is running)."""
    runtime = app.runtime
    if runtime.compacting(key):
        return "busy"
    with runtime.hold_compaction(key):
        session = await app.store.get(key)
        agent = await app.router.get(agent_of(key))
        # The store checks the summarized messages against the stored session, so a
        # copy evicted from the cache meanwhile, or a turn stored meanwhile, is safe.
        done = await app.engine.compactor.compact(session, agent)
    return "compacted" if done else "not-compacted"
