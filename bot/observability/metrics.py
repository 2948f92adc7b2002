"""Prometheus metrics: one :class:`RoostMetrics` per app, each with its own registry.

What is counted, and where it comes from:

* runs, LLM calls and tokens, tool calls: from each finished run's spans
  (:meth:`RoostMetrics.export`, the engine's span exporter). The spans carry the
  agent, the model, the token counts, the tool outcomes and the durations, which
  run events do not; and a ``roost_run_event`` observer would make every run
  emit events (and stream) just to be counted.
* deliveries: the dispatcher calls :meth:`RoostMetrics.delivery`.
* scheduler fires: the scheduler calls :meth:`RoostMetrics.fire`.
* breaker states, queue depth and active runs: read when scraped, from a
  :data:`GaugeSource` the app sets (nothing to keep in step).

Each app has its own :class:`~prometheus_client.CollectorRegistry` (never the
global one), so two apps in one process, or one test after another, do not
see each other's numbers. Label values come from configuration (agents,
models, channels) or from the tools offered; a tool name the model made up is
counted as ``unknown`` so it cannot grow the series without bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from bot.observability.tracing import Span, SpanExporter

__all__ = ["BREAKER_STATES", "CONTENT_TYPE", "GaugeSource", "Gauges", "RoostMetrics"]

log = logging.getLogger("roost.observability.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of :meth:`RoostMetrics.render` (Prometheus text format 0.0.4)."""

BREAKER_STATES: Mapping[str, int] = {"closed": 0, "half_open": 1, "open": 2}
"""``roost_breaker_state`` values: alert on ``> 0``."""

RUN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
"""Runs take from a fraction of a second (a scripted reply) to the 600 s run timeout."""
LLM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
"""One model call: first-token latency plus generation, up to minutes for long answers."""


@dataclass(slots=True)
class Gauges:
    """What the gauges show, read at scrape time.

    ``breakers`` maps a breaker's name (``tool:read_file``, ``provider:anthropic``)
    to its state (``closed``, ``half_open``, ``open``); ``queued`` is the messages
    waiting for a run, ``active_runs`` the runs in progress.
    """

    breakers: Mapping[str, str] = field(default_factory=dict)
    queued: int = 0
    active_runs: int = 0


GaugeSource = Callable[[], Gauges]
"""Reads the current :class:`Gauges` (must be cheap and must not raise)."""


class _GaugeCollector(Collector):
    """Builds the gauges from the app's :data:`GaugeSource` at each scrape."""

    def __init__(self) -> None:
        self.source: GaugeSource | None = None

    def read_from(self, source: GaugeSource) -> None:
        """Build the gauges from ``source`` from now on."""
        self.source = source

    def describe(self) -> Iterable[Metric]:
        # Declared so registering does not call collect() (the source is set later).
        return [GaugeMetricFamily("roost_breaker_state", ""),
                GaugeMetricFamily("roost_queue_depth", ""),
                GaugeMetricFamily("roost_active_runs", "")]

    def collect(self) -> Iterator[Metric]:
        gauges = Gauges()
        if self.source is not None:
            try:
                gauges = self.source()
            except Exception:
                log.exception("reading the gauges failed")
        breakers = GaugeMetricFamily(
            "roost_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open (probing), 2 open.",
            labels=["breaker"])
        for name, state in sorted(gauges.breakers.items()):
            breakers.add_metric([name], BREAKER_STATES.get(state, 2))
        yield breakers
        yield GaugeMetricFamily("roost_queue_depth",
                                "Messages waiting for a run (all sessions).", gauges.queued)
        yield GaugeMetricFamily("roost_active_runs", "Runs in progress.", gauges.active_runs)


class OfferedTools(Protocol):
    """The tools offered now (:class:`bot.engine.requests.CurrentPlugins` is one)."""

    def tool_names(self) -> list[str]:
        """Their names."""
        ...


class RoostMetrics:
    """The metric objects of one app, in a registry of their own.

    It is also a span exporter (:meth:`export`): it passes each run's spans on
    to ``then`` after counting them.
    """

    def __init__(self, *, tools: OfferedTools | None = None,
                 then: SpanExporter | None = None) -> None:
        """``tools`` names the tools offered now (others count as ``unknown``)."""
        self.registry = CollectorRegistry()
        self.then = then
        """The span exporter each run's spans go to after being counted (OpenTelemetry)."""
        self.tools = tools
        r = self.registry
        self.runs = Counter("roost_runs", "Finished runs, by agent and status "
                            "(completed, failed, cancelled, refused).",
                            ["agent", "status"], registry=r)
        self.run_seconds = Histogram("roost_run_seconds", "Duration of a run, by agent.",
                                     ["agent"], buckets=RUN_BUCKETS, registry=r)
        self.llm_calls = Counter("roost_llm_calls", "Model calls (compaction included), "
                                 "by model and outcome (ok, error).",
                                 ["agent", "model", "outcome"], registry=r)
        self.llm_seconds = Histogram("roost_llm_seconds", "Duration of a model call "
                                     "(retries included), by model.", ["model"],
                                     buckets=LLM_BUCKETS, registry=r)
        self.llm_tokens = Counter("roost_llm_tokens", "Tokens the provider reported, by "
                                  "direction (input, output).",
                                  ["agent", "model", "direction"], registry=r)
        self.tool_calls = Counter("roost_tool_calls", "Tool calls, by outcome (ok, error, "
                                  "timeout, breaker_open, skipped, cancelled).",
                                  ["tool", "outcome"], registry=r)
        self.deliveries = Counter("roost_deliveries", "Replies handed to a channel, by "
                                  "outcome (ok; failed: kept and retried; given_up).",
                                  ["channel", "outcome"], registry=r)
        self.scheduler_fires = Counter("roost_scheduler_fires", "Scheduled jobs run, by "
                                       "kind (cron, system).", ["kind"], registry=r)
        self._gauges = _GaugeCollector()
        r.register(self._gauges)
        # Labelled children by (metric, label values): prometheus-client's labels()
        # takes a lock and validates each time (~5 us); runs reuse a few series.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def set_gauges(self, source: GaugeSource) -> None:
        """Read breaker states, queue depth and active runs from ``source`` when scraped."""
        self._gauges.read_from(source)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)

    # -- feeding --------------------------------------------------------------------

    def delivery(self, channel: str, outcome: str) -> None:
        """Count one delivery attempt of a reply: ``ok``, ``failed`` or ``given_up``."""
        self._child(self.deliveries, channel, outcome).inc()

    def fire(self, kind: str) -> None:
        """Count one scheduled run started (``cron`` or ``system``)."""
        self._child(self.scheduler_fires, kind).inc()

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def export(self, spans: Sequence[Span]) -> None:
        """Count one finished run from its spans, then pass them to :attr:`then`.

        Never raises: the engine calls it on the run's own path.
        """
        try:
            self._count(spans)
        except Exception:
            log.exception("counting the spans of a run failed")
        if self.then is not None:
            self.then.export(spans)

    def _count(self, spans: Sequence[Span]) -> None:
        root = next((s for s in spans if s.kind == "agent"), None)
        agent = str(root.attributes.get("agent") or "unknown") if root else "unknown"
        known = set(self.tools.tool_names()) if self.tools is not None else None
        for span in spans:
            a = span.attributes
            if span.kind == "agent":
                self._child(self.runs, agent, str(a.get("status") or "unknown")).inc()
                self._child(self.run_seconds, agent).observe(span.duration_ms / 1000)
            elif span.kind == "llm":
                model = str(a.get("model") or "unknown")
                self._child(self.llm_calls, agent, model,
                            "error" if span.error else "ok").inc()
                self._child(self.llm_seconds, model).observe(span.duration_ms / 1000)
                for direction in ("input", "output"):
                    tokens = a.get(f"{direction}_tokens")
                    if isinstance(tokens, int) and tokens > 0:
                        self._child(self.llm_tokens, agent, model, direction).inc(tokens)
            elif span.kind == "tool":
                name = span.name
                if a.get("error_code") == "UNKNOWN_TOOL" or (known is not None
                                                               and name not in known):
                    name = "unknown"
                self._child(self.tool_calls, name, _tool_outcome(span)).inc()


def _tool_outcome(span: Span) -> str:
    a = span.attributes
    if a.get("interrupted"):
        return "cancelled"
    if a.get("skipped"):
        return "skipped"
    if not a.get("is_error"):
        return "ok"
    if a.get("error_code") == "CIRCUIT_OPEN":
        return "breaker_open"
    if a.get("timed_out"):
        return "timeout"
    return "error"
