"""OpenTelemetry traces of webhook turns (optional): on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the
SDK is installed (``requirements-otel.txt``); every function here is a no-op otherwise.

One trace per inbound message, spans named and attributed after OpenTelemetry's GenAI semantic
conventions (``gen_ai.*``; development status, as of semantic conventions 1.37)::

    webhook <provider>                 SERVER    the acknowledgement (claim + enqueue), the trace's root
    ├── queue wait                     INTERNAL  delivery first seen → claimed by a worker
    ├── lease wait                     INTERNAL  claimed → the session's lease held (the turn starts)
    ├── invoke_agent <agent>           INTERNAL  the turn; gen_ai.conversation.id = the session id
    │   ├── chat <model>               CLIENT    one per model call: gen_ai.usage.*, finish reasons
    │   └── execute_tool <tool>        INTERNAL  one per tool call
    └── reply send                     CLIENT    the reply to the provider's API

The context travels from the webhook to the worker in the delivery's ``DeliveryTrace`` row (a W3C
``traceparent``); the turn's spans come from the site Runner's run events (a subscriber, so the
runtime knows nothing of OpenTelemetry); model-call spans end when their message is appended and
start ``latency_ms`` earlier. The trace id is stored in the turn's record (``TurnRecord.trace_id``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import wraps
from typing import Any

from django.conf import settings

from sessions_app import runtime
from webhooks_app.models import DeliveryTrace

logger = logging.getLogger("webhooks_app.tracing")

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the optional dependency is not installed: tracing stays off
    trace = None  # type: ignore[assignment]

__all__ = ["available", "configure_from_settings", "use", "enabled", "acknowledging", "remember", "enter",
           "leave", "current_trace_id", "reply_span", "on_run_event"]

SCOPE = "chatflow"
_tracer: Any = None
_propagator: Any = TraceContextTextMapPropagator() if trace is not None else None


def available() -> bool:
    """True when the OpenTelemetry API and SDK are importable."""
    if trace is None:
        return False
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def enabled() -> bool:
    return _tracer is not None


def use(provider: Any) -> None:
    """Trace with ``provider`` (an SDK ``TracerProvider``; None turns tracing off); subscribes to the site
    Runner's run events once."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer(SCOPE)
    if provider is not None:
        runtime.subscribe(on_run_event)


def configure_from_settings() -> None:
    """With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: batch-export spans over OTLP/HTTP (the exporter reads the
    endpoint and the other ``OTEL_*`` variables itself). A missing SDK is logged once, not raised."""
    if not settings.OTEL_EXPORTER_OTLP_ENDPOINT or enabled():
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed "
                       "(pip install -r requirements-otel.txt): no traces")
        return
    provider = TracerProvider(resource=Resource.create({"service.name": "chatflow-console"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use(provider)


# ---- the webhook: acknowledgement and the context carried in the delivery ------------------------
@contextlib.contextmanager
def acknowledging(messages: list[Any]) -> Iterator[list[Any]]:
    """Around a webhook's accept: one root span per message (``inbox.Inbound``); yields the messages with
    their ``traceparent`` set (unchanged when tracing is off)."""
    if _tracer is None or not messages:
        yield messages
        return
    spans = [_tracer.start_span(f"webhook {m.provider}", kind=SpanKind.SERVER, context=otel_context.Context(),
                                attributes={"messaging.system": m.provider, "messaging.message.id":
                                            m.provider_message_id, "gen_ai.conversation.id": m.session_id})
             for m in messages]
    carried = []
    for message, span in zip(messages, spans, strict=True):
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, context=trace.set_span_in_context(span))
        carried.append(replace(message, traceparent=carrier.get("traceparent", "")))
    try:
        yield carried
    except BaseException as err:
        for span in spans:
            span.record_exception(err)
            span.set_status(Status(StatusCode.ERROR, type(err).__name__))
        raise
    finally:
        for span in spans:
            span.end()


def remember(delivery_id: int, traceparent: str) -> None:
    """Store a delivery's trace context (inside the inbox's transaction); nothing without one."""
    if traceparent:
        DeliveryTrace.objects.update_or_create(delivery_id=delivery_id, defaults={"traceparent": traceparent})


def _traceparent_of(delivery_id: int) -> str:
    return DeliveryTrace.objects.filter(delivery_id=delivery_id).values_list("traceparent", flat=True).first() or ""


# ---- the worker: queue wait, the current context while the delivery plays ------------------------
@dataclass
class _Playing:
    token: Any
    claimed_ns: int


async def enter(delivery: Any, db: Callable[..., Awaitable[Any]]) -> _Playing | None:
    """In the worker's task for ``delivery``: the queue wait span, then the delivery's trace as the current
    context until :func:`leave`. ``db(fn, *args)`` runs ``fn`` on the worker's database thread."""
    if _tracer is None:
        return None
    claimed = time.time_ns()
    traceparent = await db(_traceparent_of, delivery.pk)
    parent = _propagator.extract({"traceparent": traceparent}, context=otel_context.Context())
    wait = _tracer.start_span("queue wait", context=parent, start_time=int(delivery.first_seen.timestamp() * 1e9),
                              attributes={"messaging.message.id": delivery.provider_message_id,
                                          "chatflow.delivery.attempt": delivery.attempts})
    wait.end(end_time=claimed)
    return _Playing(otel_context.attach(otel_context.set_value(_CLAIMED, claimed, parent)), claimed)


def leave(playing: _Playing | None) -> None:
    """End what :func:`enter` began (in the same task)."""
    if playing is not None:
        otel_context.detach(playing.token)


_CLAIMED = "chatflow.claimed_ns"


def current_trace_id() -> str:
    """The current trace's id (32 hex digits), "" when none (tracing off, or outside a traced delivery)."""
    if _tracer is None:
        return ""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


def reply_span(send: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Decorator for ``replies.send(client, delivery, text)``: a ``reply send`` span inside a traced delivery."""
    @wraps(send)
    async def traced(client: Any, delivery: Any, text: str) -> Any:
        if _tracer is None or not trace.get_current_span().get_span_context().is_valid:
            return await send(client, delivery, text)
        with _tracer.start_as_current_span("reply send", kind=SpanKind.CLIENT,
                                           attributes={"messaging.system": delivery.provider}):
            return await send(client, delivery, text)
    return traced


# ---- the turn: spans from the site Runner's run events --------------------------------------------
@dataclass
class _Turn:
    span: Any
    model_ends: list[int] = field(default_factory=list)
    tools: dict[str, Any] = field(default_factory=dict)


_turns: dict[str, _Turn] = {}


def on_run_event(event: Any) -> None:
    """Run event subscriber (the site Runner's): opens and closes the turn's spans (see the module docstring).
    Called in the turn's own task, so the current context is the delivery's trace."""
    if _tracer is None:
        return
    kind = event.type
    if kind == "turn_started":
        _turn_started(event)
        return
    turn = _turns.get(event.turn_id)
    if turn is None:
        return
    if kind == "tool_call_started":
        ctx = trace.set_span_in_context(turn.span)
        turn.tools[event.call.id] = _tracer.start_span(
            f"execute_tool {event.call.name}", context=ctx,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.call.name,
                        "gen_ai.tool.call.id": event.call.id, "gen_ai.agent.name": event.agent_name})
    elif kind == "tool_call_finished":
        span = turn.tools.pop(event.result.tool_call_id, None)
        if span is not None:
            if event.result.is_error:
                span.set_status(Status(StatusCode.ERROR, "tool error"))
                span.set_attribute("error.type", "tool_error")
            span.end()
    elif kind == "message_appended" and event.message.role.value == "model":
        turn.model_ends.append(time.time_ns())
    elif kind in ("turn_completed", "turn_failed"):
        _turn_ended(_turns.pop(event.turn_id), event)


def _turn_started(event: Any) -> None:
    now = time.time_ns()
    current = otel_context.get_current()
    claimed = otel_context.get_value(_CLAIMED, current)
    if isinstance(claimed, int):
        _tracer.start_span("lease wait", context=current, start_time=claimed,
                           attributes={"gen_ai.conversation.id": event.session_id}).end(end_time=now)
    span = _tracer.start_span(f"invoke_agent {event.agent_name}", context=current, start_time=now, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": event.agent_name,
        "gen_ai.conversation.id": event.session_id})
    _turns[event.turn_id] = _Turn(span)


def _turn_ended(turn: _Turn, event: Any) -> None:
    now = time.time_ns()
    ctx = trace.set_span_in_context(turn.span)
    for i, call in enumerate(event.usage.calls):
        end = turn.model_ends[i] if i < len(turn.model_ends) else now
        start = end - int((call.latency_ms or 0) * 1e6)
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": call.provider or "",
                      "gen_ai.request.model": call.model or "", "gen_ai.response.model": call.model or ""}
        for name, value in (("gen_ai.usage.input_tokens", call.input_tokens),
                            ("gen_ai.usage.output_tokens", call.output_tokens),
                            ("gen_ai.usage.cache_read.input_tokens", call.cached_tokens)):
            if value is not None:
                attributes[name] = value
        if call.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [call.finish_reason]
        if call.agent_name:
            attributes["gen_ai.agent.name"] = call.agent_name
        _tracer.start_span(f"chat {call.model or 'model'}", kind=SpanKind.CLIENT, context=ctx, start_time=start,
                           attributes=attributes).end(end_time=end)
    for span in turn.tools.values():  # a tool call cut short by the failure
        span.end(end_time=now)
    if event.type == "turn_failed":
        turn.span.set_status(Status(StatusCode.ERROR, event.error[:200]))
        turn.span.set_attribute("error.type", event.error_type)
    turn.span.end(end_time=now)
