"""`chatflow_demo` (demo sessions from real turns) and `chatflow_chat` (chatting in the terminal)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sqlite3

import pytest
from django.core.management import CommandError, call_command

from agents_app.demo_sessions import SCRIPTS
from sessions_app import runtime
from sessions_app.models import ChatMessage, ChatSession
from tests.processes import run_manage, site_env

# The Runner plays turns on the store's threads: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_runtime():
    runtime.reset()
    yield
    runtime.reset()


def run(*args: str, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def tool_names(session_id: str | None = None) -> list[str]:
    rows = ChatMessage.objects.filter(role="model").order_by("id")
    if session_id is not None:
        rows = rows.filter(session_id=session_id)
    return [call["name"] for js in rows.values_list("message_json", flat=True)
            for call in json.loads(js).get("tool_calls") or []]


def test_chatflow_demo_creates_n_sessions_from_real_turns():
    out = run("chatflow_demo", sessions=len(SCRIPTS), seed=7)

    assert f"created {len(SCRIPTS)} sessions" in out
    sessions = list(ChatSession.objects.all())
    assert len(sessions) == len(SCRIPTS)
    for session in sessions:
        roles = list(ChatMessage.objects.filter(session=session).order_by("id").values_list("role", flat=True))
        assert roles[0] == "user" and roles[-1] == "model"
        assert session.metadata["channel"] in {"whatsapp", "telegram", "web"}
        pattern = {"whatsapp": r"1555\d{7}", "telegram": r"tg:\d{9,10}", "web": r"web-[0-9a-f]{12}"}
        assert re.fullmatch(pattern[session.metadata["channel"]], session.session_id)
        assert session.created_at <= session.updated_at
    assert {s.metadata["channel"] for s in sessions} == {"whatsapp", "telegram", "web"}
    tools = set(tool_names())
    assert {"check_order_status", "refund_order", "get_invoice", "diagnose_device"} <= tools
    assert {"transfer_to_billing", "transfer_to_tech", "transfer_to_support"} <= tools
    assert {s.active_agent_name for s in sessions} == {"Support", "Billing", "Tech"}
    multi_turn = [s for s in sessions if ChatMessage.objects.filter(session=s, role="user").count() > 1]
    assert len(multi_turn) >= len(SCRIPTS) - 1


def test_chatflow_demo_spreads_times_that_the_console_and_the_export_agree_on():
    from datetime import datetime

    from console_app import export
    from sessions_app.timeline import build_page

    run("chatflow_demo", sessions=3, seed=3, spread_hours=48)

    for session in ChatSession.objects.all():
        console = sorted(t.started_at for t in build_page(session.session_id, per_page=50).turns)
        doc = export.transcript(session)
        exported = [datetime.fromisoformat(t["started_at"]) for t in doc["turns"]]
        assert console == exported and len(console) > 1, session.session_id
        rows = list(ChatMessage.objects.filter(session=session).order_by("id").values_list("created_at", flat=True))
        stamps = [datetime.fromisoformat(m["timestamp"]) for t in doc["turns"] for m in t["messages"]]
        assert stamps == rows and session.created_at <= rows[0], session.session_id


def test_chatflow_demo_records_start_when_their_spread_user_message_says():
    from turns_app.models import TurnRecord

    run("chatflow_demo", sessions=3, seed=4, spread_hours=48)

    records = list(TurnRecord.objects.all())
    users = dict(ChatMessage.objects.filter(role="user").values_list("id", "created_at"))
    assert len(records) == len(users) and all(r.status == "completed" for r in records)
    assert all(r.started_at == users[r.first_message_id] for r in records)
    assert all(r.started_at <= r.finished_at for r in records)


def test_chatflow_demo_if_empty_seeds_once():
    run("chatflow_demo", sessions=3, if_empty=True)
    ids = set(ChatSession.objects.values_list("pk", flat=True))

    out = run("chatflow_demo", sessions=3, if_empty=True)

    assert "already has sessions; nothing to do" in out
    assert set(ChatSession.objects.values_list("pk", flat=True)) == ids
    assert len(ids) == 3


def test_chatflow_demo_without_if_empty_adds_sessions_with_new_ids():
    run("chatflow_demo", sessions=4, seed=1)
    run("chatflow_demo", sessions=4, seed=1)  # the same seed would pick the same ids: they are skipped

    assert ChatSession.objects.count() == 8


def test_chatflow_demo_rejects_a_negative_count():
    with pytest.raises(CommandError, match="--sessions must be between 0 and"):
        run("chatflow_demo", sessions=-1)


def test_chatflow_demo_needs_the_demo_engine_but_never_blocks_serve(settings):
    settings.CHATFLOW_ENGINE = "openai"
    settings.OPENAI_API_KEY = "sk-test-not-real"
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"

    with pytest.raises(CommandError, match="CHATFLOW_ENGINE=demo"):
        run("chatflow_demo", sessions=2)
    assert "Demo data: skipped" in run("chatflow_demo", if_empty=True)
    assert not ChatSession.objects.exists()


def test_chatflow_chat_answers_each_line_and_shows_tools_and_handoffs():
    stdin = io.StringIO("Where is order A-1001?\nI need a refund\nrefund order A-1001 amount 5\n/quit\nnever read\n")

    out = run("chatflow_chat", session="web-chat-1", stdin=stdin)

    assert "Session 'web-chat-1' with Support (new)" in out
    assert '[tool] check_order_status({"order_id": "A-1001"})' in out
    assert re.search(r"^Support: Order A-1001 is .+\.$", out, re.M)
    assert "[handoff] Support → Billing" in out
    assert "[result] refund_order → " in out
    assert re.search(r"^Billing: Order A-1001, refunded yes, amount 5\.0", out, re.M)
    session = ChatSession.objects.get(pk="web-chat-1")
    assert session.active_agent_name == "Billing"
    assert session.metadata == {"channel": "terminal"}
    assert ChatMessage.objects.filter(session=session, role="user").count() == 3
    assert "never read" not in "".join(ChatMessage.objects.values_list("content", flat=True).exclude(content=None))


def test_chatflow_chat_continues_a_session_with_the_agent_asked_for():
    run("chatflow_chat", session="tg:42", stdin=io.StringIO("hello\n"))

    out = run("chatflow_chat", session="tg:42", agent="Tech", stdin=io.StringIO("hello again\n"))

    assert "Session 'tg:42' with Tech (continuing)" in out
    assert re.search(r"^Tech: Tech here\. I can diagnose device", out, re.M)
    assert ChatSession.objects.get(pk="tg:42").active_agent_name == "Tech"
    assert ChatMessage.objects.filter(session_id="tg:42", role="user").count() == 2


def test_chatflow_chat_rejects_an_unknown_agent():
    with pytest.raises(CommandError, match="unknown agent 'Nobody'; registered agents: Support, Billing, Tech"):
        run("chatflow_chat", agent="Nobody", stdin=io.StringIO("hi\n"))
    assert not ChatSession.objects.exists()


@pytest.mark.parametrize(("session_id", "problem"), [
    (" padded", "must not start or end with white space"),
    ("padded ", "must not start or end with white space"),
    ("tab\tid", "holds a control, bidi control"),
    ("spoof\u202efdp", "holds a control, bidi control"),
    ("", "must be a non-empty string"),
    ("x" * 256, "is longer than 255 characters"),
])
def test_chatflow_chat_refuses_a_session_id_every_other_entry_point_refuses(session_id, problem):
    with pytest.raises(CommandError, match=f"--session {re.escape(repr(session_id))} {problem}"):
        run("chatflow_chat", session=session_id, stdin=io.StringIO("hi\n"))
    assert not ChatSession.objects.exists()


def test_chatflow_chat_reports_a_failed_turn_and_exits_with_an_error(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("engine down")

    monkeypatch.setattr(runtime.site_runner().engine, "stream_turn_async", broken)
    err = io.StringIO()

    with pytest.raises(CommandError, match="1 turn failed"):
        call_command("chatflow_chat", session="web-x", stdin=io.StringIO("hi\n"), stdout=io.StringIO(), stderr=err)
    assert "the turn failed and was rolled back (RuntimeError: engine down)" in err.getvalue()
    assert not ChatMessage.objects.filter(session_id="web-x").exists()


@pytest.mark.slow
def test_chatflow_chat_reads_piped_stdin_in_a_real_process(tmp_path):
    db = tmp_path / "chat.db"
    env = site_env(DATABASE_URL=f"sqlite:///{db}")
    assert run_manage("migrate", "--noinput", "-v", "0", env=env).returncode == 0

    result = run_manage_with_stdin(env, "Where is order B-2002?\n", "chatflow_chat", "--session", "+15550199")

    assert result.returncode == 0, result.stderr
    assert "[tool] check_order_status" in result.stdout
    assert "Support: Order B-2002 is" in result.stdout
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT role FROM chatflow_messages WHERE session_id = '+15550199' ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "model", "tool", "model"]


def run_manage_with_stdin(env, stdin: str, *args: str):
    import subprocess
    import sys

    from tests.processes import REPO

    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_chatflow_chat_sends_a_turns_last_live_updates_before_it_goes_on(settings):
    """Each line's turn runs on its own event loop: the live updates still queued when the turn ends are
    sent before that loop closes, so the console sees the turn commit even when the command exits at once."""
    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers, get_channel_layer

    from sessions_app.live import group_for_session, join, leave

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.agents_app.slow_layer.SlowInMemoryChannelLayer"}}
    channel_layers.backends.clear()
    try:
        layer = get_channel_layer()
        channel = async_to_sync(layer.new_channel)()
        async_to_sync(join)(layer, group_for_session("web-live-1"), channel)

        run("chatflow_chat", session="web-live-1", stdin=io.StringIO("Where is order A-1001?\n"))

        async def take_all() -> list[str]:
            kinds: list[str] = []
            while True:
                try:
                    message = await asyncio.wait_for(layer.receive(channel), 0.5)
                except TimeoutError:
                    return kinds
                kinds.append(message["event"]["kind"])

        kinds = async_to_sync(take_all)()
        async_to_sync(leave)(layer, group_for_session("web-live-1"), channel)
    finally:
        channel_layers.backends.clear()
    assert kinds[0] == "turn_started" and kinds[-1] == "turn_completed", kinds
