"""OpenTelemetry: one webhook message gives one trace — acknowledgement, queue wait, lease wait, the turn, its
model and tool calls, the reply — parented as documented, with GenAI semantic-convention attributes."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the optional OpenTelemetry SDK is not installed")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from tests.sessions_app import personas  # noqa: E402
from tests.webhooks_app import payloads as p  # noqa: E402
from tests.webhooks_app.fakes import FakeProviderAPI  # noqa: E402
from tests.webhooks_app.test_endpoints import post_generic, post_wa  # noqa: E402
from turns_app.models import TurnRecord  # noqa: E402
from webhooks_app import tracing  # noqa: E402
from webhooks_app.models import DeliveryTrace, InboundDelivery  # noqa: E402
from webhooks_app.worker import Worker  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans(settings):
    settings.CHATFLOW_AGENTS = "tests.health_app.agents.build"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    with FakeProviderAPI() as wa:
        settings.WHATSAPP_API_BASE = wa.base
        yield exporter, wa
    tracing.use(None)
    provider.shutdown()


def drain() -> int:
    return asyncio.run(Worker(slots=1, poll=0.05).run(drain=True))


def test_one_webhook_message_gives_one_trace_with_every_span_parented(client, spans):
    exporter, wa = spans
    assert post_wa(client, p.whatsapp(p.wa_text("wamid.T1", "Where is order 404?"))).status_code == 200
    assert drain() == 1
    assert [b["text"]["body"] for b in wa.bodies()] == ["Order 404 has shipped."]
    finished = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in finished}) == 1
    by_name = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    assert sorted(by_name) == ["chat clerk-1", "execute_tool lookup_order", "invoke_agent Clerk", "lease wait",
                               "queue wait", "reply send", "webhook whatsapp"]
    (root,) = by_name["webhook whatsapp"]
    (turn,) = by_name["invoke_agent Clerk"]
    assert root.parent is None and root.kind.name == "SERVER"
    for name in ("queue wait", "lease wait", "invoke_agent Clerk", "reply send"):
        assert [s.parent.span_id for s in by_name[name]] == [root.context.span_id], name
    chats = sorted(by_name["chat clerk-1"], key=lambda s: s.start_time)
    assert [s.parent.span_id for s in chats] == [turn.context.span_id] * 2
    (tool_span,) = by_name["execute_tool lookup_order"]
    assert tool_span.parent.span_id == turn.context.span_id

    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.name"] == "Clerk"
    assert turn.attributes["gen_ai.conversation.id"] == "15550100"
    first, second = chats
    assert dict(first.attributes) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "scripted", "gen_ai.request.model": "clerk-1",
        "gen_ai.response.model": "clerk-1", "gen_ai.usage.input_tokens": 20, "gen_ai.usage.output_tokens": 4,
        "gen_ai.usage.cache_read.input_tokens": 0, "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.agent.name": "Clerk"}
    assert second.attributes["gen_ai.usage.input_tokens"] == 30
    assert first.end_time <= tool_span.start_time <= tool_span.end_time <= second.end_time
    assert tool_span.attributes["gen_ai.tool.name"] == "lookup_order"
    (queue_wait,) = by_name["queue wait"]
    (lease_wait,) = by_name["lease wait"]
    assert queue_wait.end_time <= lease_wait.end_time <= turn.start_time <= turn.end_time
    (reply,) = by_name["reply send"]
    assert turn.end_time <= reply.start_time

    (record,) = TurnRecord.objects.all()
    assert (record.status, record.trace_id) == ("completed", format(root.context.trace_id, "032x"))
    page = personas.client_for(personas.viewer()).get("/sessions/15550100/").content.decode()
    assert f"trace <code>{record.trace_id}</code>" in page  # the turn header in the console
    delivery = InboundDelivery.objects.get()
    assert DeliveryTrace.objects.get(delivery=delivery).traceparent.split("-")[1] == format(root.context.trace_id,
                                                                                             "032x")


def test_two_messages_of_one_payload_are_two_traces(client, spans):
    exporter, _ = spans
    post_wa(client, p.whatsapp(p.wa_text("wamid.T2", "one"), p.wa_text("wamid.T3", "two")))
    assert drain() == 2
    finished = exporter.get_finished_spans()
    roots = [s for s in finished if s.parent is None]
    assert sorted(s.attributes["messaging.message.id"] for s in roots) == ["wamid.T2", "wamid.T3"]
    for root in roots:
        names = sorted(s.name for s in finished if s.context.trace_id == root.context.trace_id)
        assert names == ["chat clerk-1", "chat clerk-1", "execute_tool lookup_order", "invoke_agent Clerk",
                         "lease wait", "queue wait", "reply send", "webhook whatsapp"]


def test_without_tracing_nothing_is_stored_or_traced(client, settings):
    settings.CHATFLOW_AGENTS = "tests.health_app.agents.build"
    assert not tracing.enabled()
    post_generic(client, p.generic("untraced", "g-4", "hi"))  # generic: no reply is sent
    assert not DeliveryTrace.objects.exists()
    assert tracing.current_trace_id() == ""
    assert drain() == 1
    assert list(TurnRecord.objects.values_list("status", "trace_id")) == [("completed", "")]
