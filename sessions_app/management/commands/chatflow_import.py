"""`manage.py chatflow_import PATH [--dry-run]`: copy sessions from a chatflow-agent SQLite file.

PATH is a database written by chatflow-agent 0.3.4 or by ``chatflow_agent``'s ``SQLiteSessionStore``;
the sessions go into the configured database (DATABASE_URL, e.g. PostgreSQL) as sessions_app.importer
describes. Re-running imports nothing new. The report says what was copied and what was skipped
and why: already present with the same content, conflicting id with different content, unreadable.

Exit status: 0 when the file was read (skips are reported, not errors); 1 when it cannot be
(missing, not SQLite, damaged, not a chatflow database) or the database fails.
"""

from __future__ import annotations

import sqlite3

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone
from tqdm import tqdm

from sessions_app.importer import ImportReport, ImportSourceError, SourceFile, import_processed, import_session

_LISTED = 10  # session ids listed per line at normal verbosity


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class Command(BaseCommand):
    help = "Copy sessions from a chatflow-agent SQLite file into the configured database (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="chatflow-agent SQLite file (0.3.4's or SQLiteSessionStore's)")
        parser.add_argument("--dry-run", action="store_true", help="report what would be imported; write nothing")

    def handle(self, *args, path: str, dry_run: bool, **options) -> None:
        try:
            source = SourceFile(path)
        except ImportSourceError as err:
            raise CommandError(str(err)) from err
        report = ImportReport()
        now = timezone.now()
        try:
            total = source.count_sessions()
            orphans = source.orphan_messages()
            bar = tqdm(total=total, desc="Importing sessions", unit="session",
                       disable=None if options["verbosity"] else True)
            for session in source.sessions(report):
                import_session(session, report, dry_run=dry_run, now=now)
                bar.update()
            bar.close()
            import_processed(source.processed(report), report, dry_run=dry_run, now=now)
        except ImportSourceError as err:
            raise CommandError(str(err)) from err
        except DatabaseError as err:
            raise CommandError(f"the import stopped: {err}") from err
        except sqlite3.Error as err:  # the file (not the database: Django wraps those) went bad while read
            raise CommandError(f"{path}: reading the file failed ({err})") from err
        finally:
            source.close()
        if orphans:
            ids = ", ".join(map(str, orphans[:_LISTED])) + (" …" if len(orphans) > _LISTED else "")
            report.unreadable.append((f"{len(orphans)} message rows ({ids})", "they belong to no session"))
        self._print(report, path, dry_run, options["verbosity"])

    def _print(self, report: ImportReport, path: str, dry_run: bool, verbosity: int) -> None:
        out = self.stdout.write
        verb = "Would import" if dry_run else "Imported"
        out(self.style.SUCCESS(
            f"{verb} {_n(len(report.imported), 'session')} ({_n(report.imported_messages, 'message')}) and "
            f"{_n(report.processed_copied, 'processed-message id')} from {path}"
            + (" (dry run: nothing was written)." if dry_run else ".")
        ))
        if verbosity >= 2:
            for session_id in report.imported:
                out(f"  {'would import' if dry_run else 'imported'} {session_id!r}")
        skipped = len(report.present) + len(report.conflicts)
        out(f"Skipped {_n(skipped, 'session')}:")
        listed = report.present if verbosity >= 2 else report.present[:_LISTED]
        more = f" and {len(report.present) - len(listed)} more" if len(listed) < len(report.present) else ""
        out(f"  already present with the same content: {len(report.present)}"
            + (f" ({', '.join(map(repr, listed))}{more})" if listed else ""))
        out(f"  conflicting id with different content (left as they are): {len(report.conflicts)}")
        for session_id, why in report.conflicts:
            out(f"    {session_id!r}: {why}")
        if report.processed_present:
            out(f"  processed-message ids already present: {report.processed_present}")
        out(f"Unreadable rows skipped or repaired: {len(report.unreadable)}")
        for where, why in report.unreadable:
            out(f"    {where}: {why}")
