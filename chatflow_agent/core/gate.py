"""The turn gate: what a host application may decide before a turn reaches the model.

A Runner built with ``turn_gate=`` calls it at the start of every turn, inside the session's turn
lock, with the session (its history as before the turn) and the user message; a run given a gate of its
own (``Runner.run_async(..., turn_gate=...)``) calls that one instead. The gate returns
``None`` (play the turn as usual) or a :class:`TurnDecision`:

- ``hold=True``: the user message is stored and no model is called (an operator answers the session
  instead); ``reply``, if given, is stored as the MODEL answer and returned as the turn's answer (a
  holding message). The response has ``held=True``.
- ``instructions``: extra system instructions for this turn's model calls only. They reach the engine
  as a SYSTEM message after the session's own, and are never stored in the session.
- ``human_requested``: a reason; the response carries it (``AgentResponse.human_requested``).
- ``on_commit``: a commit hook (``chatflow_agent.core.hooks``) the Runner adds to the turn's hooks: what
  the decision writes is written inside the turn's commit transaction, so it is stored if and only if
  the turn is; a decision with nothing to store leaves it None and the turn carries no hook for it.

A gate may be a plain function or a coroutine function; it must not block the event loop (a gate
that reads a database runs the read on a thread). An exception from the gate fails the turn, which
is then rolled back like any failed turn.

:func:`request_human_tool` is a built-in tool an agent can be given: when the model calls it, the
Runner calls its ``on_human_request`` hook (inside the turn lock), sets ``AgentResponse.human_requested``
to the reason and ends the turn with its ``human_request_reply`` as the answer: the host application's
words (a holding message), which the runtime does not write. Without one the model answers after the
tool's result. The hook may return a commit hook, which the Runner adds to the turn's hooks (the request
is then stored with the turn, inside its commit transaction).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatflow_agent.core.hooks import CommitHook
from chatflow_agent.core.tools import Tool

if TYPE_CHECKING:
    from chatflow_agent.core._session import SessionContext

__all__ = ["REQUEST_HUMAN",
           "HumanRequest", "HumanRequestHook", "TurnDecision", "TurnGate", "request_human_tool"]

#: The name the built-in tool is given (and the name its tool calls and results carry).
REQUEST_HUMAN = "request_human"


@dataclass(frozen=True)
class TurnDecision:
    """A turn gate's decision for one turn (see the module docstring); the default plays the turn."""

    hold: bool = False
    reply: str | None = None
    instructions: str | None = None
    human_requested: str | None = None
    on_commit: CommitHook | None = None


@dataclass(frozen=True)
class HumanRequest:
    """What the ``request_human`` tool returns: the model asked for a person, for ``reason``."""

    reason: str


#: ``gate(session, user_message)`` → a decision, or None to play the turn as usual.
TurnGate = Callable[["SessionContext", str], "TurnDecision | None | Awaitable[TurnDecision | None]"]
#: ``hook(session, reason)``, called inside the turn lock when an agent called ``request_human``; it may return
#: a commit hook for the turn to carry (see the module docstring).
HumanRequestHook = Callable[["SessionContext", str], "CommitHook | Awaitable[CommitHook | None] | None"]


def request_human(reason: str = "The customer asked for a person.") -> HumanRequest:
    """Ask for a human operator to take over this conversation: use it when the customer wants to talk to
    a person, or when you cannot help them. ``reason``: one sentence for the operator."""
    return HumanRequest(reason=str(reason))


def request_human_tool() -> Tool:
    """The built-in ``request_human(reason: str)`` tool; give it to an agent in its ``tools``."""
    return Tool(request_human, name=REQUEST_HUMAN)
