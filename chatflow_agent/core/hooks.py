"""Per-turn hooks: work a turn carries into its own commit.

A caller that has work to do if and only if a turn is stored (record what a queued message's turn
answered, apply what a turn gate decided) gives the turn a :class:`TurnHooks`:
``Runner.run_async(..., hooks=TurnHooks([...]))`` or ``store.turn(..., hooks=...)`` (and
``sync_turn``). The object belongs to that one turn: reading the call shows everything that runs in
its commit, and nothing is found through a registry keyed by a session id. A turn's gate adds to it
through its decision (``TurnDecision.on_commit``) and the Runner's ``on_human_request`` hook by
returning a hook; a turn given no hooks and whose gate decided nothing to store carries an empty
list, so its commit runs no callback.

When and where a commit hook runs: once per commit attempt of the turn, in list order, inside the
commit's transaction, before any of the turn's rows is written, on the thread that writes the commit
(a persistent store's pool thread; the caller's for ``sync_turn`` and the in-memory store). A
backend on a database runs them on the connection and in the transaction that writes the turn, so
what a hook writes there is stored if and only if the turn is. The in-memory store has no
transaction: it calls them where it commits. A turn whose commit is refused and which is played
again calls them again, in the new attempt's transaction.

Raising refuses the commit: nothing of the turn (nor what earlier hooks wrote in the transaction) is
stored and the turn fails with that exception, rolled back like any failed turn.
``chatflow_agent.exceptions.SessionDeletedError`` says the session is gone (a turn never re-creates
it); ``SessionBusyError`` that the turn may not commit now (another worker or an operator holds
what it needed). A hook must not start a turn or a transaction of its own on the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatflow_agent.core.reports import TurnReport

__all__ = ["CommitHook", "TurnCommit", "TurnHooks"]


@dataclass(frozen=True)
class TurnCommit:
    """What a commit hook is told about the commit it runs in: the session's id, its metadata as the
    commit writes it (a dict, the turn's ``turn_metadata`` merged in), and the turn's report (None for
    a turn played without one, e.g. ``store.turn`` called directly); ``report.response`` is the
    turn's answer when a Runner played it."""

    session_id: str
    metadata: dict[str, Any]
    report: TurnReport | None


#: ``hook(commit)``: called inside the turn's commit transaction (see the module docstring); raising refuses it.
CommitHook = Callable[[TurnCommit], None]


@dataclass
class TurnHooks:
    """``TurnHooks(on_commit=[hook, ...])``: the commit hooks one turn carries (see the module docstring).

    Mutable while the turn runs (its gate and ``on_human_request`` append to :attr:`on_commit`); give
    each turn its own."""

    on_commit: list[CommitHook] = field(default_factory=list)

    def add(self, hook: CommitHook) -> CommitHook:
        """Append ``hook`` to :attr:`on_commit`; returns it."""
        self.on_commit.append(hook)
        return hook

    def committing(self, session_id: str, metadata: dict[str, Any], report: TurnReport | None) -> None:
        """Call every commit hook in order with one :class:`TurnCommit`: for a store or backend, inside the
        commit's transaction before it writes the turn's rows. What a hook raises propagates (the commit is
        refused)."""
        if not self.on_commit:
            return
        commit = TurnCommit(session_id, metadata, report)
        for hook in list(self.on_commit):
            hook(commit)
