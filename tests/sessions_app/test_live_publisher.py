"""The live path's publishing side: group names, event encoding, in-memory layer warnings."""

from __future__ import annotations

import subprocess
import sys

import pytest
from channels.layers import BaseChannelLayer, channel_layers, get_channel_layer

from chatflow_agent.core.events import MessageAppended, TurnCompleted
from chatflow_agent.types import AgentResponse, Message, Role, ToolCall
from sessions_app import live
from sessions_app.live import (
    LIST_GROUP,
    encode_event,
    group_for_session,
    has_receivers,
    join,
    leave,
    publisher,
    warn_if_isolated,
)
from tests.processes import REPO, site_env
from webhooks_app.relay import RelayChannelLayer


def test_group_names_are_valid_for_any_session_id():
    layer = BaseChannelLayer()
    ids = ["+15550100", "tg:998877", "a/b", "olá 👋", "x" * 5000, "\ud800", "", "<script>"]
    names = {group_for_session(i) for i in ids}
    assert len(names) == len(ids)
    for name in [*names, LIST_GROUP]:
        assert layer.require_valid_group_name(name)


def test_events_encode_to_json_safe_dicts():
    message = Message(role=Role.MODEL, content="hi", tool_calls=[ToolCall(id="c1", name="t", args={"x": 1})])
    data = encode_event(MessageAppended(session_id="s", turn_id="t", message=message, agent_name="A", index=1))
    assert data["kind"] == "message_appended" and data["message"]["tool_calls"][0]["args"] == {"x": 1}
    assert Message.model_validate(data["message"]).tool_calls[0].id == "c1"
    done = encode_event(TurnCompleted(session_id="s", turn_id="t", duration_ms=1.5, message_ids=(3, 4),
                                      response=AgentResponse(content="ok", active_agent_name="A")))
    assert done["message_ids"] == [3, 4] and done["response"]["active_agent_name"] == "A"


def test_it_warns_when_a_process_publishes_into_the_in_memory_layer(settings, capsys, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert warn_if_isolated("chatflow_chat") is True
    assert "will NOT reach the console's websockets" in capsys.readouterr().err
    assert "REDIS_URL" in caplog.text
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:6379/9"]}}}
    assert warn_if_isolated("chatflow_chat") is False


def test_chatflow_chat_warns_at_start_up_with_the_in_memory_layer(tmp_path):
    env = site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}")
    assert subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=REPO, env=env,
                          capture_output=True, timeout=120).returncode == 0

    def chat(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", "chatflow_chat", "--session", "w1"], cwd=REPO,
                              env={**env, **extra}, input="/quit\n", capture_output=True, text=True, timeout=120)

    done = chat()
    assert done.returncode == 0, done.stderr
    assert "WARNING: manage.py chatflow_chat uses the in-memory channel layer" in done.stderr
    assert done.stderr.count("will NOT reach the console's websockets") == 1, done.stderr  # logged, not printed too
    quiet = chat(REDIS_URL="redis://127.0.0.1:6379/9")
    assert quiet.returncode == 0, quiet.stderr
    assert "in-memory channel layer" not in quiet.stderr


def test_the_demo_data_seeder_does_not_warn_about_the_in_memory_layer(tmp_path):
    """``dev.py serve`` seeds with ``chatflow_demo`` on a new user's first start: nobody watches those turns."""
    env = site_env(DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}")
    assert subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=REPO, env=env,
                          capture_output=True, timeout=120).returncode == 0
    done = subprocess.run([sys.executable, "manage.py", "chatflow_demo", "--sessions", "2", "--seed", "1"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "created 2 sessions" in done.stdout
    assert "in-memory channel layer" not in done.stderr, done.stderr


XSS = "<script>alert(1)</script>"


def test_live_fragments_escape_what_users_and_models_wrote():
    """Invariant 9 on the live path: every event kind, rendered, shows the payload as text."""
    from chatflow_agent.core.events import (
        HandoffOccurred,
        TextDelta,
        ToolCallFinished,
        ToolCallStarted,
        TurnFailed,
        TurnStarted,
    )
    from chatflow_agent.types import Handoff, ToolResult
    from console_app.fragments import DetailView, render_event

    view = DetailView(user=None, session_id=XSS)
    call = ToolCall(id=XSS, name=XSS, args={XSS: XSS})
    events = [
        TurnStarted(session_id=XSS, turn_id="t", agent_name=XSS, user_message=XSS),
        MessageAppended(session_id=XSS, turn_id="t", message=Message(role=Role.USER, content=XSS), agent_name=XSS,
                        index=0),
        MessageAppended(session_id=XSS, turn_id="t", message=Message(role=Role.MODEL, content=XSS, tool_calls=[call]),
                        agent_name=XSS, index=1),
        ToolCallStarted(session_id=XSS, turn_id="t", call=call, agent_name=XSS),
        ToolCallFinished(session_id=XSS, turn_id="t", agent_name=XSS, duration_ms=1,
                         result=ToolResult(tool_call_id=XSS, name=XSS, content={XSS: XSS})),
        HandoffOccurred(session_id=XSS, turn_id="t", from_agent=XSS, to_agent=XSS,
                        handoff=Handoff(target_agent_name=XSS, reason=XSS)),
        TextDelta(session_id=XSS, turn_id="t", text=XSS, agent_name=XSS),
        TurnFailed(session_id=XSS, turn_id="t", error_type=XSS, error=XSS),
    ]
    for event in events:
        html = render_event(view, encode_event(event))
        assert html and "<script>" not in html, event.type
        assert "&lt;script&gt;" in html, event.type


# ---- a run event nobody can receive is not encoded ---------------------------------------------
def _turn_events(session_id: str) -> list:
    from chatflow_agent.core.events import TextDelta, TurnStarted

    return [TurnStarted(session_id=session_id, turn_id="t", agent_name="A", user_message="hi"),
            TextDelta(session_id=session_id, turn_id="t", text="hel", agent_name="A")]


@pytest.fixture
def memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    yield get_channel_layer()
    channel_layers.backends.clear()


@pytest.fixture
def encoded(monkeypatch):
    """The kinds of the events the publisher encoded (a spy around the real encoder)."""
    kinds: list[str] = []

    def spy(event):
        kinds.append(event.type)
        return encode_event(event)

    monkeypatch.setattr(live, "encode_event", spy)
    return kinds


@pytest.mark.asyncio
async def test_events_without_a_listener_in_the_in_memory_layer_are_not_encoded(memory_layer, encoded):
    for event in _turn_events("s-nobody"):
        publisher(event)
    await publisher.flush()
    assert encoded == []
    assert not has_receivers(memory_layer, [group_for_session("s-nobody"), LIST_GROUP])


@pytest.mark.asyncio
async def test_a_listener_of_the_session_or_of_the_list_gets_its_events(memory_layer, encoded):
    session = await memory_layer.new_channel()
    await join(memory_layer, group_for_session("s-watched"), session)
    for event in _turn_events("s-watched"):
        publisher(event)
    await publisher.flush()
    got = [(await memory_layer.receive(session))["event"]["kind"] for _ in range(2)]
    assert got == ["turn_started", "text_delta"] and encoded == got

    encoded.clear()
    listing = await memory_layer.new_channel()
    await join(memory_layer, LIST_GROUP, listing)
    for event in _turn_events("s-other"):  # only the list listens: its kinds are encoded, a text delta is not
        publisher(event)
    await publisher.flush()
    assert (await memory_layer.receive(listing))["event"]["kind"] == "turn_started"
    assert encoded == ["turn_started"]
    await leave(memory_layer, LIST_GROUP, listing)
    await leave(memory_layer, group_for_session("s-watched"), session)


@pytest.mark.asyncio
async def test_once_its_last_listener_left_a_group_has_no_receivers(memory_layer, encoded):
    group = group_for_session("s-left")
    first, second = await memory_layer.new_channel(), await memory_layer.new_channel()
    await join(memory_layer, group, first)
    await join(memory_layer, group, second)
    await leave(memory_layer, group, first)
    await leave(memory_layer, group, first)  # twice: changes nothing
    assert has_receivers(memory_layer, [group])
    await leave(memory_layer, group, second)
    assert not has_receivers(memory_layer, [group])
    for event in _turn_events("s-left"):
        publisher(event)
    await publisher.flush()
    assert encoded == []


def test_other_layers_always_have_receivers():
    assert has_receivers(RelayChannelLayer(fd=1), [group_for_session("s")])
    assert has_receivers(BaseChannelLayer(), [LIST_GROUP])
