"""A standalone queue worker outlives its database connections: the PostgreSQL server drops them (what a
restart does to a client: ``pg_terminate_backend``), and the worker reconnects and plays the next delivery."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from health_app.models import WorkerHeartbeat
from sessions_app.store import IDLE_CHECK_SECONDS
from tests.processes import stop
from tests.webhooks_app import payloads as p
from tests.webhooks_app import servers as s
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.test_endpoints import post_wa
from tests.webhooks_app.test_processes import messages
from webhooks_app.models import InboundDelivery
from webhooks_app.worker import FALLBACK_REPLY

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def drop_other_connections() -> int:
    """Terminate every other server process on the test database (the worker's connections), as a restart
    does; the shared server itself keeps running."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.fixture
def worker(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the server drops connections on PostgreSQL (pg_terminate_backend)")
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        env = s.child_env(wa.base, tg.base, tmp_path, CHATFLOW_HEARTBEAT_SECONDS="1")
        proc = s.start_worker(env, tmp_path / "worker.log", "--slots", "2")
        try:
            yield proc, wa, tmp_path / "worker.log"
        finally:
            stop(proc)
            proc.stdout.close()


def test_a_worker_whose_connections_the_server_dropped_reconnects_and_plays_the_next_delivery(client, worker):
    proc, wa, log = worker
    post_wa(client, p.whatsapp(p.wa_text("wamid.BEFORE", "before the restart")))
    wa.wait_for(1, timeout=30)
    s.wait_until(lambda: WorkerHeartbeat.objects.exists(), 10, "the worker's first heartbeat")
    # The first reply's status is written after the provider answered: the restart comes after that write.
    s.wait_until(lambda: InboundDelivery.objects.filter(status="done", reply_status="sent").exists(), 10,
                 "the first delivery done")

    assert drop_other_connections() > 0
    post_wa(client, p.whatsapp(p.wa_text("wamid.AFTER", "after the restart")))
    wa.wait_for(2, timeout=30)

    assert proc.poll() is None  # still running
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: before the restart", "echo: after the restart"]
    assert FALLBACK_REPLY not in str(wa.bodies())
    assert messages("15550100")[-2:] == [("user", "after the restart"), ("model", "echo: after the restart")]
    s.wait_until(lambda: set(InboundDelivery.objects.values_list("status", "reply_status")) == {("done", "sent")},
                 10, "both deliveries done")
    beat = WorkerHeartbeat.objects.get().last_beat
    s.wait_until(lambda: WorkerHeartbeat.objects.get().last_beat > beat, 10, "a heartbeat after the reconnect")
    text = log.read_text(encoding="utf-8")
    assert text.count("the database is unreachable") == 1, text
    assert text.count("the database answers again") == 1, text
    assert "Traceback" not in text, text


def test_a_turn_whose_connections_the_server_dropped_during_its_model_call_commits_once(client, worker, tmp_path):
    proc, wa, log = worker
    block = tmp_path / "block"
    block.touch()
    post_wa(client, p.whatsapp(p.wa_text("wamid.MID", "[block] during the restart")))
    s.wait_until(lambda: "[block] during the restart" in "".join(s.engine_calls(tmp_path)), 30, "the model call")

    assert drop_other_connections() > 0
    # Not a timing assertion: the turn's store thread took the lease before the model call began, so after
    # this its commit follows an idle gap, whatever the machine's speed.
    time.sleep(IDLE_CHECK_SECONDS)
    block.unlink()
    wa.wait_for(1, timeout=30)

    assert proc.poll() is None
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: [block] during the restart"]
    text = "[block] during the restart"
    assert messages("15550100") == [("user", text), ("model", f"echo: {text}")]
    assert len(s.engine_calls(tmp_path)) == 1  # played once: its commit ran on a connection opened again
    s.wait_until(lambda: set(InboundDelivery.objects.values_list("status", "reply_status")) == {("done", "sent")},
                 10, "the delivery done")
    assert "Traceback" not in log.read_text(encoding="utf-8")
