"""The webhook ledger's permission names (``app_label.codename``), for ``sessions_app.access.may`` and
``console_required``: granted to the console's groups by :mod:`webhooks_app.groups`."""

from __future__ import annotations

__all__ = ["RESEND", "RETRY"]

#: Queue a failed delivery again (Retry).
RETRY = "webhooks_app.retry_delivery"
#: Send a delivery's reply to the customer again (Resend).
RESEND = "webhooks_app.resend_reply"
