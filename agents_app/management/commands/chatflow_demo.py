"""`manage.py chatflow_demo`: create realistic demo sessions by running real turns through the site's Runner.

Stub until the site's Runner exists (agents_app.runner, issue 4 phase 2): it validates its arguments
and reports that nothing was seeded. `dev.py serve` calls it with --if-empty on every start.
"""

from django.core.management.base import BaseCommand, CommandParser

from sessions_app.models import ChatSession


class Command(BaseCommand):
    help = "Create N demo sessions by running real turns through the site's Runner."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sessions", type=int, default=24, help="how many sessions to create (default 24)")
        parser.add_argument("--if-empty", action="store_true", help="do nothing when the database has sessions")

    def handle(self, *args, sessions: int, if_empty: bool, **options) -> None:
        if if_empty and ChatSession.objects.exists():
            self.stdout.write("Demo data: the database already has sessions; nothing to do.")
            return
        # TODO(lead): run `sessions` scripted conversations through agents_app's Runner with a tqdm bar.
        self.stdout.write("Demo data: the site's Runner is not wired yet; no sessions created.")
