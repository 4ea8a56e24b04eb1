"""Exactly-once across real processes: two daphne servers (embedded workers) and standalone workers on one
database, fake WhatsApp Graph / Telegram Bot API servers on loopback, SIGKILL between claim and commit."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from sessions_app.models import ChatMessage
from tests.processes import stop
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers as s
from tests.webhooks_app.fakes import FakeProviderAPI
from webhooks_app.models import InboundDelivery

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def apis():
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        yield wa, tg


@pytest.fixture
def procs():
    started: list = []
    yield started
    for proc in started:
        stop(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def messages(session_id: str) -> list[tuple[str, str]]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id").values_list("role", "content"))


def test_the_same_payload_to_two_servers_10ms_apart_plays_one_turn_and_sends_one_reply(apis, procs, tmp_path):
    wa, tg = apis
    env = s.child_env(wa.base, tg.base, tmp_path)
    a, base_a = s.start_daphne(env, tmp_path / "a.log")
    procs.append(a)
    b, base_b = s.start_daphne(env, tmp_path / "b.log")
    procs.append(b)
    body = p.whatsapp(p.wa_text("wamid.TWICE", "hello twice"))
    results: dict[str, tuple] = {}

    def send(name: str, base: str, delay: float) -> None:
        time.sleep(delay)
        results[name] = s.post(f"{base}/webhooks/whatsapp/", body, s.wa_headers(body))

    threads = [threading.Thread(target=send, args=("a", base_a, 0.0)),
               threading.Thread(target=send, args=("b", base_b, 0.010))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"][0] == 200 and results["b"][0] == 200
    wa.wait_for(1)
    time.sleep(1.5)  # room for a second turn or reply, which must not come
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: hello twice"]
    assert messages("15550100") == [("user", "hello twice"), ("model", "echo: hello twice")]
    assert len(s.engine_calls(tmp_path)) == 1
    d = InboundDelivery.objects.get()
    assert (d.status, d.duplicates_suppressed, d.reply_status) == ("done", 1, "sent")


def test_two_messages_200ms_apart_are_both_played_in_order_in_one_session(apis, procs, tmp_path):
    wa, tg = apis
    env = s.child_env(wa.base, tg.base, tmp_path)
    a, base_a = s.start_daphne(env, tmp_path / "a.log")
    procs.append(a)
    b, base_b = s.start_daphne(env, tmp_path / "b.log")
    procs.append(b)
    first = p.whatsapp(p.wa_text("wamid.O1", "first [slow 0.5]"))
    second = p.whatsapp(p.wa_text("wamid.O2", "second"))
    assert s.post(f"{base_a}/webhooks/whatsapp/", first, s.wa_headers(first))[0] == 200
    time.sleep(0.2)
    assert s.post(f"{base_b}/webhooks/whatsapp/", second, s.wa_headers(second))[0] == 200
    wa.wait_for(2)
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: first [slow 0.5]", "echo: second"]
    assert messages("15550100") == [("user", "first [slow 0.5]"), ("model", "echo: first [slow 0.5]"),
                                    ("user", "second"), ("model", "echo: second")]


def test_a_worker_killed_after_claiming_is_replaced_and_the_delivery_played_exactly_once(apis, procs, tmp_path, client):
    wa, tg = apis
    env = s.child_env(wa.base, tg.base, tmp_path, CHATFLOW_QUEUE_VISIBILITY_SECONDS="2")
    (tmp_path / "block").touch()
    body = p.whatsapp(p.wa_text("wamid.KILL", "survive [block]"))
    r = client.post("/webhooks/whatsapp/", body, content_type="application/json", **{
        "HTTP_X_HUB_SIGNATURE_256": p.sign(body, p.WA_SECRET)})
    assert r.status_code == 200
    doomed = s.start_worker(env, tmp_path / "w1.log", "--slots", "1")
    procs.append(doomed)
    s.wait_until(lambda: len(s.engine_calls(tmp_path)) == 1, 20, "the turn to start")
    assert InboundDelivery.objects.get().status == "running"
    os.killpg(doomed.pid, signal.SIGKILL)  # claimed, turn in progress, nothing committed
    doomed.wait(10)
    (tmp_path / "block").unlink()
    assert messages("15550100") == [] and wa.bodies() == []
    procs.append(s.start_worker(env, tmp_path / "w2.log", "--slots", "1"))
    wa.wait_for(1, timeout=60)  # the dead turn's session lease (30 s) must expire first
    time.sleep(1.0)
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: survive [block]"]
    assert messages("15550100") == [("user", "survive [block]"), ("model", "echo: survive [block]")]
    d = InboundDelivery.objects.get()
    assert (d.status, d.attempts, d.reply_status) == ("done", 2, "sent")
    assert len(s.engine_calls(tmp_path)) == 2  # the killed play and the one that committed


def test_telegram_acks_at_once_during_a_5s_turn_and_a_redelivery_3s_later_plays_nothing(apis, procs, tmp_path):
    wa, tg = apis
    env = s.child_env(wa.base, tg.base, tmp_path)
    server, base = s.start_daphne(env, tmp_path / "d.log")
    procs.append(server)
    body = p.telegram(7001, "think hard [slow 5]")
    status, _, _ = s.post(f"{base}/webhooks/telegram/", body, s.tg_headers())
    # Acknowledged before the turn ended (no timing asserted: the answer came while nothing was played).
    assert status == 200 and InboundDelivery.objects.get().status in ("queued", "running") and not tg.bodies()
    s.wait_until(lambda: len(s.engine_calls(tmp_path)) == 1, 10, "the turn to start")
    time.sleep(3)
    status, answer, _ = s.post(f"{base}/webhooks/telegram/", body, s.tg_headers())
    assert status == 200 and b'"duplicates": 1' in answer
    assert InboundDelivery.objects.get().status == "running" and not tg.bodies()  # the 5 s turn still runs
    tg.wait_for(1, timeout=15)
    time.sleep(1.0)
    assert [b["text"] for b in tg.bodies()] == ["echo: think hard [slow 5]"]
    assert len(s.engine_calls(tmp_path)) == 1
    d = InboundDelivery.objects.get()
    assert (d.status, d.duplicates_suppressed) == ("done", 1)


def test_several_worker_processes_share_the_queue_each_delivery_once_and_each_sender_in_order(
        apis, procs, tmp_path, client):
    wa, tg = apis
    env = s.child_env(wa.base, tg.base, tmp_path)
    for i in range(3):
        procs.append(s.start_worker(env, tmp_path / f"w{i}.log", "--slots", "4"))
    for n in range(30):  # 6 senders × 5 messages, interleaved
        sender = f"1555000{n % 6}"
        body = p.whatsapp(p.wa_text(f"wamid.M{n}", f"msg {n // 6} [slow 0.05]", wa_id=sender), wa_id=sender)
        r = client.post("/webhooks/whatsapp/", body, content_type="application/json",
                        HTTP_X_HUB_SIGNATURE_256=p.sign(body, p.WA_SECRET))
        assert r.status_code == 200
    wa.wait_for(30, timeout=120)
    time.sleep(0.5)
    assert len(wa.bodies()) == 30 and len(s.engine_calls(tmp_path)) == 30
    workers = {line.split("\t")[0] for line in s.engine_calls(tmp_path)}
    assert len(workers) >= 2  # the queue was shared
    for k in range(6):
        sender = f"1555000{k}"
        users = [c for r, c in messages(sender) if r == "user"]
        assert users == [f"msg {i} [slow 0.05]" for i in range(5)]
        sent = [b["text"]["body"] for b in wa.bodies() if b["to"] == sender]
        assert sent == [f"echo: msg {i} [slow 0.05]" for i in range(5)]
    assert set(InboundDelivery.objects.values_list("status", "attempts")) == {("done", 1)}
