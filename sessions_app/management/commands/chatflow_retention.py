"""`manage.py chatflow_retention [--dry-run] [--batch N]`: delete the sessions past their channel's retention.

The policy is CHATFLOW_RETENTION_DAYS (``sessions_app.retention``); queue workers apply it too, a few hundred
sessions every few minutes, so this is for cron jobs and for working off a backlog at once. Sessions are deleted
in batches (one short transaction each) through the site store; a session with a running turn, a takeover or a
delivery in flight is skipped and tried again on a later run. The run is audited with its counts.
``--dry-run`` prints what would be deleted and skipped per channel and changes nothing.
Exit status: 0; 1 when the database cannot be reached (message on stderr).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone
from tqdm import tqdm

from sessions_app import retention


class Command(BaseCommand):
    help = "Delete the sessions past their channel's retention (CHATFLOW_RETENTION_DAYS); --dry-run only counts."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Count per channel; change nothing.")
        parser.add_argument("--batch", type=int, default=retention.BATCH,
                            help=f"Sessions per transaction (default {retention.BATCH}).")

    def handle(self, *args, **options) -> None:
        if options["batch"] < 1:
            raise CommandError(f"--batch must be a whole number from 1; got {options['batch']}")
        policy = retention.Policy.from_settings()
        if policy.keeps_all:
            self.stdout.write("CHATFLOW_RETENTION_DAYS sets no limit: every session is kept.")
            return
        now = timezone.now()
        try:
            total = sum(policy.count_expired(now).values())
            with tqdm(total=total, desc="Retention", unit="session",
                      disable=None if options["verbosity"] else True) as bar:
                report = retention.sweep(policy=policy, now=now, batch=options["batch"],
                                         dry_run=options["dry_run"], progress=bar.update)
        except DatabaseError as err:
            raise CommandError(f"could not apply the retention policy: {err}") from err
        self._print(policy, report)

    def _print(self, policy: retention.Policy, report: retention.Report) -> None:
        verb = "would delete" if report.dry_run else "deleted"
        channels = report.channels()
        for key, days in policy.lanes():
            row = channels.get(key, {"deleted": 0, "skipped": 0, "skipped_because": {}})
            why = ", ".join(f"{reason} {n}" for reason, n in row["skipped_because"].items())
            self.stdout.write(f"{key} (after {days} days): {verb} {row['deleted']}, skipped {row['skipped']}"
                              + (f" ({why})" if why else ""))
        kept = sorted(k for k, d in policy.days.items() if not d)
        if kept:
            self.stdout.write(f"Kept for ever: {', '.join(kept)}.")
        if report.dry_run:
            self.stdout.write("Dry run: nothing was changed.")
        else:
            self.stdout.write(f"Total: {report.total_deleted} deleted, {report.total_skipped} skipped "
                              "(tried again on the next run).")
