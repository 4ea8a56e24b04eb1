"""Each permission the console asks for is spelled once, in its app's ``access`` module, and names a permission of the
database (whose names stay as they are) that the console's groups are granted by."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, Permission

from health_app import access as health_access
from sessions_app import access as sessions_access
from takeover_app import access as takeover_access
from tests.processes import REPO
from webhooks_app import access as webhooks_access

OWNERS = (sessions_access, takeover_access, webhooks_access, health_access)
PERMISSIONS = {sessions_access.VIEW, sessions_access.FORCE_HANDOFF, sessions_access.ROLLBACK, sessions_access.DELETE,
               sessions_access.EXPORT, sessions_access.CHAT, takeover_access.TAKE_OVER, takeover_access.REPLY,
               webhooks_access.RETRY, webhooks_access.RESEND, health_access.CANCEL}
# The code's own files (tests, migrations and the virtualenv aside): Python modules and templates.
SOURCES = [path.resolve() for pattern in ("*.py", "*.html") for path in REPO.glob(f"*_app/**/{pattern}")
           if "migrations" not in path.parts] + [p.resolve() for p in REPO.glob("chatflow_site/**/*.py")]


def _names(permissions) -> set[str]:
    return {f"{p.content_type.app_label}.{p.codename}" for p in permissions.select_related("content_type")}


def test_the_permission_names_are_the_databases_unchanged_ones() -> None:
    assert PERMISSIONS == {
        "sessions_app.view_chatsession", "sessions_app.force_handoff", "sessions_app.rollback_session",
        "sessions_app.delete_session", "sessions_app.export_transcript", "sessions_app.add_chatmessage",
        "takeover_app.take_over", "takeover_app.reply_as_operator", "webhooks_app.retry_delivery",
        "webhooks_app.resend_reply", "health_app.cancel_turn"}


@pytest.mark.django_db
def test_each_permission_name_is_in_the_database_and_operators_hold_it_viewers_only_the_view() -> None:
    assert PERMISSIONS <= _names(Permission.objects.all())
    assert PERMISSIONS <= _names(Group.objects.get(name="Operators").permissions.all())
    assert PERMISSIONS & _names(Group.objects.get(name="Viewers").permissions.all()) == {sessions_access.VIEW}


def test_no_module_or_template_spells_a_permission_name_but_its_owner() -> None:
    owners = {Path(module.__file__).resolve() for module in OWNERS}
    spelled = re.compile("|".join(re.escape(f'"{p}"') + "|" + re.escape(f"'{p}'") for p in PERMISSIONS))
    found = sorted(str(path.relative_to(REPO)) for path in SOURCES
                   if path not in owners and spelled.search(path.read_text(encoding="utf-8")))
    assert found == []
