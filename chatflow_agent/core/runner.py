"""Runner: plays turns (user message → model → tool calls → results → … → answer).

Each turn runs inside ``store.turn``: serialised FIFO per session id (across processes for the
persistent stores) and atomic — on an error, a cancellation or a timeout, the session is exactly
as before the turn (history, active agent, rows), even when the user message had pruned an older
turn; only a cancellation that arrives while the commit is being written keeps the turn (the
write cannot be stopped; ``TurnCompleted`` is emitted, then ``CancelledError`` raised). The
visible tool-loop behaviour is chatflow-agent 0.3.4's: an unknown tool gets an error result; a tool
that raises gives the model a generic message with a trace id, and the full error is logged with
that trace id.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from chatflow_agent.core._pruning import engine_view
from chatflow_agent.core._session import BaseSessionStore, SessionContext, SessionStore
from chatflow_agent.core.agent import Agent, PlaceholderAgent
from chatflow_agent.core.engines import BaseEngine, resolve_engine
from chatflow_agent.core.events import (
    HandoffOccurred,
    MessageAppended,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)
from chatflow_agent.core.gate import (
    REQUEST_HUMAN,
    HumanRequest,
    HumanRequestHook,
    TurnDecision,
    TurnGate,
)
from chatflow_agent.core.hooks import TurnHooks
from chatflow_agent.core.reports import ToolCallReport, TurnReport
from chatflow_agent.exceptions import AgentHandoffError
from chatflow_agent.pricing import PriceBook
from chatflow_agent.types import AgentResponse, Handoff, Message, ModelCallUsage, Role, ToolCall, ToolResult, TurnUsage

logger = logging.getLogger("chatflow_agent.runner")

__all__ = ["Runner", "Subscriber"]

Subscriber = Callable[[RunEvent], Awaitable[None] | None]
#: ``wants(session_id, event_type) -> bool``: whether a subscriber receives that event (see ``Runner.subscribe``).
_Wants = Callable[[str, str], bool]
_Emit = Callable[[RunEvent], Awaitable[None]]


class _Turn:
    """The state of one running turn.

    Run events are only built when someone receives them (:meth:`wants`): a turn nobody streams, and
    whose subscribers all decline the event (see ``Runner.subscribe``), skips their construction (a
    turn's events are about a tenth of the Runner's own cost).
    """

    session: SessionContext  # set once the store has handed the session out

    def __init__(self, runner: Runner, session_id: str, emit: _Emit, streamed: bool,
                 report: TurnReport | None = None, gate: TurnGate | None = None,
                 hooks: TurnHooks | None = None) -> None:
        self.runner = runner
        self.gate = gate if gate is not None else runner.turn_gate  # this turn's, else the Runner's
        self.session_id = session_id
        self.report = report if report is not None else TurnReport()
        self.hooks = hooks if hooks is not None else TurnHooks()  # what runs inside this turn's commit
        self.emit = emit
        self.streamed = streamed
        self._turn_id: str | None = None
        self.count = 0
        self.tools_executed: list[str] = []
        self.last_handoff: Handoff | None = None
        self.handoffs = 0
        self.calls: list[ModelCallUsage] = self.report.calls  # each model call's usage, priced
        self.instructions: str | None = None  # the gate's one-turn system instructions (never stored)
        self.human_requested: str | None = None

    @property
    def usage(self) -> TurnUsage:
        return TurnUsage(calls=list(self.calls))

    def wants(self, event_type: str) -> bool:
        """True when an event of ``event_type`` (a ``RunEvent.type``) of this turn reaches someone: a
        ``run_streamed`` consumer, or a subscriber that does not decline it."""
        if self.streamed:
            return True
        return self.runner.subscribed(self.session_id, event_type)

    @property
    def turn_id(self) -> str:
        """The hex id shared by this turn's events (made when the first event needs it)."""
        if self._turn_id is None:
            self._turn_id = uuid.uuid4().hex
        return self._turn_id

    async def append(self, message: Message) -> None:
        self.session.add_message(message)
        if self.wants("message_appended"):
            await self.emit(MessageAppended(
                session_id=self.session.session_id, turn_id=self.turn_id, message=message,
                agent_name=self.session.active_agent.name, index=self.count,
            ))
        self.count += 1


class Runner:
    """Runs turns for ``starting_agent`` and every agent reachable through its handoffs.

    ``session_store`` defaults to an in-memory ``SessionStore``; ``engine`` is the default for
    agents that name no engine, provider or base URL of their own (see ``resolve_engine``).
    ``prices`` prices each model call's usage when the turn runs (default:
    ``PriceBook.from_env()``, genai-prices with the ``CHATFLOW_MODEL_PRICES`` overrides); the
    turn's usage is ``AgentResponse.usage`` and ``usage`` of ``TurnCompleted`` / ``TurnFailed``.

    ``turn_gate`` is consulted at the start of every turn (unless the run passes a gate of its own),
    ``on_human_request`` called when an agent calls the built-in ``request_human`` tool, whose turn then
    ends with ``human_request_reply`` as its answer, the host application's words (see
    ``chatflow_agent.core.gate``); without one (None) the model answers after the tool's result, as after
    any tool. All three are attributes and may be set after construction.
    """

    def __init__(
        self,
        starting_agent: Agent,
        session_store: BaseSessionStore | None = None,
        engine: BaseEngine | None = None,
        api_key: str | None = None,
        max_handoffs_per_turn: int = 5,
        max_tool_iterations: int = 10,
        prices: PriceBook | None = None,
        turn_gate: TurnGate | None = None,
        on_human_request: HumanRequestHook | None = None,
        human_request_reply: str | None = None,
    ) -> None:
        self.starting_agent = starting_agent
        self.session_store: BaseSessionStore = session_store if session_store is not None else SessionStore()
        if engine is None and api_key is not None:
            from chatflow_agent.core.engines import GeminiEngine

            engine = GeminiEngine(api_key=api_key)
        self.engine = engine
        self.max_handoffs_per_turn = max_handoffs_per_turn
        self.max_tool_iterations = max_tool_iterations
        self.prices = prices if prices is not None else PriceBook.from_env()
        self.turn_gate = turn_gate
        self.on_human_request = on_human_request
        self.human_request_reply = human_request_reply
        self._agents_registry: dict[str, Agent] = {}
        self._subscribers: list[tuple[Subscriber, _Wants | None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._register_agent_tree(starting_agent)
        if hasattr(self.session_store, "set_agent_resolver"):
            self.session_store.set_agent_resolver(self._agents_registry.get)

    # ---- agents ---------------------------------------------------------------------------
    def _register_agent_tree(self, root: Agent) -> None:
        pending = [root]
        while pending:
            agent = pending.pop()
            if agent.name in self._agents_registry:
                continue
            self._agents_registry[agent.name] = agent
            pending.extend(agent.handoffs)

    def register_agent(self, agent: Agent) -> None:
        """Register ``agent`` (and the agents it hands off to) with this Runner."""
        self._register_agent_tree(agent)

    @property
    def agents(self) -> dict[str, Agent]:
        """Registered agents by name (a copy)."""
        return dict(self._agents_registry)

    def get_session(self, session_id: str) -> SessionContext | None:
        return self.session_store.get(session_id)

    # ---- events ---------------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber(event)`` (sync or async) for every event of every run; returns an
        unsubscribe function. A subscriber that raises is logged and does not fail the turn.

        A subscriber with a ``wants(session_id, event_type) -> bool`` method (``event_type``: a
        ``RunEvent.type``) is asked before each event is built; when it and every other subscriber
        decline (and nobody streams the turn), the event is not built at all. It may still be called
        with events it declined, when another receiver wanted them. ``wants`` must be cheap and must
        not raise."""
        entry = (subscriber, getattr(subscriber, "wants", None))
        self._subscribers.append(entry)
        return lambda: self._subscribers.remove(entry) if entry in self._subscribers else None

    def subscribed(self, session_id: str, event_type: str) -> bool:
        """True when a subscriber of every run takes events of ``event_type`` (a ``RunEvent.type``) of
        ``session_id``'s turns: it has no ``wants`` method, or its ``wants`` does not decline them."""
        for _, wants in self._subscribers:
            if wants is None or wants(session_id, event_type):
                return True
        return False

    async def _publish(self, event: RunEvent) -> None:
        for subscriber, _ in list(self._subscribers):
            try:
                result = subscriber(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("Run event subscriber %r failed on %s", subscriber, event.type)

    # ---- running --------------------------------------------------------------------------
    async def run_async(self, session_id: str, user_message: str, metadata: dict[str, Any] | None = None,
                        *, starting_agent: Agent | None = None,
                        turn_metadata: dict[str, Any] | None = None,
                        report: TurnReport | None = None,
                        turn_gate: TurnGate | None = None,
                        hooks: TurnHooks | None = None) -> AgentResponse:
        """Play one turn and return the answer. Raises what the engine or store raised (the turn
        is then rolled back), ``SessionDeletedError`` if the session is deleted meanwhile.
        ``starting_agent``, ``metadata``, ``turn_metadata``, ``report``, ``turn_gate`` and ``hooks``: as for
        :meth:`run_streamed`."""
        return await self._execute(session_id, user_message, metadata, self._publish, streamed=False,
                                   starting_agent=starting_agent, turn_metadata=turn_metadata, report=report,
                                   turn_gate=turn_gate, hooks=hooks)

    async def run_streamed(
        self, session_id: str, user_message: str, metadata: dict[str, Any] | None = None,
        *, starting_agent: Agent | None = None, turn_metadata: dict[str, Any] | None = None,
        report: TurnReport | None = None, turn_gate: TurnGate | None = None, hooks: TurnHooks | None = None,
    ) -> AsyncIterator[RunEvent]:
        """Play one turn, yielding its run events as they happen (ending with ``TurnCompleted``
        or ``TurnFailed``; the error is then re-raised). Subscribers get the events too. If the
        consumer stops early, the turn still runs to its end.

        A session the turn creates starts with ``starting_agent`` (one of this Runner's agents;
        default: the Runner's own) and ``metadata``, both written with the turn's commit: a turn
        that fails leaves no session behind. An existing session keeps its agent and metadata.

        ``turn_metadata`` (JSON-safe keys and values) is merged into the session's metadata by the
        turn itself, under its lock, and written with its commit: it is stored if and only if the
        turn's messages are (a webhook worker records which delivery a turn played this way).

        ``report`` (a ``chatflow_agent.core.reports.TurnReport``; default: a new one): the turn's
        record, filled as it runs (agent trail, model and tool calls, times, final status) and
        handed to the store, whose backend may keep it (the site's turn records). A caller sets
        ``source``, ``queue_wait_ms`` or ``trace_id`` on it beforehand and may read it afterwards.

        ``turn_gate`` (see ``chatflow_agent.core.gate``): this turn's gate, consulted instead of the
        Runner's own ``turn_gate`` (for a turn its caller decides differently, say a message with a fixed
        answer that must reach no model).

        ``hooks`` (a ``chatflow_agent.core.hooks.TurnHooks``; default: a new, empty one): this turn's commit
        hooks, handed to the store's ``turn`` and called inside its commit's transaction (one that raises
        refuses the commit: the turn fails, rolled back). The gate's decision (``TurnDecision.on_commit``)
        and ``on_human_request`` add theirs to it; a caller may read it afterwards."""
        queue: asyncio.Queue[RunEvent | None] = asyncio.Queue()

        async def emit(event: RunEvent) -> None:
            queue.put_nowait(event)
            await self._publish(event)

        task = asyncio.ensure_future(self._execute(session_id, user_message, metadata, emit, streamed=True,
                                                   starting_agent=starting_agent, turn_metadata=turn_metadata,
                                                   report=report, turn_gate=turn_gate, hooks=hooks))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        while (event := await queue.get()) is not None:
            yield event
        task.result()

    def run(self, session_id: str, user_message: str, metadata: dict[str, Any] | None = None) -> AgentResponse:
        """Blocking form of :meth:`run_async` for code without a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_async(session_id, user_message, metadata))
        raise RuntimeError(
            "Runner.run() cannot be called from a running event loop; use 'await runner.run_async(...)' instead."
        )

    async def _execute(self, session_id: str, user_message: str, metadata: dict[str, Any] | None, emit: _Emit,
                       *, streamed: bool, starting_agent: Agent | None = None,
                       turn_metadata: dict[str, Any] | None = None,
                       report: TurnReport | None = None, turn_gate: TurnGate | None = None,
                       hooks: TurnHooks | None = None) -> AgentResponse:
        turn = _Turn(self, session_id, emit, streamed, report, turn_gate, hooks)
        turn.report.user_text = user_message
        started = time.perf_counter()
        try:
            async with self.session_store.turn(session_id, starting_agent or self.starting_agent, metadata,
                                               report=turn.report, hooks=turn.hooks) as session:
                turn.session = session
                if turn_metadata:
                    session.metadata.update(turn_metadata)
                response = turn.report.response = await self._play(turn, user_message)
        except BaseException as err:
            committed = getattr(getattr(turn, "session", None), "turn_committed", False)
            if isinstance(err, asyncio.CancelledError) and committed:
                if turn.wants("turn_completed"):  # cancelled while the commit was written: the turn is kept
                    await self._completed(turn, emit, response, started)
                raise
            if turn.wants("turn_failed"):
                await emit(TurnFailed(session_id=session_id, turn_id=turn.turn_id, error_type=type(err).__name__,
                                      error=str(err) or type(err).__name__, usage=turn.usage))
            raise
        if turn.wants("turn_completed"):
            await self._completed(turn, emit, response, started)
        return response

    @staticmethod
    async def _completed(turn: _Turn, emit: _Emit, response: AgentResponse, started: float) -> None:
        session = turn.session
        row_id = turn.runner.session_store.message_row_id
        ids = tuple(rid for m in session.history[-turn.count:] if (rid := row_id(session, m)) is not None)
        await emit(TurnCompleted(session_id=session.session_id, turn_id=turn.turn_id, response=response,
                                 duration_ms=(time.perf_counter() - started) * 1000, message_ids=ids,
                                 usage=response.usage or turn.usage))

    async def _play(self, turn: _Turn, user_message: str) -> AgentResponse:
        session = turn.session
        agent = session.active_agent
        if isinstance(agent, PlaceholderAgent) or agent.name not in self._agents_registry:
            logger.warning("Session %r names unknown agent %r; continuing with %r",
                           session.session_id, agent.name, self.starting_agent.name)
            session.active_agent = self.starting_agent
        turn.report.add_agent(session.active_agent.name)
        if turn.wants("turn_started"):
            await turn.emit(TurnStarted(session_id=session.session_id, turn_id=turn.turn_id,
                                        agent_name=session.active_agent.name, user_message=user_message))
        decision = await self._consult_gate(turn.gate, session, user_message)
        await turn.append(Message(role=Role.USER, content=user_message))
        if decision is not None:
            if decision.on_commit is not None:
                turn.hooks.add(decision.on_commit)
            turn.instructions = decision.instructions or None
            turn.human_requested = decision.human_requested
            if decision.hold:
                if decision.reply is not None:
                    await turn.append(Message(role=Role.MODEL, content=decision.reply))
                return self._response(turn, decision.reply or "", held=True)
        for _ in range(self.max_tool_iterations):
            agent = session.active_agent
            result = await self._generate(turn, agent)
            if not result.has_tool_calls:
                text = result.text or ""
                await turn.append(Message(role=Role.MODEL, content=text))
                return self._response(turn, text)
            await turn.append(Message(role=Role.MODEL, content=result.text, tool_calls=result.tool_calls))
            results = await self._run_tools(turn, agent, result.tool_calls)
            await turn.append(Message(role=Role.TOOL, tool_results=results))
            reply = self.human_request_reply
            if reply is not None and turn.human_requested is not None and any(
                    r.name == REQUEST_HUMAN and not r.is_error for r in results):
                await turn.append(Message(role=Role.MODEL, content=reply))
                return self._response(turn, reply)
        text = f"Execution iteration limit reached by agent '{session.active_agent.name}'."
        await turn.append(Message(role=Role.MODEL, content=text))
        return self._response(turn, text)

    def _response(self, turn: _Turn, text: str, *, held: bool = False) -> AgentResponse:
        return AgentResponse(content=text, active_agent_name=turn.session.active_agent.name,
                             tool_calls_executed=turn.tools_executed, handoff=turn.last_handoff, usage=turn.usage,
                             held=held, human_requested=turn.human_requested)

    @staticmethod
    async def _consult_gate(gate: TurnGate | None, session: SessionContext, user_message: str) -> TurnDecision | None:
        if gate is None:
            return None
        decision = gate(session, user_message)
        if inspect.isawaitable(decision):
            decision = await decision
        return decision

    async def _generate(self, turn: _Turn, agent: Agent) -> Any:
        engine = resolve_engine(agent, default_engine=self.engine)
        history = engine_view(turn.session.history)
        if turn.instructions:
            at = next((i for i, m in enumerate(history) if m.role != Role.SYSTEM), len(history))
            history.insert(at, Message(role=Role.SYSTEM, content=turn.instructions))
        stream = _streaming_method(engine)
        try:
            if stream is None:
                result = await engine.generate_turn_async(agent=agent, history=history)
            else:
                async def on_delta(text: str) -> None:
                    if turn.wants("text_delta"):
                        await turn.emit(TextDelta(session_id=turn.session.session_id, turn_id=turn.turn_id,
                                                  text=text, agent_name=agent.name))

                result = await stream(agent, history, on_delta)
        except BaseException:
            # The call did not return (an error, a cancellation, a timeout): what it used is unknown.
            turn.calls.append(_unreported_call(engine, agent))
            raise
        usage = getattr(result, "usage", None)
        if not isinstance(usage, ModelCallUsage):  # an engine that reports no usage: the call's is unknown
            usage = _unreported_call(engine, agent)
        # Priced now: the cost is the one at the time of the turn.
        turn.calls.append(self.prices.priced(usage, agent.model, agent_name=agent.name))
        return result

    async def _run_tools(self, turn: _Turn, agent: Agent, calls: list[ToolCall]) -> list[ToolResult]:
        available = {t.name: t for t in agent.get_all_tools()}
        results: list[ToolResult] = []
        limit_hit = False
        for call in calls:
            if turn.wants("tool_call_started"):
                await turn.emit(ToolCallStarted(session_id=turn.session.session_id, turn_id=turn.turn_id,
                                                call=call, agent_name=agent.name))
            started = time.perf_counter()
            handoffs, skipped = turn.handoffs, limit_hit
            if limit_hit:
                result = ToolResult(tool_call_id=call.id, name=call.name, is_error=True,
                                    content="Skipped: maximum agent transfers exceeded for a single turn.")
            else:
                turn.tools_executed.append(call.name)
                result = await self._run_tool(turn, agent, available, call)
                limit_hit = result.is_error and result.content == _HANDOFF_LIMIT
            results.append(result)
            duration_ms = (time.perf_counter() - started) * 1000
            turn.report.tools.append(ToolCallReport(call.name, duration_ms, _outcome(skipped, result, handoffs,
                                                                                     turn.handoffs)))
            if turn.wants("tool_call_finished"):
                await turn.emit(ToolCallFinished(session_id=turn.session.session_id, turn_id=turn.turn_id,
                                                 result=result, agent_name=agent.name, duration_ms=duration_ms))
        return results

    async def _run_tool(self, turn: _Turn, agent: Agent, available: dict[str, Any], call: ToolCall) -> ToolResult:
        tool = available.get(call.name)
        if tool is None:
            return ToolResult(tool_call_id=call.id, name=call.name, is_error=True,
                              content=f"Error: Tool '{call.name}' not found on agent '{agent.name}'.")
        try:
            output = await tool.execute_async(**call.args)
        except Exception as err:
            trace_id = str(uuid.uuid4())
            logger.error("Tool execution failed [trace_id: %s] - Tool: '%s' on agent '%s': %s",
                         trace_id, call.name, agent.name, err, exc_info=True)
            return ToolResult(tool_call_id=call.id, name=call.name, is_error=True,
                              content=f"Tool execution failed [trace_id: {trace_id}]. "
                                      "Please try a different approach or inform the user.")
        if isinstance(output, HumanRequest):
            return await self._human_request(turn, call, output)
        if not isinstance(output, Handoff):
            return ToolResult(tool_call_id=call.id, name=call.name, content=output)
        return await self._handoff(turn, call, output)

    async def _handoff(self, turn: _Turn, call: ToolCall, handoff: Handoff) -> ToolResult:
        target = self._agents_registry.get(handoff.target_agent_name)
        if target is None:
            raise AgentHandoffError(f"Handoff target agent '{handoff.target_agent_name}' is not registered in Runner.")
        if turn.handoffs >= self.max_handoffs_per_turn:
            return ToolResult(tool_call_id=call.id, name=call.name, is_error=True, content=_HANDOFF_LIMIT)
        session = turn.session
        previous = session.active_agent
        session.active_agent = target
        if handoff.context_updates:
            session.metadata.update(handoff.context_updates)
        turn.handoffs += 1
        turn.last_handoff = handoff
        turn.report.add_agent(target.name)
        if turn.wants("handoff"):
            await turn.emit(HandoffOccurred(session_id=session.session_id, turn_id=turn.turn_id,
                                            from_agent=previous.name, to_agent=target.name, handoff=handoff))
        return ToolResult(tool_call_id=call.id, name=call.name, content={
            "status": "HANDOFF_SUCCESS", "transferred_from": previous.name, "transferred_to": target.name,
            "reason": handoff.reason or "Specialist routing",
        })

    async def _human_request(self, turn: _Turn, call: ToolCall, request: HumanRequest) -> ToolResult:
        turn.human_requested = request.reason or "The agent asked for a person."
        hook = self.on_human_request
        if hook is not None:
            result = hook(turn.session, turn.human_requested)
            if inspect.isawaitable(result):
                result = await result
            if callable(result):  # what the request writes when the turn commits
                turn.hooks.add(result)
            elif result is not None:  # a hook written before hooks could return one: its value means nothing here
                logger.warning("on_human_request returned %s, not a commit hook: ignored", type(result).__name__)
        return ToolResult(tool_call_id=call.id, name=call.name,
                          content={"status": "HUMAN_REQUESTED", "reason": turn.human_requested})

    def __repr__(self) -> str:
        return f"<Runner starting_agent={self.starting_agent.name!r} registered_agents={list(self._agents_registry)}>"


_HANDOFF_LIMIT = "Maximum agent transfers exceeded for a single turn."


def _outcome(skipped: bool, result: ToolResult, handoffs_before: int, handoffs_after: int) -> str:
    """A tool call's ``ToolCallReport.outcome``."""
    if skipped:
        return "skipped"
    if result.is_error:
        return "error"
    return "handoff" if handoffs_after > handoffs_before else "ok"


def _unreported_call(engine: BaseEngine, agent: Agent) -> ModelCallUsage:
    """A model call whose usage nobody reported: its token counts and cost are unknown (None)."""
    provider = getattr(engine, "provider", None)
    return ModelCallUsage(provider=provider if isinstance(provider, str) else None, model=agent.model,
                          agent_name=agent.name)


def _streaming_method(engine: Any) -> Any:
    """``engine.stream_turn_async`` unless ``generate_turn_async`` was overridden below it.

    A 0.3.4-style engine subclasses a provider engine (or patches the instance) and overrides
    only ``generate_turn_async``; the inherited streaming method would bypass that override.
    """
    stream = getattr(engine, "stream_turn_async", None)
    if stream is None or "generate_turn_async" in getattr(engine, "__dict__", {}):
        return None
    mro = type(engine).__mro__
    generate_owner = next((k for k in mro if "generate_turn_async" in vars(k)), None)
    stream_owner = next((k for k in mro if "stream_turn_async" in vars(k)), None)
    if generate_owner is not None and stream_owner is not None and not issubclass(stream_owner, generate_owner):
        return None
    return stream
