"""What a delivery's turn asks of the app that may hold sessions for operators: the turn policy.

The queue worker (``webhooks_app.worker``) plays every delivery's turn itself and asks its
:class:`TurnPolicy` at three points, each written where it happens in the worker:

- which queued deliveries need no model call because their session is held for an operator
  (:attr:`TurnPolicy.held_session_sql`: the worker's held lane, ``webhooks_app.worker.no_model_call``);
- the turn gate of a message with a fixed answer and no model call (:meth:`TurnPolicy.answered_gate`);
- a failed turn (:meth:`TurnPolicy.note_failed_turn`): whether it made the session wait for an operator, in
  which case the holding message is sent instead of the fallback.

This app owns the protocol and its default, :data:`HOLDS_NOTHING` (no session is ever held). An app above it
(``takeover_app``) implements it and installs its policy with :func:`install` from its ``AppConfig.ready()``;
a worker takes the installed one when it is built. One policy per process: a rule, not per-turn state.
"""

from __future__ import annotations

from typing import Any, Protocol

from chatflow_agent.core.gate import TurnDecision, TurnGate

__all__ = ["HOLDS_NOTHING", "HoldsNothing", "TurnPolicy", "install", "installed"]


class TurnPolicy(Protocol):
    """The rules a delivery's turn asks (see the module docstring)."""

    #: SQL true for a delivery (its row, alias ``c``) whose session is held for an operator: its turn will be
    #: held, with no model call. ``""`` when no session is ever held.
    held_session_sql: str

    def answered_gate(self, answer: str) -> TurnGate:
        """The turn gate (``Runner.run_async(..., turn_gate=...)``) of a message whose answer is ``answer``
        and that reaches no model: held while the session is held for an operator, else stored with
        ``answer`` as its reply. It runs inside the turn's lock."""
        ...

    def note_failed_turn(self, session_id: str) -> bool:
        """Count a failed (rolled back) turn of ``session_id``; True when that made the session wait for an
        operator. Blocking (database queries): called on a worker slot's thread."""
        ...


class HoldsNothing:
    """The default :class:`TurnPolicy`: no session is held, a fixed answer is always given, a failed turn
    changes nothing."""

    held_session_sql = ""

    def answered_gate(self, answer: str) -> TurnGate:
        """A gate that stores the message with ``answer`` as its reply (no model call)."""
        def gate(session: Any, text: str) -> TurnDecision:
            return TurnDecision(hold=True, reply=answer)

        return gate

    def note_failed_turn(self, session_id: str) -> bool:
        """False: a failure never hands the session to an operator."""
        return False


#: The policy of a process where no app installed one.
HOLDS_NOTHING = HoldsNothing()

_installed: list[TurnPolicy] = [HOLDS_NOTHING]


def install(policy: TurnPolicy) -> None:
    """Make ``policy`` the process's turn policy (the workers built from now on ask it)."""
    _installed[0] = policy


def installed() -> TurnPolicy:
    """The process's turn policy: the one last :func:`install`-ed, else :data:`HOLDS_NOTHING`."""
    return _installed[0]
