"""Webhook settings fail loudly when malformed; the admin shows the inbox read-only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.processes import run_manage, site_env
from tests.webhooks_app import payloads as p
from webhooks_app.models import InboundDelivery


@pytest.mark.slow
@pytest.mark.parametrize(("name", "value"), [
    ("WHATSAPP_API_BASE", "ftp://graph.example"),
    ("TELEGRAM_API_BASE", "api.telegram.org"),
    ("CHATFLOW_WEBHOOK_MAX_BYTES", "-1"),
    ("CHATFLOW_EMBEDDED_WORKER", "sometimes"),
    ("CHATFLOW_QUEUE_VISIBILITY_SECONDS", "0"),
    ("CHATFLOW_LEASE_SECONDS", "0"),
])
def test_a_malformed_webhook_setting_stops_start_up_naming_it(name, value, tmp_path):
    result = run_manage("check", env=site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}", **{name: value}))
    assert result.returncode != 0 and name in result.stderr


@pytest.mark.slow
def test_the_lease_setting_and_its_former_name_must_not_disagree(tmp_path):
    db = f"sqlite:///{tmp_path / 'x.db'}"
    both = run_manage("check", env=site_env(DATABASE_URL=db, CHATFLOW_LEASE_SECONDS="5",
                                            CHATFLOW_QUEUE_VISIBILITY_SECONDS="7"))
    assert both.returncode != 0 and "CHATFLOW_LEASE_SECONDS" in both.stderr
    code = "from django.conf import settings; print(settings.CHATFLOW_LEASE_SECONDS)"
    former = run_manage("shell", "-c", code, env=site_env(DATABASE_URL=db, CHATFLOW_QUEUE_VISIBILITY_SECONDS="7"))
    assert former.returncode == 0 and former.stdout.splitlines()[-1] == "7"


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
