"""OpenTelemetry traces (optional): on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the SDK is installed."""

from __future__ import annotations


def configure_from_settings() -> None:
    """Install the OTLP exporter when configured (see the module docstring)."""
