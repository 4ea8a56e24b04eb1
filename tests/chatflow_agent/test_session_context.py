"""SessionContext (max_turns, the turns view, rollback) and the in-memory SessionStore's own rules."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from chatflow_agent import Agent, Message, Role, SessionStore
from chatflow_agent.core.memory import DEFAULT_DEDUP_TTL_HOURS, SessionContext

AGENT = Agent(name="Support", instructions="Help.")


def msg(role: Role, text: str) -> Message:
    return Message(role=role, content=text)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, False, "3", None])
def test_max_turns_that_is_not_a_positive_int_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_turns"):
        SessionContext("s", AGENT, max_turns=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="default_max_turns"):
        SessionStore(default_max_turns=bad)  # type: ignore[arg-type]


def test_a_session_starts_with_0_3_4s_defaults() -> None:
    session = SessionContext("s", AGENT)
    assert (session.session_id, session.active_agent, session.max_turns) == ("s", AGENT, 40)
    assert (session.history, session.metadata) == ([], {})


def test_the_turns_view_groups_the_history_by_user_message_and_is_read_only() -> None:
    session = SessionContext("s", AGENT, max_turns=5)
    for m in [msg(Role.SYSTEM, "rules"), msg(Role.USER, "u1"), msg(Role.MODEL, "a1"), msg(Role.USER, "u2")]:
        session.add_message(m)
    turns = session.turns
    assert [[m.content for m in turn] for turn in turns] == [["u1", "a1"], ["u2"]]
    assert [m.content for m in session.system_messages] == ["rules"]
    assert isinstance(turns, tuple) and all(isinstance(t, tuple) for t in turns)
    with pytest.raises(AttributeError):
        turns[0].append(msg(Role.MODEL, "sneaky"))  # type: ignore[attr-defined]


def test_adding_a_message_prunes_whole_turns() -> None:
    session = SessionContext("s", AGENT, max_turns=1)
    for text in ["u1", "a1", "u2"]:
        session.add_message(msg(Role.USER if text[0] == "u" else Role.MODEL, text))
    assert [m.content for m in session.history] == ["u2"]


def test_rollback_to_keeps_the_first_messages_and_clear_history_empties() -> None:
    session = SessionContext("s", AGENT)
    for text in ["u1", "a1", "u2", "a2"]:
        session.add_message(msg(Role.USER if text[0] == "u" else Role.MODEL, text))
    session.rollback_to(2)
    assert [m.content for m in session.history] == ["u1", "a1"]
    session.clear_history()
    assert session.history == []


def test_set_active_agent_switches_the_agent() -> None:
    session = SessionContext("s", AGENT)
    billing = Agent(name="Billing", instructions="Bill.")
    session.set_active_agent(billing)
    assert session.active_agent is billing


# ---- the in-memory SessionStore ------------------------------------------------------------------


def test_the_dedup_ttl_defaults_to_eight_days() -> None:
    assert DEFAULT_DEDUP_TTL_HOURS == 192
    assert SessionStore().dedup_ttl_hours == 192


@pytest.mark.parametrize("bad", [0, -1, -0.5, True])
def test_a_dedup_ttl_that_is_not_positive_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="dedup_ttl_hours"):
        SessionStore(dedup_ttl_hours=bad)


def test_a_fractional_dedup_ttl_is_accepted() -> None:
    assert SessionStore(dedup_ttl_hours=0.5).dedup_ttl_hours == 0.5


def test_dedup_remembers_10000_ids_and_forgets_the_oldest_first() -> None:
    store = SessionStore()
    for n in range(10_000):
        assert store.record_processed_message(f"wamid.{n}")
    assert store.is_message_processed("wamid.0")
    assert store.record_processed_message("wamid.10000")  # the 10,001st evicts the oldest
    assert not store.is_message_processed("wamid.0")
    assert store.is_message_processed("wamid.1")
    assert store.is_message_processed("wamid.10000")
    assert store.record_processed_message("wamid.0")  # forgotten, so claimable again; evicts wamid.1
    assert not store.is_message_processed("wamid.1")
    assert not store.record_processed_message("wamid.2")
    # O(1) eviction needs insertion order with popitem(last=False); a timed test would be flaky.
    assert type(store._processed) is OrderedDict
    assert len(store._processed) == 10_000


def test_a_repeated_claim_does_not_refresh_the_ids_place_in_the_eviction_order() -> None:
    store = SessionStore()
    store.record_processed_message("first")
    for n in range(9_999):
        store.record_processed_message(f"id.{n}")
    assert not store.record_processed_message("first")  # a repeat, refused
    store.record_processed_message("one-more")
    assert not store.is_message_processed("first")  # still the oldest claim, so evicted first


def test_mark_then_is_processed_follows_the_seed_pattern() -> None:
    store = SessionStore()
    assert not store.is_message_processed("wamid.HBgLMjAyNjEwMzAA")
    store.mark_message_processed("wamid.HBgLMjAyNjEwMzAA")
    assert store.is_message_processed("wamid.HBgLMjAyNjEwMzAA")
    assert not store.record_processed_message("wamid.HBgLMjAyNjEwMzAA")


def test_get_or_create_returns_the_same_object_and_only_the_first_metadata_counts() -> None:
    store = SessionStore(default_max_turns=3)
    first = store.get_or_create("s", AGENT, metadata={"channel": "web"})
    again = store.get_or_create("s", Agent(name="Other", instructions="x"), metadata={"channel": "sms"})
    assert again is first
    assert (first.max_turns, first.metadata, first.active_agent) == (3, {"channel": "web"}, AGENT)
    assert store.get("missing") is None
    assert store.delete("s") and not store.delete("s")


@pytest.mark.asyncio
async def test_the_awaitable_twins_act_like_the_sync_methods() -> None:
    store = SessionStore()
    session = await store.aget_or_create("s", AGENT)
    assert await store.aget("s") is session
    assert await store.alist_sessions() == ["s"]
    await session.aadd_message(msg(Role.USER, "u1"))
    assert [m.content for m in session.history] == ["u1"]
    assert await store.arecord_processed_message("m1")
    assert not await store.arecord_processed_message("m1")
    assert await store.adelete("s")
    assert await store.alist_sessions() == []
