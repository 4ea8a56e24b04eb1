"""Worker heartbeats as the health page knows them: the rows the queue workers write (``webhooks_app.models``),
and the permissions to see them and to cancel a turn or release a stale lease (``health_app.cancel_turn``).

The model itself lives with the pipeline that writes it; this proxy keeps its permissions under this app's name.
"""

from __future__ import annotations

from webhooks_app import models as pipeline


class WorkerHeartbeat(pipeline.WorkerHeartbeat):
    """A queue worker process (see ``webhooks_app.models.WorkerHeartbeat``), with the health page's permissions."""

    class Meta:
        proxy = True
        permissions = [("cancel_turn", "Can cancel a running turn or release a stale session lease")]
