"""Turn grouping, turn-based pruning and the engine's well-formed view of a history.

One pure function prunes for every store, so memory and storage always agree (invariant 1, 4).
The rule is the seed's ("Sessões e Estado da Conversa", *O Algoritmo de Poda por Turnos
Completos*): every SYSTEM message is kept, at the front; the other messages are grouped into
turns that start at a USER message; anything before the first USER message is dropped; only
the newest ``max_turns`` whole turns are kept, so a tool call and its result (which live in the
same turn) are never separated.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import TypeVar

from chatflow_agent.types import Message, Role

__all__ = ["group_turns", "numbered_turns", "prune_history", "engine_view", "turn_number"]

_T = TypeVar("_T")

# Enum members as module constants: ``Role.USER`` is a class-attribute lookup through the enum's
# metaclass (~0.2 µs on CPython 3.11), and these loops run over the whole history every turn.
_SYSTEM, _USER, _MODEL, _TOOL = Role.SYSTEM, Role.USER, Role.MODEL, Role.TOOL
_role_of = attrgetter("role")


def numbered_turns(items: Iterable[_T], role: Callable[[_T], object], first: int = 1) -> Iterator[tuple[int, list[_T]]]:
    """What "turn N" means, for messages and stored rows alike: ``items`` (in order) as ``(number, items)``.

    A turn starts at each item whose ``role(item)`` is USER (``Role.USER`` or the stored column's
    ``"user"``) and holds every item after it up to the next one; turns are numbered from ``first``
    on. Items before the first USER item, if any, come first, numbered ``first - 1`` (for a whole
    history: 0, the messages before turn 1). Every item is yielded where it stands, SYSTEM ones
    included (:func:`group_turns` sets those apart). Lazy: a long stream is read one turn at a time.
    """
    number = first - 1
    chunk: list[_T] = []
    for item in items:
        if role(item) == _USER:
            if chunk:
                yield number, chunk
            number, chunk = number + 1, [item]
        else:
            chunk.append(item)
    if chunk:
        yield number, chunk


def turn_number(starts: Sequence[int], position: int) -> int:
    """The number of the turn that holds the item at ``position``, from ``starts``: the positions (row ids,
    say) of the USER items, ascending. 0 for an item before the first turn; the rule of :func:`numbered_turns`."""
    return bisect_right(starts, position)


def group_turns(history: Sequence[Message]) -> tuple[list[Message], list[list[Message]], list[Message]]:
    """Split ``history`` into ``(system_messages, turns, leading)``.

    ``turns`` is a list of turns (:func:`numbered_turns`: turn N is ``turns[N - 1]``), each starting
    with a USER message; ``leading`` holds the non-SYSTEM messages that came before the first USER
    message (pruning drops them).
    """
    system = [msg for msg in history if msg.role == _SYSTEM]
    turns: list[list[Message]] = []
    leading: list[Message] = []
    for number, chunk in numbered_turns([msg for msg in history if msg.role != _SYSTEM] if system else history,
                                        _role_of):
        if number:
            turns.append(chunk)
        else:
            leading = chunk
    return system, turns, leading


def prune_history(history: Sequence[Message], max_turns: int) -> list[Message]:
    """Return the pruned history (same message objects, new list); see the module docstring."""
    roles = list(map(_role_of, history))
    n_system = roles.count(_SYSTEM)
    if roles[:n_system].count(_SYSTEM) == n_system:
        # The usual shape (SYSTEM messages, if any, already at the front): find where the kept
        # turns start with list searches instead of regrouping every message (this runs on every
        # USER message). Same result as the general path below.
        try:
            start = roles.index(_USER, n_system)
        except ValueError:
            return list(history[:n_system])
        for _ in range(roles.count(_USER) - max_turns):
            start = roles.index(_USER, start + 1)
        return [*history[:n_system], *history[start:]]
    system, turns, _leading = group_turns(history)
    kept = turns[-max_turns:] if len(turns) > max_turns else turns
    return system + [m for turn in kept for m in turn]


def engine_view(history: Sequence[Message]) -> list[Message]:
    """What an engine may be shown: well-formed for every provider (invariant 7).

    SYSTEM messages first, then from the first USER message on; a tool result is kept only
    when its call came earlier in the same turn and was not answered yet; a tool call is kept
    only when its result follows before the next USER message; a TOOL or MODEL message left
    empty by that is dropped. Messages that need no change are passed through as they are;
    the stored history is never modified (copies are made where something is left out).
    """
    if _already_well_formed(history):
        return list(history)  # the common case, in one cheap pass (this runs before every model call)
    system, turns, _ = group_turns(history)
    out: list[Message] = list(system)
    for turn in turns:
        out.extend(_well_formed_turn(turn))
    return out


def _already_well_formed(history: Sequence[Message]) -> bool:
    """True when :func:`engine_view` would return ``history`` unchanged (strictly: each tool call
    answered by the TOOL message(s) right after its MODEL message); False sends it the long way."""
    seen_other = seen_user = False
    open_calls: set[str] = set()
    for msg in history:
        role = msg.role
        if role is _SYSTEM:
            if seen_other:
                return False
            continue
        seen_other = True
        if role is _TOOL:
            results = msg.tool_results
            if not results or not open_calls:
                return False
            for result in results:
                if result.tool_call_id not in open_calls:
                    return False
                open_calls.discard(result.tool_call_id)
            continue
        if open_calls:  # a USER or MODEL message while calls still wait for their results
            return False
        if role is _USER:
            seen_user = True
        elif not seen_user:
            return False
        elif msg.tool_calls:
            for call in msg.tool_calls:
                if call.id in open_calls:
                    return False
                open_calls.add(call.id)
    return not open_calls


def _well_formed_turn(turn: list[Message]) -> list[Message]:
    answered: set[str] = set()
    for msg in turn:
        if msg.role == _TOOL:
            answered.update(r.tool_call_id for r in msg.tool_results or [])
    open_calls: set[str] = set()
    out: list[Message] = []
    for msg in turn:
        if msg.role == _MODEL and msg.tool_calls:
            calls = [c for c in msg.tool_calls if c.id in answered and c.id not in open_calls]
            open_calls.update(c.id for c in calls)
            if len(calls) != len(msg.tool_calls):
                if not calls and not msg.content:
                    continue
                msg = msg.model_copy(update={"tool_calls": calls or None})
        elif msg.role == _TOOL:
            results = [r for r in msg.tool_results or [] if r.tool_call_id in open_calls]
            open_calls.difference_update(r.tool_call_id for r in results)
            if not results:
                continue
            if len(results) != len(msg.tool_results or []):
                msg = msg.model_copy(update={"tool_results": results})
        out.append(msg)
    return out
