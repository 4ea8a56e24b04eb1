"""Login throttling: failed logins are counted per account and per address; at the limit the login page
refuses (429, saying why and for how long) even the right password, the lockout is written once to the audit
log, and an administrator lifts it in the Django admin."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from sessions_app.models import OperatorAction
from tests.sessions_app import personas

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
LIMIT = settings.AXES_FAILURE_LIMIT


def attempt(username: str, password: str, address: str = "203.0.113.7", **headers: str) -> tuple[int, Client]:
    client = Client(REMOTE_ADDR=address, **headers)
    answer = client.post(LOGIN, {"username": username, "password": password})
    return answer.status_code, client


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def lockouts() -> list[OperatorAction]:
    return list(OperatorAction.objects.filter(action="login_lockout"))


def test_the_right_password_still_logs_in_below_the_limit():
    personas.operator()
    for _ in range(LIMIT - 1):
        assert attempt("olga.operator", "wrong")[0] == 200
    status, client = attempt("olga.operator", personas.PASSWORD)
    assert status == 302 and logged_in(client)
    assert lockouts() == []


def test_at_the_limit_the_account_is_locked_with_a_clear_message():
    personas.operator()
    for _ in range(LIMIT):
        attempt("olga.operator", "wrong")
    client = Client(REMOTE_ADDR="198.51.100.9")  # another address: the account itself is locked
    answer = client.post(LOGIN, {"username": "olga.operator", "password": personas.PASSWORD})
    assert answer.status_code == 429 and not logged_in(client)
    page = answer.content.decode()
    assert "Too many failed logins for this account or from this address" in page
    assert "locked for 15 minutes" in page and 'name="username"' in page  # the form is still there


def test_at_the_limit_the_address_is_locked_for_every_account():
    personas.operator()
    for n in range(LIMIT):
        attempt(f"guess-{n}", "wrong")
    status, client = attempt("olga.operator", personas.PASSWORD)
    assert status == 429 and not logged_in(client)
    status, client = attempt("olga.operator", personas.PASSWORD, address="198.51.100.9")
    assert status == 302 and logged_in(client)  # the account was never the one guessed at


def test_a_lockout_is_audited_once():
    personas.operator()
    for _ in range(LIMIT * 3):  # attempts during the lockout neither count nor write an entry
        attempt("olga.operator", "wrong")
    (entry,) = lockouts()
    assert entry.actor is None and entry.session_id == ""
    assert entry.after == {"username": "olga.operator", "ip_address": "203.0.113.7", "failures": LIMIT,
                           "cool_off_minutes": 15}
    viewer = personas.client_for(personas.viewer())
    page = viewer.get("/audit/")
    assert page.status_code == 200 and "Login lockout" in page.content.decode()


def test_an_administrator_lifts_a_lockout_in_the_admin():
    personas.operator()
    for _ in range(LIMIT):
        attempt("olga.operator", "wrong")
    assert attempt("olga.operator", personas.PASSWORD)[0] == 429
    admin = Client()
    admin.force_login(User.objects.create_superuser("ada.admin", "ada@example.test", "ada's long password 9"))
    listing = admin.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "olga.operator" in listing.content.decode()
    ids = [str(pk) for pk in AccessAttempt.objects.values_list("pk", flat=True)]
    answer = admin.post("/admin/axes/accessattempt/", {"action": "delete_selected", "_selected_action": ids,
                                                       "post": "yes"})
    assert answer.status_code == 302 and not AccessAttempt.objects.exists()
    status, client = attempt("olga.operator", personas.PASSWORD)
    assert status == 302 and logged_in(client)


def test_behind_the_proxy_the_address_is_the_one_the_proxy_added(settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    personas.operator()
    proxy = "10.0.0.2"
    for n in range(LIMIT):  # one client guessing, whatever it writes into the header itself
        attempt(f"guess-{n}", "wrong", proxy, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}, 203.0.113.7")
    status, client = attempt("olga.operator", personas.PASSWORD, proxy, HTTP_X_FORWARDED_FOR="198.51.100.9")
    assert status == 302 and logged_in(client)  # another client through the same proxy logs in
    status, client = attempt("olga.operator", personas.PASSWORD, proxy, HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert status == 429 and not logged_in(client)
    (entry,) = lockouts()
    assert entry.after["ip_address"] == "203.0.113.7"
