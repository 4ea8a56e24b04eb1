"""``?wait=true`` on the generic webhook: the request waits for a queue worker to play the turn, and a client that
retries (its connection dropped) gets the answer."""

from __future__ import annotations

import pytest

from tests.webhooks_app import payloads as p
from tests.webhooks_app.running import running_worker
from tests.webhooks_app.test_endpoints import post_generic
from tests.webhooks_app.test_worker import apis, texts  # noqa: F401 - apis is a fixture
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(apis):  # noqa: F811
    with running_worker() as running:
        yield running


def test_a_retried_wait_request_of_a_finished_delivery_gets_its_answer(client, apis, worker):  # noqa: F811
    body = p.generic("web:7", "m-7", "where is my order")
    first = post_generic(client, body, query="?wait=true")
    assert first.status_code == 200 and first.json()["answer"] == "echo: where is my order"
    again = post_generic(client, body, query="?wait=true")
    assert again.status_code == 200, again.content
    assert again.json() == {**first.json(), "duplicate": True}
    assert texts("web:7") == [("user", "where is my order"), ("model", "echo: where is my order")]  # one turn
    assert InboundDelivery.objects.get().duplicates_suppressed == 1


def test_a_wait_request_for_a_duplicate_still_queued_waits_for_it_like_the_first(client, apis):  # noqa: F811
    body = p.generic("web:8", "m-8", "hello")
    assert post_generic(client, body).status_code == 202  # queued; no worker has taken it
    with running_worker():
        r = post_generic(client, body, query="?wait=true")
    assert r.status_code == 200, r.content
    assert (r.json()["status"], r.json()["answer"], r.json()["duplicate"]) == ("done", "echo: hello", True)
    assert texts("web:8") == [("user", "hello"), ("model", "echo: hello")]


def test_a_duplicate_without_wait_is_still_acknowledged_without_the_answer(client, apis, worker):  # noqa: F811
    body = p.generic("web:9", "m-9", "hi")
    post_generic(client, body, query="?wait=true")
    r = post_generic(client, body)
    assert r.status_code == 200 and r.json() == {"ok": True, "status": "duplicate"}


def test_a_wait_request_for_a_delivery_cancelled_by_a_delete_is_a_410_at_once(client, apis):  # noqa: F811
    from tests.webhooks_app.test_settle import delete

    first = p.generic("web:10", "m-10", "hello")
    with running_worker():
        assert post_generic(client, first, query="?wait=true").status_code == 200  # the session exists
    queued = p.generic("web:10", "m-11", "are you there?")
    assert post_generic(client, queued).status_code == 202  # queued; no worker has taken it
    delete("web:10")
    r = post_generic(client, queued, query="?wait=true")  # the client retries: the delivery is settled
    assert r.status_code == 410, r.content
    assert (r.json()["error"], r.json()["status"], r.json()["duplicate"]) == ("session_deleted", "cancelled", True)


def test_a_wait_request_for_a_delivery_answered_before_its_session_was_deleted_is_a_410(client, apis, worker):  # noqa: F811
    from tests.webhooks_app.test_settle import delete

    body = p.generic("web:12", "m-12", "hello")
    assert post_generic(client, body, query="?wait=true").json()["answer"] == "echo: hello"
    delete("web:12")
    r = post_generic(client, body, query="?wait=true")  # a retry after the delete: the answer went with it
    assert r.status_code == 410, r.content
    assert (r.json()["error"], r.json()["status"], r.json()["duplicate"]) == ("session_deleted", "done", True)
    assert "answer" not in r.json() and texts("web:12") == []


@pytest.mark.parametrize("wait", ["", "?wait=true"])
def test_a_message_id_another_session_used_is_a_409_and_touches_nothing_of_that_session(
        client, apis, worker, wait):  # noqa: F811
    first = post_generic(client, p.generic("web:13", "m-13", "my refund for order 77"), query="?wait=true")
    assert first.json()["answer"] == "echo: my refund for order 77"
    r = post_generic(client, p.generic("web:14", "m-13", "hi"), query=wait)
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "message_id_conflict" and "order 77" not in r.content.decode()
    assert texts("web:14") == [] and InboundDelivery.objects.count() == 1
    assert InboundDelivery.objects.get().duplicates_suppressed == 0  # not counted as web:13's duplicate
    again = post_generic(client, p.generic("web:13", "m-13", "my refund for order 77"), query=wait)
    assert again.status_code == 200  # the same session's redelivery is still a duplicate
    assert InboundDelivery.objects.get().duplicates_suppressed == 1


def test_a_message_through_another_channel_keeps_the_sessions_channel(client, apis, worker):  # noqa: F811
    """A signed generic message on a WhatsApp customer's session does not relabel it (its channel decides
    that the live chat may not write to it)."""
    from sessions_app.models import ChatSession
    from tests.webhooks_app.test_endpoints import post_wa
    from tests.webhooks_app.test_worker import drain
    from webhooks_app.arrival import arrival_of

    post_wa(client, p.whatsapp(p.wa_text("wamid.K", "hello")))
    drain()
    session = ChatSession.objects.get()
    assert session.metadata["channel"] == "whatsapp"
    r = post_generic(client, p.generic(session.pk, "g-1", "hi from the CRM"), query="?wait=true")
    assert r.status_code == 200, r.content
    session.refresh_from_db()
    assert session.metadata["channel"] == "whatsapp"
    assert texts(session.pk)[-2:] == [("user", "hi from the CRM"), ("model", "echo: hi from the CRM")]
    arrived = arrival_of(session.pk, session.metadata)  # an operator's reply still goes to WhatsApp
    assert arrived is not None and (arrived.provider, arrived.address["wa_id"]) == ("whatsapp", session.pk)


def test_a_wait_request_plays_nothing_itself_it_waits_for_a_worker(client, apis, monkeypatch):  # noqa: F811
    """Without a worker the turn is not played in the web process: after the wait the delivery is still queued
    (202); the worker that starts later plays it, once."""
    from webhooks_app import views

    monkeypatch.setattr(views, "WAIT_SECONDS", 0.3)
    r = post_generic(client, p.generic("web:20", "m-20", "hello"), query="?wait=true")
    assert r.status_code == 202, r.content
    assert r.json()["status"] == "queued" and texts("web:20") == []
    delivery = InboundDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.lease_owner) == ("queued", 0, "")
    with running_worker() as worker:
        again = post_generic(client, p.generic("web:20", "m-20", "hello"), query="?wait=true")
    assert again.status_code == 200 and again.json()["answer"] == "echo: hello"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.lease_owner) == (1, worker.owner)
    assert texts("web:20") == [("user", "hello"), ("model", "echo: hello")]
