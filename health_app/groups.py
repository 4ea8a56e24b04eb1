"""Console groups get the health page's permissions: Operators may cancel a running turn and release a stale
lease, Viewers see the page (it needs the console's view permission only).

A post_migrate receiver (after sessions_app's, which creates the groups), so a flush keeps them too.
"""

from __future__ import annotations

from health_app.access import CANCEL
from sessions_app.access import codename
from sessions_app.groups import grant_console_groups


def grant_health_permissions(sender=None, using: str = "default", apps=None, **kwargs) -> None:
    """post_migrate receiver: the health page's permissions for the console's groups."""
    grant_console_groups("health_app", "WorkerHeartbeat", ["view_workerheartbeat", codename(CANCEL)],
                         ["view_workerheartbeat"], using=using, apps=apps)
