"""The health page on a phone, in a real browser (Debian's chromium via Playwright, against daphne): with a
row in every table (long process names, provider ids and errors as a real deployment has them) it fits a
390 px wide screen without scrolling the page sideways."""

from __future__ import annotations

import pytest

from tests.sessions_app.test_console_browser import log_in, running_site

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROWS = """
import time
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from health_app.models import WorkerHeartbeat
from sessions_app.models import SessionLease, SessionWaiter
from takeover_app.models import OperatorReply
from turns_app.models import TurnRecord
from webhooks_app.models import InboundDelivery as D
now, olga = timezone.now(), User.objects.get(username="olga.operator")
host = "console-worker-7f9c6d5b8-x2k4q.eu-west-1.compute.internal"
owner = f"worker:{host}:48211:3f2a9c1e-6b7d-4c55-9a0e-2f1d8b7c6a54"
WorkerHeartbeat.objects.create(owner=owner, host=host, pid=48211, last_beat=now - timedelta(minutes=5))
TurnRecord.objects.create(session_id="+15550100", owner=f"{host}:48211:7c1e", status="running",
                          started_at=now - timedelta(minutes=4))
SessionLease.objects.create(session_id="+15550100", owner=f"{host}:48211:7c1e", acquired_at=time.time() - 240,
                            expires_at=time.time() - 200)
SessionWaiter.objects.create(session_id="+15550100", owner=f"{host}:48212:waiter-0b4f", expires_at=time.time() - 5)
wamid = "wamid.HBgLMTU1NTAxMDAxNTUVAgASGBQzQTdGN0Y4RTBEQ0I5NkE1QjdFOAA="
D.objects.create(provider="whatsapp", provider_message_id=wamid, claim_key=wamid, session_id="+15550100",
                 text="hello", status="failed", attempts=3, token="t1", finished_at=now,
                 error="ProviderError: 503 Service Unavailable from https://graph.facebook.com/v21.0/1098/messages")
D.objects.create(provider="whatsapp", provider_message_id=wamid + "2", claim_key=wamid + "2", session_id="+15550100",
                 text="hi", status="done", attempts=1, token="t2", finished_at=now, answer="hi", reply_status="failed",
                 reply_error="ProviderError: 131047 Re-engagement message: more than 24 hours have passed")
OperatorReply.objects.create(session_id="+15550100", text="Your parcel is at the depot in Rotterdam-Waalhaven.",
                             author=olga, author_username=olga.username, provider="whatsapp", status="failed",
                             error="ProviderError: 131047 Re-engagement message", attempts=2)
"""


@pytest.fixture(scope="module")
def site(sites, tmp_path_factory):
    with running_site(sites, tmp_path_factory.mktemp("health-phone"), seed=ROWS) as base:
        yield base


def test_the_health_page_fits_a_phone_without_scrolling_sideways(site, chromium):
    from playwright.sync_api import expect

    with chromium.fresh() as browser:
        page = browser.new_page(viewport={"width": 390, "height": 844})
        page.set_default_timeout(20_000)
        log_in(page, site)
        page.goto(f"{site}/health/")
        for row in ("tr.long-turn", "tr.expired-lease", "tr.waiter", "tr.failed-delivery", "tr.reply-attention",
                    "tr.operator-reply-attention", "tr.worker"):
            expect(page.locator(row).first).to_be_visible()
        wide = page.evaluate("""() => [...document.querySelectorAll('main *')]
            .filter(e => e.getBoundingClientRect().right > innerWidth + 0.5).slice(0, 5)
            .map(e => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)""")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, wide
