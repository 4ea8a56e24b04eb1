"""``manage.py chatflow_search_index [--check | --optimize] [--database ALIAS]``: rebuild the full-text index from
the chatflow tables (a progress bar per batch of messages), saying first whether it was out of step with them.

The database's triggers keep the index in step with every write (search_app.schema); a rebuild is for an index
found out of step (a restored backup of the index tables alone, a trigger dropped by hand) or after changing
what is indexed. ``--check`` only compares. ``--optimize`` only merges the SQLite index's segments (lookups visit
each segment; run it from cron, e.g. nightly). Exit status: 0; with ``--check``, 1 when out of step.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

from search_app import index


class Command(BaseCommand):
    help = "Rebuild the full-text search index (or --check whether it is in step with the messages)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="only compare the index with the messages")
        parser.add_argument("--optimize", action="store_true", help="only merge the index's segments (SQLite)")
        parser.add_argument("--database", default="default", help="The database alias (default: default).")

    def handle(self, *args, check: bool, optimize: bool, database: str, **options) -> None:
        if optimize:
            index.optimize(database)
            self.stdout.write(self.style.SUCCESS("The search index's segments are merged."))
            return
        found = index.check(database)
        out = self.style.SUCCESS if found.in_step else self.style.WARNING
        self.stdout.write(out(found.describe()))
        if check:
            if not found.in_step:
                sys.exit(1)
            return
        bar = tqdm(desc="Indexing messages", unit="message", disable=None if options["verbosity"] else True)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        done = index.rebuild(database, progress)
        bar.close()
        self.stdout.write(self.style.SUCCESS(f"Indexed {done} messages and every session."))
