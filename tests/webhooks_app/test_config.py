"""Webhook settings fail loudly when malformed; the admin shows the inbox read-only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured

from tests.chatflow_site.test_settings import settings_from
from tests.webhooks_app import payloads as p
from webhooks_app.models import InboundDelivery


@pytest.mark.parametrize(("name", "value"), [
    ("WHATSAPP_API_BASE", "ftp://graph.example"),
    ("TELEGRAM_API_BASE", "api.telegram.org"),
    ("CHATFLOW_WEBHOOK_MAX_BYTES", "-1"),
    ("CHATFLOW_EMBEDDED_WORKER", "sometimes"),
    ("CHATFLOW_QUEUE_VISIBILITY_SECONDS", "0"),
    ("CHATFLOW_LEASE_SECONDS", "0"),
])
def test_a_malformed_webhook_setting_stops_start_up_naming_it(name, value):
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_from({name: value})
    assert name in str(refused.value)


def test_the_lease_setting_and_its_former_name_must_not_disagree():
    with pytest.raises(ImproperlyConfigured) as both:
        settings_from({"CHATFLOW_LEASE_SECONDS": "5", "CHATFLOW_QUEUE_VISIBILITY_SECONDS": "7"})
    assert "CHATFLOW_LEASE_SECONDS" in str(both.value)
    former = settings_from({"CHATFLOW_QUEUE_VISIBILITY_SECONDS": "7"})
    assert former["CHATFLOW_LEASE_SECONDS"] == 7


@pytest.mark.django_db
def test_the_admin_lists_deliveries_read_only(client):
    admin = User.objects.create_superuser("root", "root@example.test", p.WA_SECRET)
    client.force_login(admin)
    InboundDelivery.objects.create(provider="whatsapp", provider_message_id="wamid.adm", claim_key="wamid.adm",
                                   session_id="15550100", token="t")
    r = client.get("/admin/webhooks_app/inbounddelivery/")
    assert r.status_code == 200 and b"wamid.adm" in r.content
    d = InboundDelivery.objects.get()
    assert client.get(f"/admin/webhooks_app/inbounddelivery/{d.pk}/change/").status_code == 200
    assert client.post(f"/admin/webhooks_app/inbounddelivery/{d.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/webhooks_app/inbounddelivery/add/").status_code == 403
