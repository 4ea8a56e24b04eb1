"""Deleting a session settles its webhook deliveries: cancelled, redacted, never played into a new session."""

from __future__ import annotations

import ast
import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.urls import reverse

from sessions_app import actions
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from tests.processes import REPO
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.test_endpoints import post_generic, post_wa
from webhooks_app import settle, taskqueue
from webhooks_app.models import InboundDelivery
from webhooks_app.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"  # the WhatsApp sender of payloads.wa_text


@pytest.fixture
def wa(settings):
    settings.CHATFLOW_AGENTS = "tests.webhooks_app.agents.build"
    with FakeProviderAPI() as api:
        settings.WHATSAPP_API_BASE = api.base
        yield api


def drain() -> int:
    return asyncio.run(Worker(slots=2, poll=0.05).run(drain=True))


def users(session_id: str) -> list[str]:
    return list(ChatMessage.objects.filter(session_id=session_id, role="user").order_by("id")
                .values_list("content", flat=True))


def delete(session_id: str) -> OperatorAction:
    operator = personas.client_for(personas.operator())
    assert operator.post(reverse("sessions-delete-session", args=[session_id])).status_code == 302
    return OperatorAction.objects.get(action="delete", session_id=session_id)


def play(worker: Worker, delivery: InboundDelivery) -> None:
    """What a worker does with a delivery it has claimed (on its own queue thread)."""
    ex = ThreadPoolExecutor(1)
    try:
        asyncio.run(worker.process(delivery, ex))
    finally:
        ex.submit(connections.close_all).result()
        ex.shutdown()


def test_deleting_with_the_worker_stopped_cancels_the_queued_deliveries_and_the_session_stays_deleted(client, wa):
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "my card is 4242")))
    drain()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "second")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.3", "third")))

    entry = delete(SID)
    assert entry.after["deliveries_cancelled"] == 2
    assert drain() == 0
    assert not ChatSession.objects.filter(pk=SID).exists() and users(SID) == []
    statuses = dict(InboundDelivery.objects.values_list("provider_message_id", "status"))
    assert statuses == {"wamid.1": "done", "wamid.2": "cancelled", "wamid.3": "cancelled"}
    replies = set(InboundDelivery.objects.filter(status="cancelled").values_list("reply_status", flat=True))
    assert replies == {InboundDelivery.Reply.NONE}  # the ledger says "Nothing to send", not "Not yet"
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: my card is 4242"]


def test_deletion_redacts_the_deliveries_but_redeliveries_stay_duplicates(client, wa):
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "my card is 4242 4242 4242 4242")))
    drain()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "and my pin is 1234")))
    entry = delete(SID)
    assert entry.after["deliveries_redacted"] == 2
    for d in InboundDelivery.objects.all():
        assert (d.text, d.answer, d.payload, d.metadata) == ("", "", {}, {})
        assert d.provider_message_id in ("wamid.1", "wamid.2")
    viewer = personas.client_for(personas.viewer())
    for d in InboundDelivery.objects.all():
        page = viewer.get(reverse("admin:webhooks_app_inbounddelivery_change", args=[d.pk]))
        assert page.status_code == 200 and d.provider_message_id.encode() in page.content
        # Spaced digits and a phrase: a bare "4242" can be in the page's lease owner (host:pid:…) or a hex id.
        assert b"4242 4242" not in page.content and b"pin is 1234" not in page.content

    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "and my pin is 1234")))  # the provider delivers again
    assert drain() == 0
    assert InboundDelivery.objects.get(provider_message_id="wamid.2").duplicates_suppressed == 1
    assert not ChatSession.objects.filter(pk=SID).exists()


def test_a_failed_delivery_of_a_deleted_session_is_cancelled_and_no_retry_plays_it(client, wa, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATFLOW_TEST_DOWN_FILE", str(tmp_path / "down"))
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "hello")))
    drain()
    (tmp_path / "down").touch()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "my card is 4242 [down]")))
    drain()
    (tmp_path / "down").unlink()
    failed = InboundDelivery.objects.get(provider_message_id="wamid.2")
    assert failed.status == "failed" and "ProviderDown" in failed.error

    assert delete(SID).after["deliveries_cancelled"] == 1
    failed.refresh_from_db()
    assert failed.status == "cancelled" and failed.text == ""
    assert failed.error.startswith(settle.CANCELLED_FAILED) and "ProviderDown" in failed.error  # the reason stays
    operator = personas.client_for(personas.operator("rita.retrier"))
    r = operator.post(reverse("webhooks-retry-delivery", args=[failed.pk]), HTTP_HX_REQUEST="true")
    assert r.status_code == 409 and b"Only a failed delivery can be retried." in r.content
    bulk = operator.post(reverse("health-retry-deliveries"), {"delivery": [failed.pk]}, HTTP_HX_REQUEST="true")
    assert bulk.status_code == 409 and b"Only a failed delivery can be retried." in bulk.content
    assert drain() == 0
    assert not ChatSession.objects.filter(pk=SID).exists() and users(SID) == []
    assert InboundDelivery.objects.get(pk=failed.pk).status == "cancelled"


def test_a_delivery_whose_fallback_is_still_going_out_when_its_session_is_deleted_cannot_be_retried(client, wa):
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "hello")))
    drain()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "my card is 4242")))
    owner = "worker:sending-fallback"
    claimed = taskqueue.claim_next(owner, 30)
    assert claimed is not None and claimed.provider_message_id == "wamid.2"
    # Its turn failed; the fallback is on its way to the customer (the worker sends it, then completes).
    assert taskqueue.fail(claimed, owner, "ProviderDown: down", "Sorry, try again.", InboundDelivery.Reply.SENDING)

    assert delete(SID).after["deliveries_cancelled"] == 1
    taskqueue.complete(claimed, owner, InboundDelivery.Reply.SENT)  # the send ended after the delete
    claimed.refresh_from_db()
    assert (claimed.status, claimed.text) == ("cancelled", "")
    assert claimed.error == settle.CANCELLED_FAILED + "ProviderDown: down"
    operator = personas.client_for(personas.operator("rita.retrier"))
    r = operator.post(reverse("webhooks-retry-delivery", args=[claimed.pk]), HTTP_HX_REQUEST="true")
    assert r.status_code == 409
    assert drain() == 0 and not ChatSession.objects.filter(pk=SID).exists()


def test_a_delivery_claimed_before_the_delete_and_played_after_creates_no_session(client, wa, caplog):
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "hello")))
    drain()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "queued before the delete")))
    worker = Worker(slots=1)
    claimed = taskqueue.claim_next(worker.owner, 30)
    assert claimed is not None and claimed.provider_message_id == "wamid.2"

    assert delete(SID).after["deliveries_cancelled"] == 1
    caplog.set_level("INFO", logger="webhooks_app.worker")
    play(worker, claimed)
    assert not ChatSession.objects.filter(pk=SID).exists()
    assert InboundDelivery.objects.get(pk=claimed.pk).status == "cancelled"
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "webhooks_app.worker"]
    assert said == [("INFO", f"Delivery {claimed.pk}: its session was deleted during its turn; not played")]
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: hello"]


def test_a_delivery_claimed_before_the_delete_is_not_played_into_the_session_a_later_message_created(client, wa):
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "hello")))
    drain()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "old message")))
    worker = Worker(slots=1)
    claimed = taskqueue.claim_next(worker.owner, 30)
    delete(SID)
    post_wa(client, p.whatsapp(p.wa_text("wamid.3", "a new conversation")))
    assert drain() == 1
    play(worker, claimed)
    assert users(SID) == ["a new conversation"]
    assert InboundDelivery.objects.get(pk=claimed.pk).status == "cancelled"
    page = personas.client_for(personas.viewer()).get(f"/sessions/{SID}/").content.decode()
    assert f'<tr id="delivery-{claimed.pk}" class="delivery cancelled">' in page  # the ledger says so
    assert settle.CANCELLED_ERROR in page and "old message" not in page


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


def test_with_a_running_worker_no_deleted_session_comes_back(client, settings):
    settings.CHATFLOW_AGENTS = "tests.webhooks_app.agents.build"
    rng = random.Random(16)
    operator = personas.operator()
    worker = Worker(slots=2, poll=0.02)
    thread = threading.Thread(target=asyncio.run, args=(worker.run(),), name="test-worker")
    thread.start()
    try:
        for i in range(12):
            sid = f"race-{i}"
            post_generic(client, p.generic(sid, f"{sid}.1", "first"))
            _wait_until(lambda sid=sid: ChatSession.objects.filter(pk=sid).exists(), f"{sid} to be created")
            for n in (2, 3):
                text = f"later [slow {rng.choice([0, 0.002, 0.01])}]"
                post_generic(client, p.generic(sid, f"{sid}.{n}", text))
            time.sleep(rng.choice([0, 0.001, 0.003, 0.008, 0.02]))
            actions.delete_session(operator, sid)
        _wait_until(lambda: taskqueue.pending() == 0, "the queue to be empty")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert list(ChatSession.objects.filter(pk__startswith="race-")) == []
    assert not ChatMessage.objects.exists()
    assert set(InboundDelivery.objects.values_list("status", flat=True)) <= {"done", "cancelled"}
    assert not InboundDelivery.objects.exclude(text="").exists()


def test_nothing_but_settle_records_a_turns_answer_on_its_delivery() -> None:
    callers = set()
    for path in REPO.glob("*_app/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named = (isinstance(node, ast.Attribute) and node.attr == "finish" and isinstance(node.value, ast.Name)
                     and node.value.id == "taskqueue")
            imported = (isinstance(node, ast.ImportFrom) and node.module == "webhooks_app.taskqueue"
                        and any(alias.name == "finish" for alias in node.names))
            if named or imported:
                callers.add(str(path.relative_to(REPO)))
    assert callers == {"webhooks_app/settle.py"}
