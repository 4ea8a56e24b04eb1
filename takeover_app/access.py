"""The human takeover's permission names (``app_label.codename``), for ``sessions_app.access.may`` and
``console_required``: granted to the console's groups by :mod:`takeover_app.groups`."""

from __future__ import annotations

__all__ = ["REPLY", "TAKE_OVER"]

#: Take a session over from the bot and hand it back (and cancel its running turn).
TAKE_OVER = "takeover_app.take_over"
#: Reply to the customer as an operator, and resend such a reply.
REPLY = "takeover_app.reply_as_operator"
