"""`manage.py chatflow_purge_dedup`: delete expired webhook de-duplication rows and print how many.

A row of ``chatflow_processed_messages`` expires CHATFLOW_DEDUP_TTL_HOURS after it was claimed;
the store also purges now and then while claiming, so this is for cron jobs and tidy databases.
Exit status: 0, or 1 when the database cannot be reached (message on stderr).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from agents_app import runtime


class Command(BaseCommand):
    help = "Delete expired processed-message (webhook de-duplication) rows; prints how many."

    def handle(self, *args, **options) -> None:
        store = runtime.site_store()
        hours = store.dedup_ttl_seconds / 3600
        try:
            purged = store.purge_processed_messages()
        except DatabaseError as err:
            raise CommandError(f"could not purge processed messages: {err}") from err
        noun = "id" if purged == 1 else "ids"
        self.stdout.write(f"Purged {purged} expired processed-message {noun} (older than {hours:g} h).")
