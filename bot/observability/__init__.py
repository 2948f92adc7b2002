"""Tracing spans (:mod:`.tracing`), their OpenTelemetry export (:mod:`.otel`) and secret
redaction for every logger (:mod:`.redact`).
"""
