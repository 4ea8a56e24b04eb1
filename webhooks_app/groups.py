"""Console groups get the ledger's permissions: Operators may view and retry deliveries and resend replies,
Viewers view them.

A post_migrate receiver (after sessions_app's, which creates the groups), so a flush keeps them too.
"""

from __future__ import annotations

from sessions_app.access import codename
from sessions_app.groups import grant_console_groups
from webhooks_app.access import RESEND, RETRY


def grant_ledger_permissions(sender=None, using: str = "default", apps=None, **kwargs) -> None:
    """post_migrate receiver: the ledger's permissions for the console's groups."""
    grant_console_groups("webhooks_app", "InboundDelivery", ["view_inbounddelivery", codename(RETRY), codename(RESEND)],
                         ["view_inbounddelivery"], using=using, apps=apps)
