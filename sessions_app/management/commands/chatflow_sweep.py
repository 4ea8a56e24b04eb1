"""``manage.py chatflow_sweep``: mark ``interrupted`` the turn records whose process died, and purge expired
session leases and waiters.

A turn record says ``running`` while its turn holds the session's lease; once that lease expired (its process
stopped renewing it) the record is marked ``interrupted`` — by the next turn on the session, by the lease
purge turns run now and then, or by this command (run it from cron or a scheduler for sessions that get no
next turn). It then folds every ended turn record not counted yet into the dashboard's hourly and daily
rollups (``turns_app.rollups.fold``; the queue workers' heartbeat does the same once a minute), so the
dashboard's read, which never writes, has few records to add live. Prints what it did; exit status 0.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand

from sessions_app.runtime import site_store
from sessions_app.store import DjangoBackend
from turns_app.rollups import fold


class Command(BaseCommand):
    help = "Mark turn records of dead processes interrupted and purge expired session leases."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", default="default", help="The database alias (default: default).")

    def handle(self, *args, **options) -> None:
        using = options["database"]
        # The site's own store on the default database; another database gets a backend of its own.
        backend = site_store().backend if using == "default" else DjangoBackend(using)
        try:
            now = time.time()
            interrupted = backend.mark_interrupted(now, cancelled_before=now - settings.CHATFLOW_LEASE_SECONDS)
        finally:
            if using != "default":
                backend.close()
        purged = site_store().purge_expired_leases() if using == "default" else 0
        counted = fold() if using == "default" else 0
        self.stdout.write(f"{interrupted} turn record(s) marked interrupted; {purged} expired lease/waiter row(s) "
                          f"purged; {counted} turn record(s) added to the dashboard's rollups.")
