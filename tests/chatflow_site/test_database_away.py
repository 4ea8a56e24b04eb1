"""While the database does not answer, pages, the API and /metrics answer 503 with the reason (never a 500), the
liveness probe still answers and the readiness probe says what is missing."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.processes import free_port
from tests.sessions_app import personas

pytestmark = pytest.mark.django_db(transaction=True)

METRICS_TOKEN = "metrics-token-for-the-outage"


@pytest.fixture
def database_away(settings):
    """The site's connection pointed where no database answers (a closed port, a directory that does not
    exist), as when the server is down; put back afterwards."""
    settings.CHATFLOW_METRICS_TOKEN = METRICS_TOKEN
    saved = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = "/nonexistent-chatflow-directory/chatflow.db"
    else:
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


@pytest.fixture
def operator_client():
    return personas.client_for(personas.operator())


def test_a_console_page_is_a_503_page_with_the_reason(operator_client, database_away):
    response = operator_client.get("/sessions/", HTTP_ACCEPT="text/html")
    assert response.status_code == 503
    assert response["Retry-After"].isdigit()
    html = response.content.decode()
    assert "Temporarily unavailable" in html and "The database is not answering" in html


def test_a_client_that_does_not_ask_for_html_gets_json(operator_client, database_away):
    response = operator_client.get("/health/", HTTP_ACCEPT="application/json")
    assert response.status_code == 503
    assert response.json()["error"] == "database_unavailable"


def test_the_login_page_post_is_a_503_too(database_away, client):
    response = client.post("/accounts/login/", {"username": "x", "password": "y"}, HTTP_ACCEPT="text/html")
    assert response.status_code == 503


def test_the_api_answers_503_json(operator_client, database_away):
    response = operator_client.get("/api/v1/sessions")
    assert response.status_code == 503, response.content
    assert response.json()["error"] == "database_unavailable" and "Try again" in response.json()["detail"]
    assert response["Retry-After"].isdigit()
    bearer = operator_client.get("/api/v1/sessions", HTTP_AUTHORIZATION="Bearer some-token")
    assert bearer.status_code == 503, bearer.content


def test_metrics_answer_503(database_away, client):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    assert response.status_code == 503, response.content[:300]


def test_liveness_says_ok_and_readiness_says_the_database_is_unreachable(database_away, client):
    assert client.get("/healthz/").content == b"ok"
    response = client.get("/readyz/")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable",
                               "checks": {"database": "unreachable", "channel_layer": "in-memory"}}
    assert response["Retry-After"].isdigit()


def test_readiness_is_200_when_the_database_answers(client):
    response = client.get("/readyz/")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "checks": {"database": "ok", "channel_layer": "in-memory"}}


def test_readiness_checks_the_redis_layer_when_one_is_configured(client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    response = client.get("/readyz/")
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "channel_layer": "unreachable"}


class SessionTablesAway:
    """A middleware that reads the database before any view (as a session or login check can)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.db import OperationalError

        raise OperationalError("connection refused")


@pytest.mark.parametrize("debug", [False, True])
def test_a_middleware_that_finds_the_database_away_gets_the_503_page_too(settings, debug, caplog):
    from django.test import Client

    settings.DEBUG = debug  # with DEBUG on, Django would answer with its debug page
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.SessionTablesAway"]
    response = Client(raise_request_exception=False).get("/sessions/", HTTP_ACCEPT="text/html")
    assert response.status_code == 503
    assert "The database is not answering" in response.content.decode()
    assert response["Retry-After"].isdigit()
    assert "script-src 'self'" in response["Content-Security-Policy"]  # the site's headers, as on every page
    assert response["X-Content-Type-Options"] == "nosniff"
    assert any("503, the database does not answer (OperationalError: connection refused)" in r.getMessage()
               for r in caplog.records)
