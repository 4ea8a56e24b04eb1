"""Turn grouping, pruning and the engine's well-formed view, as pure functions on message lists.

(The issue's max_turns=2 example with parallel tool calls runs in tests/store_contract.py on every store.)
"""

from __future__ import annotations

from chatflow_agent import Message, Role, ToolCall, ToolResult
from chatflow_agent.core.memory import engine_view, group_turns, numbered_turns, prune_history, turn_number


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def model(text: str | None = None, *call_ids: str) -> Message:
    calls = [ToolCall(id=c, name="lookup", args={}) for c in call_ids] or None
    return Message(role=Role.MODEL, content=text, tool_calls=calls)


def results(*call_ids: str) -> Message:
    outputs = [ToolResult(tool_call_id=c, name="lookup", content="r") for c in call_ids]
    return Message(role=Role.TOOL, tool_results=outputs)


def system(text: str) -> Message:
    return Message(role=Role.SYSTEM, content=text)


def shape(history: list[Message]) -> list[str]:
    out = []
    for m in history:
        ids = [c.id for c in m.tool_calls or []] + [r.tool_call_id for r in m.tool_results or []]
        out.append(f"{m.role.value}:{m.content or ''}{'/' + ','.join(ids) if ids else ''}")
    return out


def test_group_turns_splits_system_turns_and_leading_messages() -> None:
    history = [model("greeting"), system("rules"), user("u1"), model("a1"), system("late rule"), user("u2")]
    sys_msgs, turns, leading = group_turns(history)
    assert shape(sys_msgs) == ["system:rules", "system:late rule"]
    assert [shape(t) for t in turns] == [["user:u1", "model:a1"], ["user:u2"]]
    assert shape(leading) == ["model:greeting"]


def test_numbered_turns_numbers_messages_and_stored_rows_alike() -> None:
    history = [model("greeting"), system("rules"), user("u1"), model("a1"), system("late rule"), user("u2")]
    rows = [(10 + k, m.role.value, m.content) for k, m in enumerate(history)]

    by_message = [(n, shape(chunk)) for n, chunk in numbered_turns(history, lambda m: m.role)]
    by_row = [(n, [r[0] for r in chunk]) for n, chunk in numbered_turns(rows, lambda r: r[1])]

    assert by_message == [(0, ["model:greeting", "system:rules"]), (1, ["user:u1", "model:a1", "system:late rule"]),
                          (2, ["user:u2"])]
    assert by_row == [(0, [10, 11]), (1, [12, 13, 14]), (2, [15])]
    # A slice that starts inside turn 4: its first rows continue turn 4, its USER row starts turn 5.
    assert [(n, [r[0] for r in c]) for n, c in numbered_turns(rows[3:], lambda r: r[1], first=5)] == [
        (4, [13, 14]), (5, [15])]
    starts = [r[0] for r in rows if r[1] == "user"]
    assert [turn_number(starts, r[0]) for r in rows] == [0, 0, 1, 1, 1, 2]


def test_pruning_moves_system_messages_to_the_front_and_drops_what_precedes_the_first_user() -> None:
    history = [model("greeting"), results("orphan"), user("u1"), system("late rule"), model("a1")]
    assert shape(prune_history(history, max_turns=5)) == ["system:late rule", "user:u1", "model:a1"]


def test_pruning_returns_the_same_message_objects_in_a_new_list() -> None:
    history = [user("u1"), model("a1"), user("u2"), model("a2")]
    pruned = prune_history(history, max_turns=1)
    assert pruned[0] is history[2] and pruned[1] is history[3]
    assert len(history) == 4  # the input is not modified


def test_pruning_under_the_limit_keeps_everything() -> None:
    history = [system("s"), user("u1"), model("a1", "c1"), results("c1"), model("a1b")]
    assert prune_history(history, max_turns=1) == history


def test_engine_view_drops_a_call_without_result_and_keeps_the_text_of_its_message() -> None:
    history = [user("u1"), model("let me check", "c1", "c2"), results("c1"), model("done")]
    view = engine_view(history)
    assert shape(view) == ["user:u1", "model:let me check/c1", "tool:/c1", "model:done"]
    assert shape(history) == ["user:u1", "model:let me check/c1,c2", "tool:/c1", "model:done"]  # not rewritten


def test_engine_view_drops_a_model_message_left_empty_by_an_unanswered_call() -> None:
    history = [user("u1"), model(None, "c1"), user("u2")]
    assert shape(engine_view(history)) == ["user:u1", "user:u2"]


def test_engine_view_drops_a_result_without_its_call() -> None:
    history = [user("u1"), results("ghost"), model("a1", "c1"), results("c1", "ghost2")]
    assert shape(engine_view(history)) == ["user:u1", "model:a1/c1", "tool:/c1"]


def test_engine_view_does_not_pair_a_result_with_a_call_of_an_earlier_turn() -> None:
    history = [user("u1"), model("a", "c1"), user("u2"), results("c1"), model("b")]
    assert shape(engine_view(history)) == ["user:u1", "model:a", "user:u2", "model:b"]


def test_engine_view_starts_with_system_then_user() -> None:
    history = [results("c0"), model("hello first"), system("rules"), user("u1"), model("a1")]
    assert shape(engine_view(history)) == ["system:rules", "user:u1", "model:a1"]


def test_engine_view_passes_well_formed_messages_through_as_they_are() -> None:
    history = [system("s"), user("u1"), model(None, "c1", "c2"), results("c1", "c2"), model("a1")]
    view = engine_view(history)
    assert all(a is b for a, b in zip(view, history, strict=True))


def test_the_fast_path_of_engine_view_agrees_with_the_full_pass_on_random_histories() -> None:
    import random

    from chatflow_agent.core._pruning import _already_well_formed, _well_formed_turn

    def full_pass(history):
        system, turns, _ = group_turns(history)
        return system + [m for turn in turns for m in _well_formed_turn(turn)]

    rng = random.Random(7)
    fast_hits = 0
    for _ in range(3000):
        history, ids = [], iter(range(10_000))
        for _ in range(rng.randint(0, 9)):
            kind = rng.choice(["user", "user", "model", "call", "result", "system", "orphan"])
            if kind in ("user", "model", "system"):
                history.append(Message(role=Role(kind), content=kind))
            elif kind == "call":
                calls = [ToolCall(id=f"c{next(ids)}", name="t") for _ in range(rng.randint(1, 2))]
                history.append(Message(role=Role.MODEL, tool_calls=calls))
                if rng.random() < 0.8:
                    history.append(Message(role=Role.TOOL, tool_results=[
                        ToolResult(tool_call_id=c.id, name="t", content=1) for c in calls]))
            else:
                target = f"c{rng.randint(0, 5)}" if kind == "result" else "gone"
                history.append(Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id=target, name="t",
                                                                                content=1)]))
        expected = [m.model_dump() for m in full_pass(history)]
        assert [m.model_dump() for m in engine_view(history)] == expected, history
        if _already_well_formed(history):
            fast_hits += 1
            assert [m.model_dump() for m in history] == expected
    assert fast_hits > 300  # the fast path was exercised, not only the full pass


def test_pruning_agrees_with_grouping_whole_turns_on_random_histories() -> None:
    import random

    def by_turns(history, max_turns):  # the rule, written out: SYSTEM first, newest whole turns
        system, turns, _ = group_turns(history)
        return system + [m for turn in turns[-max_turns:] for m in turn]

    rng = random.Random(11)
    for _ in range(3000):
        history = [Message(role=rng.choice([Role.USER, Role.USER, Role.MODEL, Role.TOOL, Role.SYSTEM]),
                           content=str(i)) for i in range(rng.randint(0, 12))]
        max_turns = rng.randint(1, 4)
        pruned = prune_history(history, max_turns)
        expected = by_turns(history, max_turns)
        assert len(pruned) == len(expected) and all(a is b for a, b in zip(pruned, expected, strict=True)), (
            shape(history), max_turns)
