"""A process killed with SIGKILL during a turn: once its lease expired its turn record says ``interrupted``
(marked by the next turn on the session, or by ``chatflow_sweep``), and the session is usable."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from chatflow_agent import Agent, Runner
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from sessions_app import runtime
from sessions_app.models import ChatMessage
from tests.processes import REPO, site_env
from tests.webhooks_app.servers import database_url
from turns_app.models import SessionTotals, TurnRecord
from turns_app.records import INTERRUPTED_ERROR

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Echo(BaseEngine):
    async def generate_turn_async(self, agent, history):
        return EngineTurnResult(text="back again")


def killed_mid_turn(tmp_path: Path, session_id: str) -> TurnRecord:
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-m", "tests.turns_app._hang", database_url(), session_id, str(ready)],
                             cwd=REPO, env=site_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "the child never started its turn"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
        child.stdout.close()
        child.stderr.close()
    [record] = TurnRecord.objects.filter(session_id=session_id)
    assert record.status == "running" and record.source == "webhook"
    return record


def wait_past_the_lease() -> None:
    time.sleep(1.3)  # the child's lease TTL is 1 s


def test_the_next_turn_marks_the_killed_turn_interrupted_and_the_session_works(tmp_path, settings):
    settings.CHATFLOW_LEASE_SECONDS = 1
    dead = killed_mid_turn(tmp_path, "s1")
    wait_past_the_lease()

    runner = Runner(Agent(name="Bot", instructions="x", engine=Echo()), session_store=runtime.site_store())
    response = asyncio.run(runner.run_async("s1", "hello?"))

    assert response.content == "back again"
    dead.refresh_from_db()
    assert dead.status == "interrupted" and dead.error == INTERRUPTED_ERROR
    assert dead.user_text == "are you still there?" and dead.finished_at is not None
    assert list(ChatMessage.objects.filter(session_id="s1").values_list("content", flat=True)) == [
        "hello?", "back again"]
    assert TurnRecord.objects.filter(session_id="s1", status="completed").count() == 1


def test_the_sweep_marks_the_killed_turn_interrupted_without_a_next_turn(tmp_path):
    dead = killed_mid_turn(tmp_path, "s2")
    out = io.StringIO()
    call_command("chatflow_sweep", stdout=out)  # the lease is still live: nothing to mark yet
    dead.refresh_from_db()
    assert dead.status == "running" and out.getvalue().startswith("0 turn record")

    wait_past_the_lease()
    call_command("chatflow_sweep", stdout=out)

    dead.refresh_from_db()
    assert dead.status == "interrupted" and "1 turn record(s) marked interrupted" in out.getvalue()
    assert SessionTotals.objects.get(pk="s2").last_error == INTERRUPTED_ERROR
