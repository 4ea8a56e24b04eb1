"""`manage.py chatflow_token create NAME --user U` (prints the secret once) · `revoke NAME --user U` · `list`."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from api_app.models import ApiToken
from sessions_app.access import EXPORT


class Command(BaseCommand):
    help = "Create, revoke or list API tokens (Authorization: Bearer <secret>)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="verb", required=True)
        create = sub.add_parser("create", help="create a token and print its secret (shown once)")
        create.add_argument("name")
        create.add_argument("--user", required=True, help="username the token acts as")
        revoke = sub.add_parser("revoke", help="revoke the active tokens with this name (or hint)")
        revoke.add_argument("name")
        revoke.add_argument("--user", help="only this user's tokens")
        sub.add_parser("list", help="list tokens (never their secrets)")

    def handle(self, *args, verb: str, **options) -> None:
        getattr(self, f"_{verb}")(**options)

    def _create(self, name: str, user: str, **_) -> None:
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"No user {user!r}.")
        if not owner.has_perm(EXPORT):
            self.stderr.write(f"Warning: {user!r} lacks {EXPORT}; the API will answer 403.")
        _token, secret = ApiToken.issue(name, owner)
        self.stdout.write(secret)

    def _revoke(self, name: str, user: str | None = None, **_) -> None:
        tokens = ApiToken.objects.filter(revoked_at__isnull=True).filter(name=name) | \
            ApiToken.objects.filter(revoked_at__isnull=True, hint=name)
        if user:
            tokens = tokens.filter(owner__username=user)
        found = list(tokens)
        if not found:
            raise CommandError(f"No active token named {name!r}.")
        for token in found:
            token.revoke()
        self.stdout.write(f"Revoked {len(found)} token(s).")

    def _list(self, **_) -> None:
        for t in ApiToken.objects.select_related("owner"):
            state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
            used = f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never"
            self.stdout.write(f"{t.hint}…  {t.name}  owner={t.owner.username}  {state}  last used {used}")
