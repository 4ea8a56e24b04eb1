"""A persistent session's sync state and the pure functions that diff a history against it.

``SyncState`` is what a store knows about the rows behind one live session: which row holds each
message (by identity), rows on disk the history no longer shows, the history as last written or
loaded, and the row's token and version. The functions compute a commit's ``Changes`` from
``(history, state)`` and apply a ``CommitResult`` to the state; none touches a database or a store.

Messages are matched to rows by identity: ``rows`` keeps each persisted message object, so its
``id()`` cannot be reused while the row is known.
"""

from __future__ import annotations

import json
from operator import is_
from typing import Any

from chatflow_agent.core._pruning import prune_history
from chatflow_agent.core.backend import Changes, CommitResult, StoredRow, parse_row
from chatflow_agent.types import Message

__all__ = ["Delta", "SyncState", "apply_commit", "changes", "compare_all", "delta", "load_rows"]

#: ``(new messages, messages whose rows go)``
Delta = tuple[list[Message], list[Message]]


class SyncState:
    """The rows behind one live session (see the module docstring)."""

    __slots__ = ("rows", "stale_ids", "synced", "token", "version", "__weakref__")

    def __init__(self) -> None:
        #: id(message) -> (message, row id) for messages of the history that have a row
        self.rows: dict[int, tuple[Message, int]] = {}
        #: ids of rows on disk that the history does not hold (left out by pruning on load)
        self.stale_ids: set[int] = set()
        #: the history as last written or loaded (each message has its row, no other row is known),
        #: or None: lets a commit find what changed without comparing every message
        self.synced: list[Message] | None = None
        self.token: Any = None  # the backend's incarnation token of the session row; None: not stored
        self.version: Any = None  # the backend's version of the session when last read or written

    def row_id(self, message: Message) -> int | None:
        entry = self.rows.get(id(message))
        return entry[1] if entry is not None and entry[0] is message else None


def load_rows(state: SyncState, rows: list[StoredRow], max_turns: int, token: Any, version: Any) -> list[Message]:
    """Reset ``state`` to the stored ``rows`` and return the history they give (pruned to ``max_turns``)."""
    parsed: list[tuple[Message, int]] = []
    for row in rows:
        msg = parse_row(row)
        if msg is not None:
            parsed.append((msg, row.id))
    history = prune_history([m for m, _ in parsed], max_turns)
    kept = {id(m) for m in history}
    state.rows = {id(m): (m, rid) for m, rid in parsed if id(m) in kept}
    state.synced = list(history)
    state.stale_ids = {rid for m, rid in parsed if id(m) not in kept}
    state.token, state.version = token, version
    return history


def delta(history: list[Message], state: SyncState) -> Delta | None:
    """``(new messages, messages whose rows go)`` when ``history`` is ``state.synced`` with messages
    dropped from its front and new ones appended, else None.

    That is the shape of nearly every commit (a turn appends, pruning drops the oldest turn), and
    checking it costs O(changed messages) plus one identity comparison in C, where
    :func:`compare_all` takes ``id()`` of every message twice.
    """
    synced = state.synced
    if synced is None:
        return None
    rows = state.rows
    kept = len(history)
    while kept and id(history[kept - 1]) not in rows:
        kept -= 1
    dropped = len(synced) - kept
    if dropped < 0 or not all(map(is_, history[:kept], synced[dropped:])):
        return None
    new = history[kept:]
    if len(new) > 1 and len(set(map(id, new))) != len(new):
        return None  # one object added twice: the general path gives each occurrence its own row
    return new, synced[:dropped]


def changes(session_id: str, history: list[Message], agent_name: str, metadata: dict[str, Any],
            state: SyncState, release_owner: str | None, diff: Delta | None) -> Changes:
    """What a commit of ``history`` must write: messages without a row, rows no longer in it.

    ``diff`` (from :func:`delta`) gives both directly; otherwise :func:`compare_all` finds them
    (and may replace repeated message objects in ``history`` by copies).
    """
    if diff is not None:
        inserts, dropped = diff
        rows = state.rows
        delete_ids = [rows[id(m)][1] for m in dropped]
    else:
        inserts, delete_ids = compare_all(history, state.rows)
    delete_ids.extend(state.stale_ids)
    return Changes(
        session_id=session_id,
        token=state.token,
        agent_name=agent_name,
        metadata_json=json.dumps(metadata, ensure_ascii=False, default=str) if metadata else "{}",
        inserts=inserts,
        delete_ids=sorted(set(delete_ids)),
        release_owner=release_owner,
        version=state.version,
    )


def compare_all(history: list[Message], rows: dict[int, tuple[Message, int]]) -> tuple[list[Message], list[int]]:
    """Messages of ``history`` without a row, and ids of rows whose message left it.

    A message object that occurs twice, or a stored one now behind a new message or one stored
    after it, is replaced in ``history`` by a copy, which gets its own row at its place (rows load
    in id order; one row cannot stand for two messages).
    """
    ids = list(map(id, history))
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        for i, m in enumerate(history):
            if id(m) in seen:
                history[i] = m = m.model_copy()
                ids[i] = id(m)
            seen.add(id(m))
    last_row, after_new = -1, False
    for i, m in enumerate(history):
        entry = rows.get(ids[i])
        if entry is None:
            after_new = True
        elif after_new or entry[1] < last_row:
            history[i] = m.model_copy()
            ids[i] = id(history[i])
        else:
            last_row = entry[1]
    live = set(ids)
    new = live.difference(rows)
    if not new:
        inserts: list[Message] = []
    elif new.issuperset(ids[-len(new):]):  # the usual case: the new messages are the newest
        inserts = history[-len(new):]
    else:
        inserts = [m for m, i in zip(history, ids, strict=True) if i in new]
    return inserts, [rows[key][1] for key in rows.keys() - live]


def apply_commit(state: SyncState, history: list[Message], written: Changes, result: CommitResult,
                 diff: Delta | None) -> None:
    """Bring ``state`` up to a commit of ``history`` that wrote ``written`` and answered ``result``."""
    rows = state.rows
    if diff is not None:
        for m in diff[1]:
            del rows[id(m)]
    else:
        for key in rows.keys() - set(map(id, history)):
            del rows[key]
    rows.update(zip(map(id, written.inserts), zip(written.inserts, result.new_ids, strict=True), strict=True))
    state.synced = list(history)  # now every message has its row, and no other row is known
    state.stale_ids = set()
    state.token = result.token
    state.version = result.version
