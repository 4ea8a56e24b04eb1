"""What belongs to a session: every table of the project with a session id column is registered, and a
table nobody registered fails the system check."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import django
import pytest
from django.core import checks
from django.db import OperationalError, connection, connections

from console_app import export, restore
from sessions_app import actions, holdings, runtime
from sessions_app.models import ChatSession
from takeover_app.models import SessionMode
from tests.sessions_app import personas
from tests.sessions_app.conversations import store, support_story


def test_every_table_with_a_session_id_column_is_registered_or_deleted_by_the_store():
    labels = {m._meta.label for m in holdings.session_models()}
    assert {"sessions_app.ChatMessage", "sessions_app.OperatorAction", "takeover_app.SessionMode",
            "webhooks_app.InboundDelivery", "turns_app.TurnRecord"} <= labels
    assert holdings.unregistered() == []
    assert [e for e in checks.run_checks() if e.id == "sessions_app.E001"] == []


def test_the_projects_apps_are_its_own_even_with_the_virtualenv_inside_the_project(settings):
    # The virtualenv often sits in the project's directory (.venv): BASE_DIR then holds Django's apps too.
    settings.BASE_DIR = Path(os.path.commonpath([settings.BASE_DIR, Path(django.__file__).resolve()]))

    labels = {config.label for config in holdings.project_apps()}

    assert labels == {"sessions_app", "agents_app", "api_app", "console_app", "webhooks_app", "turns_app",
                      "takeover_app", "health_app", "search_app"}


def test_a_table_no_app_registered_fails_the_system_check(monkeypatch):
    monkeypatch.setattr(holdings, "_holdings", [h for h in holdings._holdings if SessionMode not in h.models])

    errors = [e for e in checks.run_checks() if e.id == "sessions_app.E001"]

    assert [e.obj for e in errors] == [SessionMode]
    assert "takeover_app.SessionMode has a session_id column" in errors[0].msg


def test_an_audit_entrys_texts_are_redacted_and_its_names_and_numbers_kept():
    entry = {"mode": "bot", "note": "call me on 555", "reply": 7, "replay": True,
             "tool_calls_not_undone": [{"turn": 2, "name": "refund", "args": "{\"card\": 4111}", "outcome": "ok"}],
             "metadata": {"channel": "whatsapp", "profile_name": "Ana"}}

    assert holdings.redacted(entry) == {
        "mode": "bot", "note": holdings.REDACTED, "reply": 7, "replay": True,
        "tool_calls_not_undone": [{"turn": 2, "name": "refund", "args": holdings.REDACTED, "outcome": "ok"}],
        "metadata": {"channel": "whatsapp", "profile_name": holdings.REDACTED}}


def _row_locked(session_id: str) -> bool | None:
    """Whether another connection finds the session row locked (PostgreSQL); None on SQLite, whose writer
    locks the whole file."""
    if connection.vendor != "postgresql":
        return None
    found: list[bool] = []

    def look() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1 FROM chatflow_sessions WHERE session_id = %s FOR UPDATE NOWAIT", [session_id])
            found.append(False)
        except OperationalError:
            found.append(True)
        finally:
            connections.close_all()

    looker = threading.Thread(target=look)
    looker.start()
    looker.join(30)
    return found[0]


@pytest.fixture
def parts(monkeypatch) -> list[tuple[str, str, bool | None]]:
    """Two parts registered (one before the session row, one after it) that note each call and whether the
    session row was locked then."""
    calls: list[tuple[str, str, bool | None]] = []

    def part(name: str) -> holdings.Forget:
        def forget(session_id: str) -> dict[str, int]:
            calls.append((name, session_id, _row_locked(session_id)))
            return {}

        return forget

    monkeypatch.setattr(holdings, "_holdings", [*holdings._holdings, holdings.Holding((), part("after")),
                                                holdings.Holding((), part("before"), before_session_row=True)])
    return calls


def _replace_with_its_transcript(session_id: str) -> None:
    doc = json.loads(export.dumps(export.transcript(ChatSession.objects.get(pk=session_id))))
    restore.restore(doc, replace=True)


DELETES = {
    "the store's delete": lambda sid: runtime.site_store().delete(sid),
    "the store's clear": lambda sid: runtime.site_store().clear(),
    "the console's delete": lambda sid: actions.delete_session(personas.operator(), sid),
    "an import that replaces the session": _replace_with_its_transcript,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deleting", DELETES.values(), ids=DELETES.keys())
def test_every_delete_forgets_each_part_once_before_or_after_it_locks_the_session_row(parts, deleting):
    store("s1", support_story())
    locked = connection.vendor == "postgresql" or None
    unlocked = False if locked else None

    deleting("s1")

    assert parts == [("before", "s1", unlocked), ("after", "s1", locked)]
