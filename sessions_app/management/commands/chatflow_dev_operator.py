"""`manage.py chatflow_dev_operator`: the development operator account (DEBUG only).

Creates staff user ``operator`` in the Operators group with a generated password, keeps the password
in ``var/dev_operator_password`` (git-ignored, mode 0600) and prints it — on later runs too, as long
as the account still has that password.
"""

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Create (or show) the development operator account. Refused when DEBUG is off."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="operator")
        parser.add_argument("--if-debug", action="store_true", help="with DEBUG off, do nothing (exit 0)")

    def handle(self, *args, username: str, if_debug: bool, **options) -> None:
        if not settings.DEBUG and if_debug:
            self.stdout.write("DEBUG is off: no development operator account.")
            return
        if not settings.DEBUG:
            raise CommandError("chatflow_dev_operator only runs with DEBUG on; use createsuperuser in production.")
        password_file = Path(settings.BASE_DIR) / "var" / "dev_operator_password"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is not None:
            saved = password_file.read_text().strip() if password_file.is_file() else ""
            if saved and user.check_password(saved):
                self._announce(username, saved)
            else:
                self.stdout.write(f"Operator account: {username!r} exists (its password was changed; "
                                  f"reset it with `manage.py changepassword {username}`).")
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_user(username=username, password=password, is_staff=True)
        user.groups.add(Group.objects.get(name="Operators"))
        password_file.parent.mkdir(parents=True, exist_ok=True)
        password_file.touch(mode=0o600)
        password_file.write_text(password + "\n")
        self._announce(username, password)

    def _announce(self, username: str, password: str) -> None:
        self.stdout.write(self.style.SUCCESS(f"Operator account: username {username}  password {password}"))
