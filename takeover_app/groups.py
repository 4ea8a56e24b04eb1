"""Console groups get the takeover permissions: Operators may take over, reply and hand back; Viewers view.

A post_migrate receiver (after sessions_app's, which creates the groups), so a flush keeps them too.
"""

from __future__ import annotations

from sessions_app.access import codename
from sessions_app.groups import grant_console_groups
from takeover_app.access import REPLY, TAKE_OVER

OPERATOR_PERMISSIONS = ["view_sessionmode", "view_operatorreply", codename(TAKE_OVER), codename(REPLY)]
VIEWER_PERMISSIONS = ["view_sessionmode", "view_operatorreply"]


def grant_takeover_permissions(sender=None, using: str = "default", apps=None, **kwargs) -> None:
    """post_migrate receiver: the takeover permissions for the console's groups."""
    grant_console_groups("takeover_app", "SessionMode", OPERATOR_PERMISSIONS, VIEWER_PERMISSIONS,
                         using=using, apps=apps)
