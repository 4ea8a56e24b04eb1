"""`manage.py chatflow_purge_dedup`: delete expired webhook de-duplication rows and print how many.

A row of ``chatflow_processed_messages`` expires CHATFLOW_DEDUP_TTL_HOURS after it was claimed;
the store also purges now and then while claiming, so this is for cron jobs and tidy databases.
It also deletes the session lease and waiter rows that processes which died left behind (expired
for longer than CHATFLOW_LEASE_SECONDS; turns delete them too, now and then).
Exit status: 0, or 1 when the database cannot be reached (message on stderr).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from sessions_app import runtime


class Command(BaseCommand):
    help = "Delete expired processed-message (webhook de-duplication) rows and stale lease rows; prints how many."

    def handle(self, *args, **options) -> None:
        store = runtime.site_store()
        hours = store.dedup_ttl_seconds / 3600
        try:
            purged = store.purge_processed_messages()
            stale = store.purge_expired_leases()
        except DatabaseError as err:
            raise CommandError(f"could not purge processed messages: {err}") from err
        noun = "id" if purged == 1 else "ids"
        self.stdout.write(f"Purged {purged} expired processed-message {noun} (older than {hours:g} h).")
        self.stdout.write(f"Purged {stale} expired session lease and waiter row{'' if stale == 1 else 's'}.")
