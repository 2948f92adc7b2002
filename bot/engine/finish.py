"""How a run ends: :func:`complete`, :func:`refuse`, :func:`fail` or :func:`cancel`
(recorded as completed, refused, failed or cancelled).

A persisted run writes nothing itself: its result carries the :class:`RunCommit`
(history, usage, trace, reply) its caller writes with its own bookkeeping, and
the last event, announced after that write. A run that stores nothing, or was
cancelled, records only its trace. Each ending logs one line.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from bot.contracts.events import EventType, RunEvent
from bot.contracts.llm import ChatMessage
from bot.engine.guard import WITHHELD
from bot.engine.requests import RunCommit, RunResult
from bot.observability.tracing import Span, preview
from bot.storage.sessions import RunRecord

if TYPE_CHECKING:
    from bot.engine.runloop import Run

# A run's lines keep the run loop's logger name: the console's filter, the benches and
# operators' level settings select the per-run lines by it (README "How it works").
log = logging.getLogger("roost.engine.runloop")


async def complete(run: Run, final: str, cleaned: str, silent: bool) -> RunResult:
    """The answered run: ``final`` joins the history, ``cleaned`` is delivered unless silent."""
    req = run.req
    run.buffer.append(ChatMessage("assistant", final))
    run.trace.root.attributes["output_preview"] = preview(cleaned)
    reply = None if silent else cleaned
    commit = None
    if req.persist:
        # From here the run is answered: a follow-up must not merge into it.
        await run.emit("activity", phase="committing")
        commit = RunCommit(req.session, req.run_id, tuple(run.buffer), run.usage,
                           run.settings.model, run.provider.name, _record(run, "completed"),
                           _spans(run, "completed"), reply)
    else:
        await store_trace(run, "completed")
    _log(run, "completed")
    return RunResult(req.run_id, "completed", reply, run.usage, run.iterations, commit=commit,
                     ending=_event(run, "run.completed", content=cleaned, silent=silent,
                                   usage=_usage(run)))


async def refuse(run: Run, refusal: str, user_turn: ChatMessage | None = None) -> RunResult:
    """The run answers ``refusal`` without asking the model (guard, input checks, media).

    The history records ``user_turn`` (default: a withheld placeholder) and the refusal.
    """
    req, msg = run.req, run.req.message
    # The refused text is not stored: it would reach the model as history
    # with the sender's next message. ``user_turn`` is a harmless turn to store
    # instead (the lines of files Roost itself refused).
    exchange = (
        user_turn or ChatMessage("user", WITHHELD, sender_id=msg.sender_id,
                            sender_name=msg.display_name),
        ChatMessage("assistant", refusal),
    )
    commit = None
    if req.persist:
        commit = RunCommit(req.session, req.run_id, exchange, None, "", "",
                           _record(run, "refused"), _spans(run, "refused"), refusal)
    _log(run, "refused")
    return RunResult(req.run_id, "refused", refusal, run.usage, 0, commit=commit,
                     ending=_event(run, "run.completed", content=refusal, silent=False,
                                   refused=True,
                                   usage={"input_tokens": 0, "output_tokens": 0}))


async def fail(run: Run, error: str) -> RunResult:
    """The run failed with ``error``: the user gets an apology naming it."""
    req = run.req
    # Keep what the user said (so "try again" has context) but none of the
    # half-finished tool exchange.
    user = [m for m in run.buffer if m.role == "user"]
    apology = f"Sorry, I couldn't answer that: {error}"
    commit = None
    if req.persist:
        commit = RunCommit(req.session, req.run_id, tuple(user), run.usage, "", "",
                           _record(run, "failed", error), _spans(run, "failed", error),
                           apology, failed=True)
    else:
        await store_trace(run, "failed", error)
    _log(run, "failed", error)
    return RunResult(req.run_id, "failed", apology, run.usage, run.iterations, error,
                     commit=commit, ending=_event(run, "run.failed", error=error))


async def cancel(run: Run, reason: str) -> None:
    """The run was cancelled (``reason``: "stop", "merged", "shutdown"); nothing is written."""
    await store_trace(run, "cancelled", reason)
    _log(run, "cancelled", reason)
    # The tokens spent so far count against the budgets (bot.engine.budgets).
    await run.emit("run.cancelled", reason=reason, usage=_usage(run))


async def store_trace(run: Run, status: str, error: str = "") -> None:
    """Store the trace on its own; never raises (it runs on failure paths)."""
    try:
        await run.engine.store.record_run(_record(run, status, error),
                                          _spans(run, status, error))
    except Exception:
        log.exception("could not record the trace of run %s", run.req.run_id)


def _usage(run: Run) -> dict[str, int]:
    u = run.usage
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_read_tokens": u.cache_read_tokens, "cache_write_tokens": u.cache_write_tokens}


def _event(run: Run, type_: EventType, **payload: object) -> RunEvent:
    return RunEvent(type_, run.req.run_id, run.req.session.key, dict(payload))


def _record(run: Run, status: str, error: str = "") -> RunRecord:
    return RunRecord(
        run.req.run_id, run.req.session.key, status, run.trace.root.started_at,
        time.time(), run.iterations, run.usage.input_tokens, run.usage.output_tokens,
        run.settings.model, error, run.usage.cache_read_tokens, run.usage.cache_write_tokens,
    )


def _spans(run: Run, status: str, error: str = "") -> list[Span]:
    spans = run.trace.finish(status, error)
    if run.sink.export is not None:
        run.sink.export.export(spans)
    return spans


def _log(run: Run, status: str, error: str = "") -> None:
    log.info("run %s %s session=%s iterations=%d tokens=%d/%d %.0fms%s",
             run.req.run_id[:8], status, run.req.session.key, run.iterations,
             run.usage.input_tokens, run.usage.output_tokens,
             (time.monotonic() - run.started) * 1000, f" error={error}" if error else "")
