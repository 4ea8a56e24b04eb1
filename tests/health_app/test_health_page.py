"""The health page: queue per provider, long-running turns with their process, expired leases and waiters,
failed deliveries and replies with bulk Retry/Resend, worker heartbeats; who may see and act."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from health_app.models import WorkerHeartbeat
from sessions_app.models import ChatSession, OperatorAction, SessionLease, SessionWaiter
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_generic, post_tg, post_wa
from tests.webhooks_app.test_worker import apis  # noqa: F401, F811 - apis is a fixture
from turns_app.models import TurnRecord
from webhooks_app import heartbeat, taskqueue
from webhooks_app.models import InboundDelivery
from webhooks_app.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/health/"


def failed_delivery(client, n: int) -> InboundDelivery:
    post_generic(client, p.generic(f"s-{n}", f"m-{n}", f"hello {n}"))
    d = InboundDelivery.objects.get(provider_message_id=f"m-{n}")
    worker = Worker(slots=1)
    claimed = taskqueue.claim(d.pk, worker.owner, 30)
    assert taskqueue.fail(claimed, worker.owner, f"RuntimeError: boom {n}", "sorry", InboundDelivery.Reply.NONE)
    return InboundDelivery.objects.get(pk=d.pk)


def test_it_shows_the_queue_per_provider_with_the_oldest_queued_age(client):
    post_wa(client, p.whatsapp(p.wa_text("wamid.Q1", "one"), p.wa_text("wamid.Q2", "two")))
    post_tg(client, p.telegram(501, "hi"))
    InboundDelivery.objects.filter(provider_message_id="wamid.Q1").update(
        first_seen=timezone.now() - timedelta(seconds=600))
    page = personas.client_for(personas.viewer()).get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<tr class="queue-row" data-provider="whatsapp"><td>WhatsApp</td><td class="queued">2</td>' in html
    assert '<tr class="queue-row" data-provider="telegram"><td>Telegram</td><td class="queued">1</td>' in html
    assert '<tr class="queue-row" data-provider="generic"><td>Generic</td><td class="queued">0</td>' in html
    whatsapp_row = html.split('data-provider="whatsapp"')[1].split("</tr>")[0]
    age = int(whatsapp_row.split('class="oldest">')[1].split(" s")[0])
    assert 600 <= age < 3600


def test_the_fragment_is_the_health_partial_polled_by_htmx(client):
    viewer = personas.client_for(personas.viewer())
    full = viewer.get(URL).content.decode()
    fragment = viewer.get(URL, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" in full and 'hx-trigger="every 5s' in full
    assert "<html" not in fragment and fragment.lstrip().startswith('<div id="health"')
    assert 'href="/health/"' in full  # the navigation link


def test_it_lists_a_long_running_turn_with_its_owning_process_and_the_expired_lease(settings):
    settings.CHATFLOW_HEALTH_LONG_TURN_SECONDS = 60
    started = timezone.now() - timedelta(minutes=10)
    TurnRecord.objects.create(session_id="stuck", owner="box-7:4242:abc:", status="running", started_at=started)
    TurnRecord.objects.create(session_id="fresh", owner="box-7:4243:abc:", status="running")
    TurnRecord.objects.create(session_id="old-done", owner="box-7:4244:abc:", status="completed", started_at=started)
    SessionLease.objects.create(session_id="stuck", owner="box-7:4242:abc:", expires_at=time.time() - 5,
                                acquired_at=started.timestamp())
    SessionWaiter.objects.create(session_id="stuck", owner="box-8:1:w:", expires_at=time.time() + 30)
    html = personas.client_for(personas.viewer()).get(URL).content.decode()
    turns = html.split('id="health-turns"')[1].split("</section>")[0]
    assert 'data-session="stuck"' in turns and "<code>box-7:4242</code>" in turns and "no heartbeat" in turns
    assert 'data-session="fresh"' not in turns and "old-done" not in turns
    assert "Cancel turn" not in turns  # a viewer sees, does not act
    leases = html.split('id="health-leases"')[1].split("</section>")[0]
    assert 'class="expired-lease" data-session="stuck"' in leases and "box-8:1:w:" in leases
    assert "Release lease" not in leases
    operator_html = personas.client_for(personas.operator()).get(URL).content.decode()
    assert "Cancel turn" in operator_html and "Release lease" in operator_html


def test_worker_heartbeats_show_alive_and_stale_workers(settings):
    settings.CHATFLOW_HEARTBEAT_SECONDS = 5
    heartbeat.beat("worker:alive-host:11:aa", timezone.now(), 3)
    heartbeat.beat("worker:dead-host:12:bb", timezone.now(), 7)
    WorkerHeartbeat.objects.filter(pk="worker:dead-host:12:bb").update(last_beat=timezone.now() - timedelta(minutes=2))
    html = personas.client_for(personas.viewer()).get(URL).content.decode()
    assert 'class="worker alive" data-owner="worker:alive-host:11:aa"' in html
    assert 'class="worker stale" data-owner="worker:dead-host:12:bb"' in html
    assert html.count('badge error">stale') == 1


def test_a_running_worker_keeps_its_heartbeat_row_and_deletes_it_when_it_stops(settings):
    settings.CHATFLOW_HEARTBEAT_SECONDS = 1
    worker = Worker(slots=1, poll=0.05)

    reader = ThreadPoolExecutor(1)

    async def rows() -> list:
        return await asyncio.get_running_loop().run_in_executor(
            reader, lambda: list(WorkerHeartbeat.objects.values_list("owner", "host", "pid")))

    async def scenario() -> tuple[list, list]:
        running = asyncio.ensure_future(worker.run())
        seen: list = []
        for _ in range(200):
            if seen := await rows():
                break
            await asyncio.sleep(0.05)
        worker.stop()
        await running
        return seen, await rows()

    seen, after = asyncio.run(scenario())
    reader.submit(connections.close_all).result()
    reader.shutdown()
    assert seen == [(worker.owner, socket.gethostname(), os.getpid())]
    assert after == []


def test_bulk_retry_queues_the_selected_failed_deliveries_audited(client):
    first, second, third = (failed_delivery(client, n) for n in (1, 2, 3))
    operator = personas.client_for(personas.operator())
    page = operator.get(URL).content.decode()
    assert page.count('class="failed-delivery"') == 3 and "Retry selected" in page
    r = operator.post("/health/deliveries/retry/", {"delivery": [first.pk, third.pk]}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "2 deliveries queued again." in r.content.decode()
    assert dict(InboundDelivery.objects.values_list("pk", "status")) == {
        first.pk: "queued", second.pk: "failed", third.pk: "queued"}
    audited = OperatorAction.objects.filter(action="retry_delivery").order_by("session_id")
    assert [(a.session_id, a.actor_username) for a in audited] == [("s-1", "olga.operator"), ("s-3", "olga.operator")]


def test_bulk_retry_names_what_it_refused_and_a_bad_id_is_a_400(client):
    d = failed_delivery(client, 1)
    operator = personas.client_for(personas.operator())
    assert operator.post("/health/deliveries/retry/", {"delivery": [d.pk]}).status_code == 302
    again = operator.post("/health/deliveries/retry/", {"delivery": [d.pk]}, HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "Only a failed delivery can be retried." in again.content.decode()
    assert operator.post("/health/deliveries/retry/", {"delivery": ["1; drop"]}).status_code == 302
    bad = operator.post("/health/deliveries/retry/", {"delivery": ["x"]}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "Select at least one" in bad.content.decode()
    assert OperatorAction.objects.filter(action="retry_delivery").count() == 1


def test_viewers_and_outsiders_may_not_act_and_csrf_is_required(client):
    d = failed_delivery(client, 1)
    for who in (personas.viewer(), personas.outsider()):
        assert personas.client_for(who).post("/health/deliveries/retry/", {"delivery": [d.pk]}).status_code == 403
        assert personas.client_for(who).post("/health/replies/resend/", {"delivery": [d.pk]}).status_code == 403
        assert personas.client_for(who).post("/health/sessions/s-1/cancel/").status_code == 403
        assert personas.client_for(who).post("/health/sessions/s-1/release/").status_code == 403
    strict = personas.client_for(personas.operator(), csrf=True)
    assert strict.post("/health/deliveries/retry/", {"delivery": [d.pk]}).status_code == 403
    assert InboundDelivery.objects.get(pk=d.pk).status == "failed"
    assert not OperatorAction.objects.exists()
    anonymous = client.get(URL)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_bulk_resend_sends_unknown_replies_once_each_audited(client, apis):  # noqa: F811
    wa, _ = apis
    for n in (1, 2):
        post_wa(client, p.whatsapp(p.wa_text(f"wamid.R{n}", f"hello {n}", wa_id=f"1555000{n}")))
    dead = Worker(slots=1)
    for _ in range(2):
        d = taskqueue.claim_next(dead.owner, 30)
        assert taskqueue.finish(d, dead.owner, f"answer to {d.provider_message_id}", InboundDelivery.Reply.SENDING)
        ChatSession.objects.get_or_create(pk=d.session_id, defaults={"active_agent_name": "Echo"})
    InboundDelivery.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))  # its worker died
    ids = list(InboundDelivery.objects.values_list("pk", flat=True))
    operator = personas.client_for(personas.operator())
    page = operator.get(URL).content.decode()
    assert page.count('class="reply-attention"') == 2 and "Reply unknown" in page
    r = operator.post("/health/replies/resend/", {"delivery": ids}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "2 replies sent again." in r.content.decode()
    assert sorted(b["text"]["body"] for b in wa.bodies()) == ["answer to wamid.R1", "answer to wamid.R2"]
    assert set(InboundDelivery.objects.values_list("reply_status", flat=True)) == {"sent"}
    assert OperatorAction.objects.filter(action="resend_reply").count() == 2
    assert 'class="reply-attention"' not in r.content.decode()


def test_lists_are_paginated(client):
    for n in range(30):
        SessionLease.objects.create(session_id=f"gone-{n:02}", owner="h:1:x:", expires_at=time.time() - 100 + n)
    viewer = personas.client_for(personas.viewer())
    first = viewer.get(URL).content.decode()
    assert first.count('class="expired-lease"') == 25 and "page 1 of 2" in first and "?leases_page=2" in first
    second = viewer.get(URL, {"leases_page": "2"}).content.decode()
    assert second.count('class="expired-lease"') == 5 and 'data-session="gone-29"' in second


def test_release_lease_releases_only_an_expired_lease_never_a_live_turns(client):
    ChatSession.objects.create(session_id="live", active_agent_name="Support")
    ChatSession.objects.create(session_id="dead", active_agent_name="Support")
    SessionLease.objects.create(session_id="live", owner="h:1:live:", expires_at=time.time() + 60)
    SessionLease.objects.create(session_id="dead", owner="h:2:dead:", expires_at=time.time() - 5)
    operator = personas.client_for(personas.operator())

    refused = operator.post("/health/sessions/live/release/", HTTP_HX_REQUEST="true")
    released = operator.post("/health/sessions/dead/release/", HTTP_HX_REQUEST="true")

    assert refused.status_code == 409 and SessionLease.objects.filter(session_id="live").exists()
    assert released.status_code == 200 and not SessionLease.objects.filter(session_id="dead").exists()
    assert list(OperatorAction.objects.values_list("session_id", flat=True)) == ["dead"]


def operator_replies() -> dict[str, object]:
    """Olga owns web session s-a (a failed, an unknown, a sent and a just-begun reply); Otto owns s-b (a
    failed reply). Only the failed and unknown ones need a resend."""
    from takeover_app.models import OperatorReply
    from tests.takeover_app import page_states

    olga, otto = personas.operator(), personas.operator("otto.operator")
    page_states.human("s-a", olga, channel="web")
    page_states.human("s-b", otto, channel="web")
    made = {
        "failed": page_states.operator_reply("s-a", olga, "Your refund is on its way", "failed", "ProviderError: 503"),
        "unknown": page_states.operator_reply("s-a", olga, "Anything else?", "sending"),
        "sent": page_states.operator_reply("s-a", olga, "Hello", "sent"),
        "sending": page_states.operator_reply("s-a", olga, "One moment", "sending"),
        "otto": page_states.operator_reply("s-b", otto, "Otto here", "failed", "ProviderError: 500"),
    }
    OperatorReply.objects.update(provider="web")
    long_ago = timezone.now() - timedelta(seconds=OperatorReply.SEND_DEADLINE + 60)
    OperatorReply.objects.filter(pk=made["unknown"].pk).update(attempted_at=long_ago)
    OperatorReply.objects.filter(pk=made["sending"].pk).update(attempted_at=timezone.now(), created_at=timezone.now())
    return {"olga": olga, "otto": otto, **made}


def test_failed_and_unknown_operator_replies_of_every_session_are_listed():
    made = operator_replies()
    viewer = personas.client_for(personas.viewer())

    for page in (viewer.get(URL), personas.client_for(made["olga"]).get(URL, HTTP_HX_REQUEST="true")):
        html = page.content.decode()
        listed = [int(i) for i in re.findall(r'<tr class="operator-reply-attention" id="operator-reply-(\d+)"', html)]
        assert sorted(listed) == sorted(made[k].pk for k in ("failed", "unknown", "otto"))
        assert "Reply unknown" in html and "ProviderError: 503" in html and "otto.operator" in html
    assert 'name="reply"' not in viewer.get(URL).content.decode()  # Viewers only look


@pytest.mark.parametrize("htmx", [True, False])
def test_bulk_resend_of_operator_replies_goes_through_the_session_pages_audited_resend(htmx):
    from takeover_app.models import OperatorReply

    made = operator_replies()
    ids = [made[k].pk for k in ("failed", "unknown", "otto")] + [999_999]
    olga = personas.client_for(made["olga"])

    r = olga.post("/health/operator-replies/resend/", {"reply": ids}, **({"HTTP_HX_REQUEST": "true"} if htmx else {}))

    status = dict(OperatorReply.objects.values_list("pk", "status"))
    assert status[made["failed"].pk] == status[made["unknown"].pk] == "sent"
    assert status[made["otto"].pk] == "failed"  # not Olga's session: refused, named
    resends = OperatorAction.objects.filter(action="operator_reply")
    assert sorted(a.after["reply"] for a in resends if a.after.get("resend")) == sorted(
        [made["failed"].pk, made["unknown"].pk])
    note = r.content.decode() if htmx else olga.get(URL).content.decode()
    if not htmx:
        assert r.status_code == 302
    assert "2 operator replies sent again." in note
    assert f"Reply {made['otto'].pk} on s-b:" in note and "otto.operator" in note
    assert "Reply 999999: no such reply." in note


def test_bulk_resend_of_operator_replies_needs_the_reply_permission_csrf_and_ids():
    from takeover_app.models import OperatorReply

    made = operator_replies()
    url = "/health/operator-replies/resend/"
    for who in (personas.viewer(), personas.outsider()):
        assert personas.client_for(who).post(url, {"reply": [made["failed"].pk]}).status_code == 403
    strict = personas.client_for(made["olga"], csrf=True)
    assert strict.post(url, {"reply": [made["failed"].pk]}).status_code == 403
    olga = personas.client_for(made["olga"])
    for bad in ({}, {"reply": ["x"]}, {"reply": [str(2**63)]}):
        r = olga.post(url, bad, HTTP_HX_REQUEST="true")
        assert r.status_code == 400 and "Select at least one operator reply" in r.content.decode()
    assert olga.post(url, {"reply": [made["otto"].pk]}, HTTP_HX_REQUEST="true").status_code == 409
    assert OperatorReply.objects.get(pk=made["failed"].pk).status == "failed"
    assert not OperatorAction.objects.filter(action="operator_reply").exists()


def test_each_refusal_is_logged_in_exactly_one_line_under_the_sites_logging(client, caplog):
    # No caplog.set_level: what is captured is what the site's LOGGING lets through.
    d = failed_delivery(client, 1)
    operator = personas.client_for(personas.operator())
    assert operator.post("/health/deliveries/retry/", {"delivery": [d.pk]}).status_code == 302
    caplog.clear()

    # A redirect (no htmx) that refused the row: django.request logs nothing, the health page does.
    assert operator.post("/health/deliveries/retry/", {"delivery": [d.pk]}).status_code == 302
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and "retried" in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == "health_app.views" and "\n" not in lines[0].getMessage()
    caplog.clear()

    # A 409 (htmx): django.request's one line, not a second one from the page.
    assert operator.post("/health/deliveries/retry/", {"delivery": [d.pk]}, HTTP_HX_REQUEST="true").status_code == 409
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith(("health_app", "django"))]
    assert [r.name for r in lines] == ["django.request"] and lines[0].exc_info is None


def test_a_bulk_resend_past_its_time_budget_names_the_replies_it_did_not_try(client, apis, monkeypatch):  # noqa: F811
    from health_app import views

    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.T1", "hello", wa_id="15550001")))
    dead = Worker(slots=1)
    d = taskqueue.claim_next(dead.owner, 30)
    assert taskqueue.finish(d, dead.owner, "the answer", InboundDelivery.Reply.SENDING)
    InboundDelivery.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))  # its worker died
    monkeypatch.setattr(views, "BULK_SEND_SECONDS", 0)
    operator = personas.client_for(personas.operator())

    r = operator.post("/health/replies/resend/", {"delivery": [d.pk]}, HTTP_HX_REQUEST="true")

    assert r.status_code == 409 and "wamid.T1: not tried (the batch ran out of time)" in r.content.decode()
    assert wa.bodies() == [] and not OperatorAction.objects.filter(action="resend_reply").exists()
    monkeypatch.setattr(views, "BULK_SEND_SECONDS", 20.0)
    assert "1 reply sent again." in operator.post("/health/replies/resend/", {"delivery": [d.pk]},
                                                  HTTP_HX_REQUEST="true").content.decode()
    assert [b["text"]["body"] for b in wa.bodies()] == ["the answer"]


def test_cancel_turn_stops_the_turn_the_page_showed_not_one_that_began_since(settings):
    from chatflow_agent.core.reports import TurnReport
    from sessions_app.runtime import site_store

    settings.CHATFLOW_HEALTH_LONG_TURN_SECONDS = 1
    ChatSession.objects.create(session_id="slow-3", active_agent_name="Support")
    backend = site_store().backend

    def turn_of_another_process(owner: str) -> TurnReport:
        report = TurnReport(source="api", user_text="please wait", owner=owner)
        report.started_at = time.time() - 5  # running long enough to be listed
        assert backend.acquire_lease("slow-3", owner, 30.0, False, report)
        return report

    shown = turn_of_another_process("otherhost:1:first:1")
    operator = personas.client_for(personas.operator())
    page = operator.get(URL).content.decode()
    assert f'<input type="hidden" name="owner" value="{shown.owner}">' in page
    shown.ended_by(None)
    backend.release_lease("slow-3", shown.owner, shown)  # the turn on the page ends; the next one begins
    following = turn_of_another_process("otherhost:1:second:1")

    r = operator.post("/health/sessions/slow-3/cancel/", {"owner": shown.owner}, HTTP_HX_REQUEST="true")
    assert r.status_code == 409 and "is not running any more" in r.content.decode()
    assert SessionLease.objects.get(pk="slow-3").owner == following.owner  # the new turn runs on
    assert not OperatorAction.objects.filter(action="cancel_turn").exists()
    r = operator.post("/health/sessions/slow-3/cancel/", {"owner": following.owner}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and not SessionLease.objects.filter(pk="slow-3").exists()


def test_a_first_turn_is_marked_and_once_cancelled_its_link_says_the_session_never_got_it(settings):
    from chatflow_agent.core.reports import TurnReport
    from sessions_app.runtime import site_store

    settings.CHATFLOW_HEALTH_LONG_TURN_SECONDS = 1
    report = TurnReport(source="api", user_text="hello", owner="otherhost:1:first:1")
    report.started_at = time.time() - 5
    assert site_store().backend.acquire_lease("new-1", report.owner, 30.0, False, report)
    operator = personas.client_for(personas.operator())
    turns = operator.get(URL).content.decode().split('id="health-turns"')[1].split("</section>")[0]
    assert 'data-session="new-1"' in turns and ">first turn</span>" in turns
    running = operator.get("/sessions/new-1/")
    assert running.status_code == 404 and "Its first turn is running" in running.content.decode()

    r = operator.post("/health/sessions/new-1/cancel/", {"owner": report.owner, "reason": "stuck"},
                      HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and not ChatSession.objects.filter(pk="new-1").exists()

    for response in (operator.get("/sessions/new-1/"), operator.get("/sessions/new-1/", HTTP_HX_REQUEST="true")):
        said = response.content.decode()
        assert response.status_code == 404 and "It never got its first turn: that turn ended cancelled" in said
        assert "deleted" not in said
