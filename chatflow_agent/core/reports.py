"""What a turn reports about itself: status, timings, agent trail, model and tool calls.

The Runner makes one ``TurnReport`` per turn (or fills the one its caller passed) and hands it to the
store's ``turn``; a persistent store passes it on to its backend with the writes the turn makes
anyway: ``SessionBackend.acquire_lease`` (the turn starts: a backend that keeps turn records opens
one, status ``running``), ``Changes.report`` (the commit: ``completed``) and ``release_lease`` (a turn
that did not commit: ``failed`` or ``cancelled``). A backend that keeps no records ignores it. The
report is filled while the turn runs, from the turn's own task; a backend reads it, never writes it.

Statuses: ``running``, ``completed``, ``failed`` (an engine, tool or store error), ``cancelled``
(cancelled or timed out), and two a turn never sets itself: ``rolled_back`` (an operator rollback
discarded the committed turn) and ``interrupted`` (its process died: the lease expired while the
record still said ``running``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal, TypeVar

from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.types import AgentResponse, ModelCallUsage, TurnUsage

__all__ = ["TOOL_OUTCOMES", "TURN_STATUSES", "ToolCallReport", "TurnReport", "TurnStatus"]

TurnStatus = Literal["running", "completed", "failed", "rolled_back", "cancelled", "interrupted"]
TURN_STATUSES: tuple[TurnStatus, ...] = ("running", "completed", "failed", "rolled_back", "cancelled", "interrupted")
#: ``ToolCallReport.outcome``: the tool returned, raised or was unknown (``error``), handed the
#: session to another agent (``handoff``), or was not run (``skipped``: the handoff limit).
TOOL_OUTCOMES = ("ok", "error", "handoff", "skipped")


@dataclass
class ToolCallReport:
    """One tool call of the turn: the tool's ``name``, how long it ran (milliseconds), its outcome."""

    name: str
    duration_ms: float
    outcome: str = "ok"


@dataclass
class TurnReport:
    """One turn's record while it runs (see the module docstring); mutable, filled by Runner and store.

    Set by the caller (optional): ``source`` (where the turn came from, in the host application's words;
    the runtime only carries it), ``queue_wait_ms`` (how long the
    work waited before a worker took it: a webhook delivery's first sighting → its claim), ``trace_id``
    (32 hex digits, the OpenTelemetry trace). Set by the Runner: ``user_text``, ``agents`` (the agent
    that played the turn, then every handoff target), ``calls`` (each model call's priced usage),
    ``tools``, and ``response`` (the turn's ``AgentResponse``, once it has one: before the store
    commits the turn, so a backend can write what the turn answered with its rows). Set by the store:
    ``owner`` (the lease owner, ``host:pid:…``), ``requested_at`` / ``started_at`` / ``finished_at``
    (unix epoch seconds: the turn asked for the session, got its lease, ended), ``status`` and ``error``
    (``"TypeName: message"`` of what ended a failed turn).
    """

    source: str = "other"
    queue_wait_ms: float | None = None
    trace_id: str = ""
    user_text: str = ""
    owner: str = ""
    requested_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    status: TurnStatus = "running"
    error: str = ""
    agents: list[str] = field(default_factory=list)
    calls: list[ModelCallUsage] = field(default_factory=list)
    tools: list[ToolCallReport] = field(default_factory=list)
    response: AgentResponse | None = None

    @property
    def lease_wait_ms(self) -> float | None:
        """Milliseconds from asking for the session to holding its lease (None before that)."""
        return None if self.started_at is None else max(0.0, (self.started_at - self.requested_at) * 1000)

    @property
    def duration_ms(self) -> float | None:
        """Milliseconds from holding the lease to the end of the turn (None while it runs)."""
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0.0, (self.finished_at - self.started_at) * 1000)

    @property
    def usage(self) -> TurnUsage:
        """The model calls so far and their totals (a total is None unless every call reported it)."""
        return TurnUsage(calls=list(self.calls))

    @property
    def input_tokens(self) -> int | None:
        """Prompt tokens over the calls; None when a call did not report them (never 0 for unknown).
        A turn without model calls used 0."""
        return _known_sum([c.input_tokens for c in self.calls], 0)

    @property
    def output_tokens(self) -> int | None:
        return _known_sum([c.output_tokens for c in self.calls], 0)

    @property
    def cached_tokens(self) -> int | None:
        return _known_sum([c.cached_tokens for c in self.calls], 0)

    @property
    def total_tokens(self) -> int | None:
        """Input plus output tokens; None when either is unknown."""
        tokens_in, tokens_out = self.input_tokens, self.output_tokens
        return None if tokens_in is None or tokens_out is None else tokens_in + tokens_out

    @property
    def cost(self) -> Decimal | None:
        """US dollars over the calls; None when any call's price is unknown (never 0 for unknown).
        A turn without model calls costs 0."""
        return _known_sum([c.cost for c in self.calls], Decimal(0))

    def add_agent(self, name: str) -> None:
        """Append ``name`` to the agent trail unless it is already the last one."""
        if not self.agents or self.agents[-1] != name:
            self.agents.append(name)

    def begin(self, owner: str) -> None:
        """The store got the session's lease for ``owner`` (called before each try: the values of the
        successful one stay)."""
        self.owner = owner
        self.started_at = time.time()

    def end(self, status: TurnStatus, error: BaseException | str | None = None) -> None:
        """The turn ended with ``status``; ``error`` (an exception or text) becomes :attr:`error`."""
        self.status = status
        self.finished_at = time.time()
        if isinstance(error, BaseException):
            self.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        elif error:
            self.error = error

    def ended_by(self, err: BaseException) -> None:
        """The turn did not commit because of ``err``: ``cancelled`` for a cancellation, a lease lost
        or taken away (``SessionBusyError``: an operator's cancel) or a deleted session
        (``SessionDeletedError``: its :attr:`user_text` is dropped with the session's content), else
        ``failed``."""
        if isinstance(err, SessionDeletedError):
            self.user_text = ""
        stopped = isinstance(err, asyncio.CancelledError | SessionBusyError | SessionDeletedError)
        self.end("cancelled" if stopped else "failed", err)


_N = TypeVar("_N", int, Decimal)


def _known_sum(values: list[_N | None], zero: _N) -> _N | None:
    """The sum of ``values`` (``zero`` for none), or None when any of them is None."""
    total = zero
    for value in values:
        if value is None:
            return None
        total += value
    return total
