"""The lean ASGI path (webhooks_app.asgi): webhook POSTs skip the browser middleware, nothing else does.

Proof that a response came through the lean path: no ``X-Frame-Options`` (XFrameOptionsMiddleware adds it
to every response on the full path), while SecurityMiddleware's ``X-Content-Type-Options`` is still there.
"""

from __future__ import annotations

import http.client
import json

import pytest
from channels.testing import HttpCommunicator

from chatflow_site.asgi import application
from tests.processes import stop
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers as s
from tests.webhooks_app.fakes import FakeProviderAPI
from webhooks_app import views
from webhooks_app.asgi import is_lean
from webhooks_app.models import InboundDelivery


def request(base: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """One request without following redirects; the response is read (``.data``) and closed."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.data = response.read()  # type: ignore[attr-defined]
        return response
    finally:
        conn.close()


@pytest.fixture(scope="module")
def daphne(tmp_path_factory, django_db_setup):
    """One daphne on the test database for the module's tests: none of them changes the server."""
    tmp_path = tmp_path_factory.mktemp("lean")
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        env = s.child_env(wa.base, tg.base, tmp_path, CHATFLOW_EMBEDDED_WORKER="off")
        proc, base = s.start_daphne(env, tmp_path / "daphne.log")
        try:
            yield base
        finally:
            stop(proc)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_signed_webhook_post_is_queued_through_the_lean_path_and_the_console_is_not(daphne):
    body = p.generic("lean-1", "m-1", "hello")
    headers = {"Content-Type": "application/json", "X-Chatflow-Signature": p.sign(body, p.GENERIC_SECRET)}
    response = request(daphne, "POST", "/webhooks/generic/", body, headers)
    assert response.status == 202, response.data
    assert json.loads(response.data)["status"] == "queued"
    assert InboundDelivery.objects.get().session_id == "lean-1"
    assert response.getheader("Set-Cookie") is None
    assert "cookie" not in (response.getheader("Vary") or "").lower()
    assert response.getheader("X-Frame-Options") is None  # no browser middleware ran
    assert response.getheader("X-Content-Type-Options") == "nosniff"  # SecurityMiddleware did

    # A console page under /webhooks/ goes through the full stack: login required.
    ledger = request(daphne, "GET", "/webhooks/ledger/lean-1/")
    assert ledger.status == 302 and "/login/" in ledger.getheader("Location", "")
    assert ledger.getheader("X-Frame-Options") == "DENY"
    retry = request(daphne, "POST", f"/webhooks/deliveries/{InboundDelivery.objects.get().pk}/retry/")
    assert retry.status == 403  # CSRF, before the view's login check: the full stack
    assert retry.getheader("X-Frame-Options") == "DENY"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_bad_host_is_refused_with_400_on_the_lean_path_and_writes_nothing(daphne):
    body = p.generic("lean-2", "m-1", "hello")
    headers = {"Content-Type": "application/json", "X-Chatflow-Signature": p.sign(body, p.GENERIC_SECRET),
               "Host": "evil.example"}
    response = request(daphne, "POST", "/webhooks/generic/", body, headers)
    assert response.status == 400
    assert not InboundDelivery.objects.exists()
    assert request(daphne, "GET", "/webhooks/ledger/lean-2/", headers={"Host": "evil.example"}).status == 400


@pytest.mark.parametrize(("method", "path", "lean"), [
    ("POST", "/webhooks/whatsapp/", True),
    ("POST", "/webhooks/telegram/", True),
    ("POST", "/webhooks/generic/", True),
    ("GET", "/webhooks/whatsapp/", False),  # Meta's verification handshake: the full stack is fine
    ("POST", "/webhooks/deliveries/1/retry/", False),
    ("POST", "/webhooks/nowhere/", False),
    ("POST", "/login/", False),
])
def test_only_posts_to_marked_views_take_the_lean_path(method, path, lean):
    assert is_lean({"type": "http", "method": method, "path": path}) is lean


@pytest.mark.asyncio
async def test_an_exception_in_a_webhook_view_is_a_logged_json_500(monkeypatch, caplog):
    async def broken(request):
        raise RuntimeError("boom")

    monkeypatch.setattr(views, "_generic_accept", broken)
    body = p.generic("lean-3", "m-1", "hello")
    communicator = HttpCommunicator(application, "POST", "/webhooks/generic/", body=body,
                                    headers=[(b"host", b"127.0.0.1"), (b"content-type", b"application/json")])
    response = await communicator.get_response()
    await communicator.send_input({"type": "http.disconnect"})  # lets ASGIHandler.handle finish and clean up
    await communicator.wait()
    assert response["status"] == 500
    assert json.loads(response["body"])["error"] == "server_error"
    record = next(r for r in caplog.records if r.name == "django.request")
    assert record.levelname == "ERROR" and record.exc_info[0] is RuntimeError


async def asgi_request(method: str, path: str, body: bytes = b"", headers: list | None = None) -> dict:
    """One request through the site's ASGI application (the route real servers take); the response event."""
    communicator = HttpCommunicator(application, method, path, body=body,
                                    headers=[(b"host", b"127.0.0.1"), *(headers or [])])
    response = await communicator.get_response()
    await communicator.send_input({"type": "http.disconnect"})  # lets ASGIHandler.handle finish and clean up
    await communicator.wait()
    return response


@pytest.mark.asyncio
async def test_a_content_length_that_is_not_a_number_is_a_json_400_on_the_lean_path():
    body = p.generic("lean-4", "m-1", "hello")
    response = await asgi_request("POST", "/webhooks/generic/", body, [
        (b"content-type", b"application/json"), (b"content-length", b"abc"),
        (b"x-chatflow-signature", p.sign(body, p.GENERIC_SECRET).encode())])

    assert response["status"] == 400
    assert json.loads(response["body"]) == {"error": "bad_content_length", "detail": "Content-Length is not a number."}
    headers = {name.lower(): value for name, value in response["headers"]}
    assert b"x-frame-options" not in headers and headers[b"x-content-type-options"] == b"nosniff"  # the lean path


@pytest.mark.asyncio
async def test_a_wrong_method_is_a_json_405_through_the_asgi_application():
    response = await asgi_request("GET", "/webhooks/telegram/")

    headers = {name.lower(): value for name, value in response["headers"]}
    assert response["status"] == 405 and headers[b"allow"] == b"POST"
    assert headers[b"content-type"] == b"application/json"
    assert json.loads(response["body"])["error"] == "method_not_allowed"
