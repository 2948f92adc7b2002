"""Re-emit a finished run's trace through OpenTelemetry.

Roost records its own spans (:mod:`bot.observability.tracing`) and stores them with the run.
When OpenTelemetry is installed *and configured*, :class:`OTelExporter` also
replays those spans into an OpenTelemetry tracer after the run finishes, with
their original start and end times, so they show up in Jaeger, Tempo, Honeycomb
and friends. OpenTelemetry is optional (``pip install roost[otel]``): it is only
imported inside :meth:`OTelExporter.from_environment`.

"Configured" means one of, checked in this order:

1. The embedder set a global tracer provider
   (``opentelemetry.trace.set_tracer_provider(...)``, or the
   ``opentelemetry-instrument`` auto-instrumentation did): Roost's spans go to
   that provider, whatever the ``OTEL_*`` variables say. Only the API package
   is needed for this.
2. ``OTEL_TRACES_EXPORTER`` names exporters (``otlp``, ``console``, ...; ``none``
   disables), or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
   ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (meaning ``otlp``): Roost
   builds a private SDK ``TracerProvider`` (never installed globally) with a
   ``BatchSpanProcessor`` per exporter. Exporters are looked up under the
   ``opentelemetry_traces_exporter`` entry point group, as the OpenTelemetry
   auto-configuration does, and build themselves from the usual ``OTEL_*``
   variables (endpoint, headers, ...). ``otlp`` honours
   ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` (``grpc`` or ``http/protobuf``).
   The resource reads ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``;
   ``service.name`` defaults to ``roost``. If the SDK or a named exporter is not
   installed, one warning is logged and export stays off.

``OTEL_SDK_DISABLED=true`` turns everything off. Anything else is "not
configured" and :meth:`OTelExporter.from_environment` returns ``None``.

Span mapping: the root ``agent`` span becomes ``roost.run`` (kind INTERNAL),
``llm`` spans ``roost.llm <model>`` (CLIENT) and ``tool`` spans
``roost.tool <name>`` (INTERNAL), children of the run's span in a new trace.
Attributes follow the GenAI semantic conventions where one fits
(``gen_ai.provider.name``/``gen_ai.system``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.tool.name``, ...) and
``roost.*`` otherwise (``roost.session_key``, ``roost.run.status``,
``roost.tool.name``, ...). Error spans get status ERROR and ``error.type``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from bot import __version__
from bot.observability.tracing import Span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import SpanKind, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue

log = logging.getLogger("roost.observability.otel")

INSTRUMENTATION_SCOPE = "roost"
DEFAULT_SERVICE_NAME = "roost"
EXPORTER_ENTRY_POINT_GROUP = "opentelemetry_traces_exporter"

# Environment variables that, alone, can make OpenTelemetry "configured".
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")

# Roost attribute name -> OpenTelemetry attribute names, per span kind.
_ATTRIBUTE_KEYS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "agent": {
        "session_key": ("roost.session_key",),
        "status": ("roost.run.status",),
        "error_message": ("roost.run.error_message",),
    },
    "llm": {
        "provider": ("gen_ai.provider.name", "gen_ai.system"),
        "model": ("gen_ai.request.model",),
        "input_tokens": ("gen_ai.usage.input_tokens",),
        "output_tokens": ("gen_ai.usage.output_tokens",),
        "cache_read_tokens": ("gen_ai.usage.cache_read.input_tokens",),
        "cache_write_tokens": ("gen_ai.usage.cache_creation.input_tokens",),
        "iteration": ("roost.llm.iteration",),
        "output_preview": ("roost.llm.output_preview",),
        "input": ("roost.llm.input",),
    },
    "tool": {
        "name": ("gen_ai.tool.name", "roost.tool.name"),
        "call_id": ("gen_ai.tool.call.id", "roost.tool.call_id"),
        "is_error": ("roost.tool.is_error",),
    },
}
_COMMON_KEYS: Mapping[str, tuple[str, ...]] = {"interrupted": ("roost.interrupted",)}
_KIND_PREFIX = {"agent": "roost.run", "llm": "roost.llm", "tool": "roost.tool"}
_OPERATION = {"agent": "invoke_agent", "llm": "chat", "tool": "execute_tool"}


class OTelExporter:
    """Replays finished runs' spans into an OpenTelemetry tracer provider.

    Build it with :meth:`from_environment` (``None`` when OpenTelemetry is
    missing or not configured), or pass ``tracer_provider`` explicitly (tests,
    embedders that keep their provider private). Then call :meth:`export` with a
    finished run's spans; it never raises.
    """

    def __init__(self, tracer_provider: TracerProvider, *, owns_provider: bool = False) -> None:
        """Export through ``tracer_provider``; ``owns_provider`` makes :meth:`shutdown` close it."""
        self.tracer_provider = tracer_provider
        self._owns_provider = owns_provider
        self._tracer: Tracer = tracer_provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)

    @classmethod
    def from_environment(cls) -> OTelExporter | None:
        """An exporter if OpenTelemetry is installed and configured, else ``None``.

        See the module docstring for what "configured" means. Cheap when it is
        not: no OpenTelemetry import happens unless the API is already loaded or
        an ``OTEL_*`` variable asks for it.
        """
        env = os.environ
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        names = _requested_exporters(env)
        # A global provider can only have been set if the API is already imported.
        if "opentelemetry.trace" in sys.modules or names:
            try:
                provider = _global_provider()
            except ImportError:
                provider = None
            if provider is not None:
                return cls(provider)
        if not names:
            return None
        return cls._from_exporter_names(names, env)

    @classmethod
    def _from_exporter_names(
        cls, names: Sequence[str], env: Mapping[str, str]
    ) -> OTelExporter | None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider as SdkProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
        except ImportError:
            log.warning("OTEL_* variables are set but opentelemetry-sdk is not installed; "
                        "OpenTelemetry export is off (pip install 'roost[otel]')")
            return None
        exporters: list[SpanExporter] = []
        missing: list[str] = []
        for name in names:
            exporter = _load_exporter(name, env)
            if exporter is None:
                missing.append(name)
            elif isinstance(exporter, SpanExporter):
                exporters.append(exporter)
            else:
                log.warning("OpenTelemetry exporter %r is not a SpanExporter; ignoring it", name)
        if missing:
            hint = (" (pip install opentelemetry-exporter-otlp)"
                    if any(n.startswith("otlp") for n in missing) else "")
            log.warning("OpenTelemetry trace exporter(s) %s not installed or failed to start%s; %s",
                        ", ".join(missing), hint,
                        "exporting to the others" if exporters else "OpenTelemetry export is off")
        if not exporters:
            return None
        attributes: dict[str, AttributeValue] = {}
        if not _service_name_set(env):
            attributes["service.name"] = DEFAULT_SERVICE_NAME
        provider: SdkTracerProvider = SdkProvider(resource=Resource.create(attributes))
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider, owns_provider=True)

    def export(self, spans: Sequence[Span]) -> None:
        """Emit ``spans`` (one finished run) as an OpenTelemetry trace. Never raises.

        Parents are started before their children and ended after them; a span
        whose parent is not in ``spans`` hangs off the root (or starts its own
        trace when there is no root). Runs synchronously: with a
        ``BatchSpanProcessor`` that is only queueing.
        """
        try:
            self._export(spans)
        except Exception:
            run_id = spans[0].run_id if spans else "?"
            log.warning("OpenTelemetry export of run %s failed", run_id, exc_info=True)

    def shutdown(self) -> None:
        """Flush and close the provider if :meth:`from_environment` built it. Never raises."""
        if not self._owns_provider:
            return
        shutdown = getattr(self.tracer_provider, "shutdown", None)
        if shutdown is None:
            return
        try:
            shutdown()
        except Exception:
            log.warning("OpenTelemetry provider shutdown failed", exc_info=True)

    def _export(self, spans: Sequence[Span]) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import Status, StatusCode

        if not spans:
            return
        by_id = {span.span_id: span for span in spans}
        root = next((s for s in spans if s.kind == "agent" and s.parent_id is None), None)
        started: dict[str, trace.Span] = {}
        order: list[Span] = []

        def start(span: Span) -> trace.Span:
            existing = started.get(span.span_id)
            if existing is not None:
                return existing
            parent = by_id.get(span.parent_id) if span.parent_id else None
            if parent is None and span is not root and root is not None:
                parent = root
            context = (trace.set_span_in_context(start(parent)) if parent is not None
                       else Context())
            otel_span = self._tracer.start_span(
                span_name(span), context=context, kind=_otel_kind(span),
                attributes=span_attributes(span), start_time=start_time_ns(span))
            started[span.span_id] = otel_span
            order.append(span)
            return otel_span

        try:
            for span in spans:
                start(span)
        finally:
            # Children after parents in ``order``: end in reverse, children first.
            for span in reversed(order):
                otel_span = started[span.span_id]
                if span.error:
                    otel_span.set_status(Status(StatusCode.ERROR, _error_description(span)))
                otel_span.end(end_time=end_time_ns(span))


def span_name(span: Span) -> str:
    """The OpenTelemetry span name: ``roost.run``, ``roost.llm <model>``, ``roost.tool <name>``."""
    if span.kind == "agent":
        return "roost.run"
    prefix = _KIND_PREFIX.get(span.kind, f"roost.{span.kind}")
    key = "model" if span.kind == "llm" else "name"
    label = str(span.attributes.get(key) or span.name or "")
    return f"{prefix} {label}" if label and label != span.kind else prefix


def span_attributes(span: Span) -> dict[str, AttributeValue]:
    """``span``'s attributes under OpenTelemetry-friendly keys."""
    prefix = _KIND_PREFIX.get(span.kind, f"roost.{span.kind}")
    out: dict[str, AttributeValue] = {
        "roost.run.id": span.run_id,
        "roost.span.id": span.span_id,
        "roost.span.kind": span.kind,
    }
    operation = _OPERATION.get(span.kind)
    if operation:
        out["gen_ai.operation.name"] = operation
    if span.kind == "tool" and span.name:
        out["gen_ai.tool.name"] = out["roost.tool.name"] = span.name
    keys = _ATTRIBUTE_KEYS.get(span.kind, {})
    for key, raw in span.attributes.items():
        value = _attribute_value(raw)
        if value is None:
            continue
        for otel_key in keys.get(key) or _COMMON_KEYS.get(key) or (f"{prefix}.{key}",):
            out[otel_key] = value
    if span.error:
        out["error.type"] = _error_type(span)
    return out


def start_time_ns(span: Span) -> int:
    """The span's original start, in epoch nanoseconds."""
    return int(span.started_at * 1_000_000_000)


def end_time_ns(span: Span) -> int:
    """The span's original end (start plus duration), in epoch nanoseconds."""
    return start_time_ns(span) + int(span.duration_ms * 1_000_000)


def _requested_exporters(env: Mapping[str, str]) -> list[str]:
    """Exporter names the ``OTEL_*`` variables ask for; empty when they ask for none."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if raw:
        names = [n.strip().lower() for n in raw.split(",") if n.strip()]
        return [n for n in names if n != "none"]
    if any(env.get(var, "").strip() for var in _ENDPOINT_VARS):
        return ["otlp"]
    return []


def _global_provider() -> TracerProvider | None:
    """The tracer provider the embedder set globally, or ``None`` if there is none."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider


def _load_exporter(name: str, env: Mapping[str, str]) -> object | None:
    """An instance of the exporter registered as ``name``, or ``None`` if unavailable."""
    candidates = [name]
    if name == "otlp":
        protocol = next((env[v].strip().lower() for v in _PROTOCOL_VARS if env.get(v)), "")
        if protocol.startswith("http"):
            candidates = ["otlp_proto_http"]
        elif protocol == "grpc":
            candidates = ["otlp", "otlp_proto_grpc"]
        else:
            candidates = ["otlp", "otlp_proto_grpc", "otlp_proto_http"]
    registered = {ep.name: ep for ep in entry_points(group=EXPORTER_ENTRY_POINT_GROUP)}
    for candidate in candidates:
        entry_point = registered.get(candidate)
        if entry_point is None:
            continue
        try:
            exporter: object = entry_point.load()()
        except Exception:
            log.debug("OpenTelemetry exporter %r failed to load", candidate, exc_info=True)
            return None
        return exporter
    return None


def _service_name_set(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SERVICE_NAME", "").strip():
        return True
    pairs = env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in pairs)


def _otel_kind(span: Span) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT if span.kind == "llm" else SpanKind.INTERNAL


def _attribute_value(raw: object) -> AttributeValue | None:
    """``raw`` as an OpenTelemetry attribute value; ``None`` (and "") are dropped."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, str | bool | int | float):
        return raw
    if isinstance(raw, list | tuple) and raw:
        for kind in (bool, str, int, float):
            if all(type(item) is kind for item in raw):
                return list(raw)
    return json.dumps(raw, default=str)


def _error_type(span: Span) -> str:
    if span.attributes.get("interrupted"):
        return "interrupted"
    if span.kind == "agent":
        return str(span.attributes.get("status") or "failed")
    if span.kind == "tool":
        return "tool_error"
    return "_OTHER"


def _error_description(span: Span) -> str:
    if span.attributes.get("interrupted"):
        return "interrupted"
    if span.kind == "agent":
        return str(span.attributes.get("error_message") or span.attributes.get("status") or "")
    return str(span.attributes.get("error_message") or span.attributes.get("error") or "")
