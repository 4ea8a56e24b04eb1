"""Retention and the webhook pipeline: a session with a delivery in flight is kept until it is played, and a
provider's redelivery of a deleted session's old message stays a duplicate (nothing is resurrected)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from sessions_app import retention
from sessions_app.models import ChatSession, OperatorAction
from tests.sessions_app.conversations import model, store, user
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_wa
from tests.webhooks_app.test_settle import SID, drain, users, wa  # noqa: F401 - wa is a fixture
from webhooks_app import heartbeat
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)

POLICY = retention.Policy({"whatsapp": 30})


def later() -> datetime:
    return timezone.now() + timedelta(days=31)


def test_a_redelivery_of_a_session_retention_deleted_stays_a_duplicate(client, wa):  # noqa: F811
    body = p.whatsapp(p.wa_text("wamid.1", "my card is 4242"))
    assert post_wa(client, body).status_code == 200
    drain()
    assert users(SID) == ["my card is 4242"]

    assert dict(retention.sweep(policy=POLICY, now=later()).deleted) == {"whatsapp": 1}
    assert not ChatSession.objects.filter(pk=SID).exists()

    r = post_wa(client, body)  # the provider delivers the old message again
    assert r.status_code == 200 and r.json()["duplicates"] == 1
    assert drain() == 0
    assert not ChatSession.objects.filter(pk=SID).exists() and users(SID) == []
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: my card is 4242"]  # nothing sent again


def test_a_session_with_a_queued_delivery_is_kept_until_it_is_played(client, wa):  # noqa: F811
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "hello")))
    drain()
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "still there?")))  # queued; no worker has taken it

    report = retention.sweep(policy=POLICY, now=later())
    assert report.by_reason() == {"delivery_in_flight": 1} and ChatSession.objects.filter(pk=SID).exists()

    drain()
    assert InboundDelivery.objects.get(provider_message_id="wamid.2").status == "done"
    assert retention.sweep(policy=POLICY, now=later()).total_deleted == 1
    assert not ChatSession.objects.filter(pk=SID).exists()


def test_a_workers_periodic_run_applies_the_settings_policy_and_audits_it(settings):
    settings.CHATFLOW_RETENTION_DAYS = {}
    assert heartbeat.apply_retention() is None  # no limit: no run
    store("web-old", [user("hi"), model("hello")], metadata={"channel": "web"},
          updated=timezone.now() - timedelta(days=40))
    store("web-new", [user("hi"), model("hello")], metadata={"channel": "web"}, updated=timezone.now())
    settings.CHATFLOW_RETENTION_DAYS = {"web": 30}

    report = heartbeat.apply_retention()

    assert report is not None and dict(report.deleted) == {"web": 1}
    assert set(ChatSession.objects.values_list("pk", flat=True)) == {"web-new"}
    assert OperatorAction.objects.get(pk=report.audit_id).after["via"] == "worker"
