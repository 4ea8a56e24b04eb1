"""`manage.py chatflow_demo [--sessions N] [--takeover T] [--if-empty] [--seed S] [--spread-hours H]`.

Creates N demo sessions by running real turns through the site's Runner (sessions_app.runtime) on
the demo engine: customers on WhatsApp, Telegram and the web widget tracking orders, getting
refunds and invoices from Billing and device diagnoses from Tech (see agents_app.demo_sessions).
--takeover T adds T human takeover demos (agents_app.demo_sessions.TAKEOVER_SCRIPTS): sessions waiting for
a person, one an operator (the demo colleague dana.demo) took over, replied on and holds a customer message
for, one handed back with a private note. `dev.py serve` calls it with --if-empty --takeover 4 on every
start: demo data is seeded once.

Exit status: 0 (also when --if-empty found sessions), 1 on an error (message on stderr).
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from tqdm import tqdm

from agents_app import demo_sessions
from sessions_app import runtime
from sessions_app.live import flush_before_close, mark_unwatched
from sessions_app.models import ChatSession


async def _play(runner, session: demo_sessions.DemoSession) -> None:
    try:
        await demo_sessions.play(runner, session)
    finally:
        await flush_before_close()  # the loop closes next: its last live updates go out first

_MAX_SESSIONS = 10_000


class Command(BaseCommand):
    help = "Create N demo sessions by running real turns through the site's Runner (demo engine)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sessions", type=int, default=40, help="how many sessions to create (default 40)")
        parser.add_argument("--takeover", type=int, default=0,
                            help="also create T human takeover demo sessions (waiting, taken over, handed back)")
        parser.add_argument("--if-empty", action="store_true", help="do nothing when the database has sessions")
        parser.add_argument("--seed", type=int, default=None, help="random seed for ids and details (default: random)")
        parser.add_argument("--spread-hours", type=float, default=72.0,
                            help="spread the sessions' timestamps over the last H hours (default 72; 0: keep)")

    def handle(self, *args, sessions: int, if_empty: bool, seed: int | None, spread_hours: float, takeover: int = 0,
               **options) -> None:
        if not 0 <= sessions <= _MAX_SESSIONS:
            raise CommandError(f"--sessions must be between 0 and {_MAX_SESSIONS}; got {sessions}")
        if not 0 <= takeover <= 100:
            raise CommandError(f"--takeover must be between 0 and 100; got {takeover}")
        if spread_hours < 0:
            raise CommandError(f"--spread-hours must not be negative; got {spread_hours}")
        if if_empty and ChatSession.objects.exists():
            self.stdout.write("Demo data: the database already has sessions; nothing to do.")
            return
        if settings.CHATFLOW_ENGINE != "demo":
            message = (f"chatflow_demo plays its conversations on the demo engine, and CHATFLOW_ENGINE is "
                       f"{settings.CHATFLOW_ENGINE!r}; run it with CHATFLOW_ENGINE=demo")
            if if_empty:  # dev.py serve: starting the site matters more than demo data
                self.stdout.write(f"Demo data: skipped ({message}).")
                return
            raise CommandError(message)
        rng = random.Random(seed)
        taken = set(ChatSession.objects.values_list("session_id", flat=True))
        planned = demo_sessions.plan_sessions(sessions, rng, taken)
        mark_unwatched()  # seeding: nobody watches these turns live, so no in-memory layer warning
        runner = runtime.site_runner()
        now = timezone.now()
        bar = tqdm(planned, desc="Demo sessions", unit="session", disable=None if options["verbosity"] else True)
        turns = 0
        for n, session in enumerate(bar):
            try:
                asyncio.run(_play(runner, session))
            except Exception as err:
                bar.close()
                raise CommandError(
                    f"demo session {session.session_id!r} failed ({type(err).__name__}: {err}); "
                    f"{n} of {len(planned)} sessions were created"
                ) from err
            turns += len(session.messages)
            if spread_hours:
                ends_at = now - timedelta(seconds=rng.uniform(0, spread_hours * 3600))
                demo_sessions.spread_times(session.session_id, ends_at, rng)
        bar.close()
        staged = self._takeover(runner, takeover, rng, now) if takeover else 0
        self.stdout.write(self.style.SUCCESS(
            f"Demo data: created {len(planned)} sessions ({turns} turns) through the site's Runner"
            + (f", and {staged} human takeover demos." if takeover else ".")
        ))

    def _takeover(self, runner, count: int, rng: random.Random, now) -> int:
        """The takeover demos: customer turns played (recent: within the last hour, so WhatsApp's 24-hour
        window is open), then what the demo colleague did on them."""
        taken = set(ChatSession.objects.values_list("session_id", flat=True))
        operator = demo_sessions.demo_colleague()
        for session in demo_sessions.plan_takeover_sessions(count, rng, taken):
            try:
                asyncio.run(_play(runner, session))
                demo_sessions.spread_times(session.session_id, now - timedelta(minutes=rng.uniform(5, 50)), rng)
                demo_sessions.stage_takeover(runner, session, operator)
            except Exception as err:
                raise CommandError(f"takeover demo session {session.session_id!r} failed "
                                   f"({type(err).__name__}: {err})") from err
        return count

