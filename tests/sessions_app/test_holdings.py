"""What belongs to a session: every table of the project with a session id column is registered, and a
table nobody registered fails the system check."""

from __future__ import annotations

import os
from pathlib import Path

import django
from django.core import checks

from sessions_app import holdings
from takeover_app.models import SessionMode


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

    assert labels == {"sessions_app", "agents_app", "api_app", "webhooks_app", "turns_app", "takeover_app",
                      "health_app"}


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
