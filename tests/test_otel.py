"""Re-emitting run traces through OpenTelemetry: span shape, timing, attributes, configuration."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from typing import Any, ClassVar

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from bot.observability import otel
from bot.observability.otel import OTelExporter
from bot.observability.tracing import RunTrace, Span
from bot.testing.app import scripted, settle
from tests.conftest import AppFactory


class RecordingSpanExporter(InMemorySpanExporter):
    """An exporter the environment path can load through an entry point."""

    instances: ClassVar[list[RecordingSpanExporter]] = []

    def __init__(self) -> None:
        super().__init__()
        RecordingSpanExporter.instances.append(self)


class OtherSpanExporter(RecordingSpanExporter):
    """A second registered exporter, to tell which one was chosen."""


def _entry_point(name: str, cls: type) -> EntryPoint:
    return EntryPoint(name=name, value=f"{cls.__module__}:{cls.__qualname__}",
                      group=otel.EXPORTER_ENTRY_POINT_GROUP)


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ambient OTEL_* variables, no global provider, no leftover recording exporters."""
    import os

    for var in list(os.environ):
        if var.startswith("OTEL_"):
            monkeypatch.delenv(var)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    RecordingSpanExporter.instances.clear()
    yield
    RecordingSpanExporter.instances.clear()


@pytest.fixture
def memory() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def exporter(memory: InMemorySpanExporter) -> OTelExporter:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return OTelExporter(tracer_provider=provider)


def _run(status: str, error: str = "", *, leave_tool_open: bool = False) -> list[Span]:
    """A run with one model call and one tool call, finished with ``status``."""
    run = RunTrace("run-1", "telegram:42", verbose=False)
    llm = run.start("llm", "claude-test", provider="anthropic", model="claude-test", iteration=1)
    time.sleep(0.005)
    llm.end(input_tokens=120, output_tokens=30, output_preview="calling a tool")
    tool = run.start("tool", "read_file", call_id="call-7")
    time.sleep(0.005)
    if not leave_tool_open:
        tool.end(is_error=False)
    return run.finish(status, error)


def _by_name(memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in memory.get_finished_spans()}


def test_completed_run_is_exported_as_run_llm_and_tool_spans(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("completed"))

    spans = _by_name(memory)
    assert set(spans) == {"roost.run", "roost.llm claude-test", "roost.tool read_file"}
    assert spans["roost.run"].kind is SpanKind.INTERNAL
    assert spans["roost.llm claude-test"].kind is SpanKind.CLIENT
    assert spans["roost.tool read_file"].kind is SpanKind.INTERNAL


def test_children_are_parented_to_the_run_span_in_one_trace(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("completed"))

    spans = _by_name(memory)
    root = spans.pop("roost.run")
    assert root.parent is None
    assert root.context is not None
    for child in spans.values():
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
        assert child.context is not None
        assert child.context.trace_id == root.context.trace_id


def test_children_end_before_the_run_span_is_exported(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("completed"))

    assert memory.get_finished_spans()[-1].name == "roost.run"


def test_each_run_gets_its_own_trace(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("completed"))
    exporter.export(_run("completed"))

    roots = [s for s in memory.get_finished_spans() if s.name == "roost.run"]
    trace_ids = {s.context.trace_id for s in roots if s.context is not None}
    assert len(trace_ids) == 2


def test_original_start_and_end_times_are_preserved(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    roost_spans = _run("completed")
    time.sleep(0.01)  # export later than the run: the times must still be the run's
    exporter.export(roost_spans)

    exported = {s.attributes["roost.span.id"]: s for s in memory.get_finished_spans()
                if s.attributes is not None}
    for span in roost_spans:
        otel_span = exported[span.span_id]
        assert otel_span.start_time is not None and otel_span.end_time is not None
        assert abs(otel_span.start_time / 1e9 - span.started_at) < 1e-6
        assert (otel_span.end_time - otel_span.start_time) / 1e6 == pytest.approx(
            span.duration_ms, abs=0.001)
        assert span.duration_ms > 0


def test_attributes_use_gen_ai_and_roost_keys(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("completed"))

    spans = _by_name(memory)
    root = dict(spans["roost.run"].attributes or {})
    assert root["roost.session_key"] == "telegram:42"
    assert root["roost.run.status"] == "completed"
    assert root["roost.run.id"] == "run-1"
    assert "roost.run.error_message" not in root  # empty message is dropped
    llm = dict(spans["roost.llm claude-test"].attributes or {})
    assert llm["gen_ai.operation.name"] == "chat"
    assert llm["gen_ai.system"] == "anthropic"
    assert llm["gen_ai.provider.name"] == "anthropic"
    assert llm["gen_ai.request.model"] == "claude-test"
    assert llm["gen_ai.usage.input_tokens"] == 120
    assert llm["gen_ai.usage.output_tokens"] == 30
    assert llm["roost.llm.iteration"] == 1
    assert llm["roost.llm.output_preview"] == "calling a tool"
    tool = dict(spans["roost.tool read_file"].attributes or {})
    assert tool["roost.tool.name"] == "read_file"
    assert tool["gen_ai.tool.name"] == "read_file"
    assert tool["gen_ai.tool.call.id"] == "call-7"
    assert tool["roost.tool.is_error"] is False


def test_completed_run_leaves_status_unset(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("completed"))

    assert {s.status.status_code for s in memory.get_finished_spans()} == {StatusCode.UNSET}


def test_cancelled_run_marks_root_and_cut_off_tool_as_errors(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export(_run("cancelled", "stopped by user", leave_tool_open=True))

    spans = _by_name(memory)
    root = spans["roost.run"]
    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == "stopped by user"
    assert (root.attributes or {})["error.type"] == "cancelled"
    assert (root.attributes or {})["roost.run.status"] == "cancelled"
    tool = spans["roost.tool read_file"]
    assert tool.status.status_code is StatusCode.ERROR
    assert (tool.attributes or {})["roost.interrupted"] is True
    assert spans["roost.llm claude-test"].status.status_code is StatusCode.UNSET


def test_failing_tool_span_gets_error_status(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    run = RunTrace("run-2", "discord:1")
    run.start("tool", "shell", call_id="c1").end(error=True, is_error=True)
    exporter.export(run.finish("completed"))

    tool = _by_name(memory)["roost.tool shell"]
    assert tool.status.status_code is StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "tool_error"


def test_unusual_attribute_values_are_made_exportable(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    run = RunTrace("run-3", "slack:C1")
    run.start("tool", "search", args={"q": "x"}, tags=["a", "b"], nothing=None).end()
    exporter.export(run.finish("completed"))

    tool = dict(_by_name(memory)["roost.tool search"].attributes or {})
    assert tool["roost.tool.args"] == '{"q": "x"}'
    assert tool["roost.tool.tags"] == ("a", "b")
    assert "roost.tool.nothing" not in tool


def test_export_of_nothing_emits_nothing(
    exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    exporter.export([])

    assert memory.get_finished_spans() == ()


def test_export_never_raises_and_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("collector on fire")

    class BrokenProvider(trace.TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            return BrokenTracer()

    broken = OTelExporter(tracer_provider=BrokenProvider())
    with caplog.at_level(logging.WARNING, logger="roost.observability.otel"):
        broken.export(_run("completed"))

    assert "OpenTelemetry export of run run-1 failed" in caplog.text


def test_from_environment_is_none_without_provider_or_env() -> None:
    assert OTelExporter.from_environment() is None


def test_from_environment_uses_the_global_provider_the_embedder_set(
    monkeypatch: pytest.MonkeyPatch, memory: InMemorySpanExporter
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)

    found = OTelExporter.from_environment()

    assert found is not None
    assert found.tracer_provider is provider
    found.export(_run("completed"))
    assert len(memory.get_finished_spans()) == 3


def test_from_environment_is_none_when_sdk_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")

    assert OTelExporter.from_environment() is None


def test_from_environment_is_none_when_exporter_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")

    assert OTelExporter.from_environment() is None


def test_from_environment_warns_once_and_disables_when_exporter_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setattr(otel, "entry_points", lambda group: [])

    with caplog.at_level(logging.WARNING, logger="roost.observability.otel"):
        assert OTelExporter.from_environment() is None

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "otlp" in warnings[0].getMessage()
    assert "opentelemetry-exporter-otlp" in warnings[0].getMessage()


def test_from_environment_builds_a_private_provider_for_the_otlp_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setattr(otel, "entry_points",
                        lambda group: [_entry_point("otlp", RecordingSpanExporter)])

    found = OTelExporter.from_environment()

    assert found is not None
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)  # not made global
    found.export(_run("completed"))
    found.shutdown()  # flushes the batch processor
    (recorder,) = RecordingSpanExporter.instances
    spans = recorder.get_finished_spans()
    assert {s.name for s in spans} == {"roost.run", "roost.llm claude-test",
                                       "roost.tool read_file"}
    assert spans[0].resource.attributes["service.name"] == "roost"


def test_from_environment_keeps_the_configured_service_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "recording")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-roost")
    monkeypatch.setattr(otel, "entry_points",
                        lambda group: [_entry_point("recording", RecordingSpanExporter)])

    found = OTelExporter.from_environment()

    assert found is not None
    found.export(_run("completed"))
    found.shutdown()
    (recorder,) = RecordingSpanExporter.instances
    assert recorder.get_finished_spans()[0].resource.attributes["service.name"] == "my-roost"


def test_from_environment_picks_the_http_exporter_for_the_http_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setattr(otel, "entry_points", lambda group: [
        _entry_point("otlp", RecordingSpanExporter),
        _entry_point("otlp_proto_http", OtherSpanExporter),
    ])

    found = OTelExporter.from_environment()

    assert found is not None
    found.shutdown()
    assert [type(e) for e in RecordingSpanExporter.instances] == [OtherSpanExporter]


async def test_the_engine_exports_each_finished_run_through_opentelemetry(
    make_app: AppFactory, exporter: OTelExporter, memory: InMemorySpanExporter
) -> None:
    provider = scripted({"steps": [
        {"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"reply": "done"}]})
    app, channel, _ = await make_app(provider)
    app.metrics.then = exporter  # spans reach OpenTelemetry after the metrics
    await channel.say("look around")
    await settle(app)
    names = sorted(span.name for span in memory.get_finished_spans())
    assert names == ["roost.llm claude-sonnet-5-5", "roost.llm claude-sonnet-5-5",
                     "roost.run", "roost.tool list_files"]
