"""Real worker processes: one killed with SIGKILL during a turn shows on the health page as a stuck turn with
an expired lease and a stale heartbeat; Cancel from the health page rolls a running turn back (audited)."""

from __future__ import annotations

import html
import os
import signal

import pytest

from health_app.models import WorkerHeartbeat
from sessions_app.models import ChatMessage, OperatorAction, SessionLease
from tests.processes import stop
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers as s
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.test_endpoints import post_wa
from turns_app.models import TurnRecord
from webhooks_app.models import InboundDelivery

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(tmp_path, settings):
    settings.CHATFLOW_HEALTH_LONG_TURN_SECONDS = 1
    settings.CHATFLOW_HEARTBEAT_SECONDS = 1
    started: list = []
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        env = s.child_env(wa.base, tg.base, tmp_path, CHATFLOW_LEASE_SECONDS="2", CHATFLOW_HEARTBEAT_SECONDS="1")
        yield env, started, wa
    for proc in started:
        stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def history(session_id: str) -> list[tuple[str, str]]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id").values_list("role", "content"))


def block_a_turn(client, env, started, tmp_path, text: str) -> tuple:
    (tmp_path / "block").touch()
    calls = len(s.engine_calls(tmp_path))
    post_wa(client, p.whatsapp(p.wa_text(f"wamid.{len(started)}", text)))
    worker = s.start_worker(env, tmp_path / f"w{len(started)}.log", "--slots", "1")
    started.append(worker)
    s.wait_until(lambda: len(s.engine_calls(tmp_path)) == calls + 1, 20, "the turn to start")
    s.wait_until(lambda: WorkerHeartbeat.objects.filter(pid=worker.pid).exists(), 20, "the worker's heartbeat")
    return worker, TurnRecord.objects.get(status="running")


def test_a_killed_worker_shows_as_a_stuck_turn_an_expired_lease_and_a_stale_worker(client, world, tmp_path):
    env, started, _ = world
    worker, record = block_a_turn(client, env, started, tmp_path, "stuck [block]")
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(10)
    s.wait_until(lambda: SessionLease.objects.filter(session_id="15550100").first().expired, 20, "the lease to expire")
    s.wait_until(lambda: WorkerHeartbeat.objects.get(pid=worker.pid).stale, 20, "the heartbeat to go stale")
    page = personas.client_for(personas.operator()).get("/health/").content.decode()
    turns = page.split('id="health-turns"')[1].split("</section>")[0]
    host = WorkerHeartbeat.objects.get(pid=worker.pid).host
    assert 'data-session="15550100"' in turns and f"<code>{host}:{worker.pid}</code>" in turns
    assert "no heartbeat" in turns and 'badge error">expired' in turns
    leases = page.split('id="health-leases"')[1].split("</section>")[0]
    assert 'class="expired-lease" data-session="15550100"' in leases
    workers = page.split('id="health-workers"')[1].split("</section>")[0]
    assert f'class="worker stale" data-owner="worker:{host}:{worker.pid}:' in workers
    assert record.owner.startswith(f"{host}:{worker.pid}:") and history("15550100") == []


def test_cancel_from_the_health_page_rolls_the_running_turn_back_audited(client, world, tmp_path):
    pytest.importorskip("takeover_app.service", reason="cancel_turn lives in takeover_app")
    env, started, wa = world
    post_wa(client, p.whatsapp(p.wa_text("wamid.before", "first")))
    first = s.start_worker(env, tmp_path / "first.log", "--slots", "1", "--drain")
    started.append(first)
    first.wait(60)
    before = history("15550100")
    assert before == [("user", "first"), ("model", "echo: first")]
    _, record = block_a_turn(client, env, started, tmp_path, "second [block]")
    operator = personas.client_for(personas.operator())
    s.wait_until(lambda: 'action="/health/sessions/15550100/cancel/"' in operator.get("/health/").content.decode(),
                 20, "the turn to be listed as running longer than the threshold")
    r = operator.post("/health/sessions/15550100/cancel/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "was cancelled" in r.content.decode()
    # The engine is still blocked: the turn is stopped at its next lease renewal, not by finishing.
    s.wait_until(lambda: not TurnRecord.objects.get(pk=record.pk).awaiting_report, 30,
                 "the turn's own close (the record itself was closed cancelled by the Cancel)")
    ended = TurnRecord.objects.get(pk=record.pk)
    assert (ended.status, ended.error) == ("cancelled", "Cancelled by olga.operator: Cancelled from the health page")
    assert ended.error in html.unescape(operator.get("/sessions/15550100/").content.decode())  # the turn's card
    assert history("15550100") == before
    entry = OperatorAction.objects.get(session_id="15550100")
    assert entry.actor_username == "olga.operator"
    # Not played again: the delivery ends failed with who cancelled it, nothing is sent, Retry is offered.
    delivery = InboundDelivery.objects.get(provider_message_id="wamid.1")
    s.wait_until(lambda: InboundDelivery.objects.get(pk=delivery.pk).status == "failed", 30, "the delivery to end")
    ended = InboundDelivery.objects.get(pk=delivery.pk)
    assert ended.error == "Cancelled by olga.operator: Cancelled from the health page" and ended.reply_status == "none"
    assert len(s.engine_calls(tmp_path)) == 2 and [b["text"]["body"] for b in wa.bodies()] == ["echo: first"]
