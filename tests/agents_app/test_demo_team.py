"""The demo team and the agent registry built from CHATFLOW_AGENTS."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from agents_app.demo_team import build, check_order_status, diagnose_device, get_invoice, refund_order
from sessions_app import registry


def test_support_starts_and_hands_off_to_billing_and_tech_who_hand_back():
    support = build()

    assert support.name == "Support"
    assert support.model == "demo"
    assert [t.name for t in support.tools] == ["check_order_status", "request_human"]  # the built-in takeover tool
    peers = {agent.name: agent for agent in support.handoffs}
    assert set(peers) == {"Billing", "Tech"}
    assert [t.name for t in peers["Billing"].tools] == ["refund_order", "get_invoice"]
    assert [t.name for t in peers["Tech"].tools] == ["diagnose_device"]
    assert [a.name for a in peers["Billing"].handoffs] == ["Support"]
    assert [a.name for a in peers["Tech"].handoffs] == ["Support"]
    tools = {t.name for t in support.get_all_tools()}
    assert tools == {"check_order_status", "request_human", "transfer_to_billing", "transfer_to_tech"}


def test_the_tools_answer_deterministically():
    assert check_order_status.execute(order_id="A-1001") == check_order_status.execute(order_id="A-1001")
    assert check_order_status.execute(order_id="A-1001")["status"]
    assert get_invoice.execute(invoice_id="INV-42") == get_invoice.execute(invoice_id="INV-42")
    first = diagnose_device.execute(device="Router", symptom="no wifi")
    again = diagnose_device.execute(device="router", symptom="No WiFi")
    assert (first["advice"], first["needs_repair"]) == (again["advice"], again["needs_repair"])


def test_a_refund_is_full_without_an_amount_and_refused_beyond_the_order_total():
    full = refund_order.execute(order_id="A-1001")
    assert full["refunded"] is True

    assert refund_order.execute(order_id="A-1001", amount=full["amount"] + 1)["refunded"] is False
    assert refund_order.execute(order_id="A-1001", amount=1.5)["amount"] == 1.5


def test_the_tool_schemas_describe_their_parameters():
    schema = refund_order.json_schema

    assert schema["required"] == ["order_id"]
    assert set(schema["properties"]) == {"order_id", "amount"}


def test_the_registry_walks_the_handoff_graph_from_the_starting_agent():
    assert list(registry.agents()) == ["Support", "Billing", "Tech"]
    assert registry.get_agent("Tech").name == "Tech"
    assert registry.get_agent("Nobody") is None


def test_the_registry_follows_the_setting(settings):
    settings.CHATFLOW_AGENTS = "tests.agents_app.test_demo_team.solo_agent"

    assert list(registry.agents()) == ["Solo"]


def test_a_factory_that_returns_no_agent_is_a_configuration_error(settings):
    settings.CHATFLOW_AGENTS = "tests.agents_app.test_demo_team.not_an_agent"

    with pytest.raises(ImproperlyConfigured, match="CHATFLOW_AGENTS"):
        registry.starting_agent()


def solo_agent():
    from chatflow_agent.core.agent import Agent

    return Agent(name="Solo", instructions="Alone.", model="demo")


def not_an_agent():
    return "Support"
