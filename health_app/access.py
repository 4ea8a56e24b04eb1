"""The health page's permission name (``app_label.codename``), for ``sessions_app.access.may`` and
``console_required``: granted to the console's groups by :mod:`health_app.groups`."""

from __future__ import annotations

__all__ = ["CANCEL"]

#: Cancel a running turn, or release a stale session lease.
CANCEL = "health_app.cancel_turn"
