"""The active-run registry: which runs are in flight, and aborting them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class ActiveRun:
    """A run in flight. ``cancel_reason`` says why it was cancelled, if it was."""

    run_id: str
    session_key: str
    task: asyncio.Task[None]
    started_at: float
    cancel_reason: str = ""

    def cancel(self, reason: str) -> None:
        """Cancel its task, remembering ``reason`` ("stop", "merged", "shutdown")."""
        self.cancel_reason = reason
        self.task.cancel(reason)


@dataclass
class RunRegistry:
    """Every in-flight run by id, in start order per session."""

    runs: dict[str, ActiveRun] = field(default_factory=dict)

    def register(self, run: ActiveRun) -> None:
        """Track ``run`` until :meth:`unregister`."""
        self.runs[run.run_id] = run

    def unregister(self, run_id: str) -> None:
        """Forget a finished run."""
        self.runs.pop(run_id, None)

    def for_session(self, session_key: str) -> list[ActiveRun]:
        """In-flight runs of one session, oldest first, leaving out cancelled ones."""
        return sorted((r for r in self.runs.values()
                       if r.session_key == session_key and not r.cancel_reason),
                      key=lambda r: r.started_at)

    def abort(self, run_id: str, session_key: str, reason: str = "stop") -> bool:
        """Cancel one run, only if it belongs to ``session_key``."""
        run = self.runs.get(run_id)
        if (run is None or run.session_key != session_key or run.task.done()
                or run.cancel_reason):
            return False
        run.cancel(reason)
        return True

    def abort_session(self, session_key: str, reason: str = "stop") -> int:
        """Cancel every run of a session; returns how many were cancelled."""
        return sum(self.abort(r.run_id, session_key, reason)
                   for r in self.for_session(session_key))

    def abort_all(self, reason: str = "shutdown") -> int:
        """Cancel every run (shutdown)."""
        return sum(self.abort(r.run_id, r.session_key, reason) for r in list(self.runs.values()))
