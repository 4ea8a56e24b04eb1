"""``manage.py chatflow_takeover_sweep``: return idle waiting/human sessions to the bot (run it from cron)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from takeover_app import service


class Command(BaseCommand):
    help = ("Return sessions waiting for or owned by an operator to the bot after CHATFLOW_TAKEOVER_IDLE_MINUTES "
            "without a message (0, the default: never); each return is audited. Prints how many.")

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.CHATFLOW_TAKEOVER_IDLE_MINUTES <= 0:
            self.stdout.write("CHATFLOW_TAKEOVER_IDLE_MINUTES is 0: idle sessions are not returned to the bot.")
            return
        self.stdout.write(f"Returned {service.idle_sweep()} idle session(s) to the bot.")
