"""The webhook endpoints' response counter: the one number of the pipeline the database does not hold (a refused
webhook writes nothing). A ``prometheus_client`` counter per process; ``/metrics`` (``health_app.metrics``) exposes
it, aggregated across processes by prometheus-client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ["WEBHOOK_RESPONSES", "count_webhook"]

WEBHOOK_RESPONSES = Counter("chatflow_webhook_responses", "Webhook endpoint responses by channel and HTTP status.",
                            ["channel", "code"], registry=None)


def count_webhook(channel: str, code: int) -> None:
    """Count one webhook response (``channel`` whatsapp/telegram/generic, ``code`` the HTTP status)."""
    WEBHOOK_RESPONSES.labels(channel=channel, code=str(code)).inc()
