"""Agent: instructions, @agent.tool, handoff tools and their names."""

from __future__ import annotations

import pytest

from chatflow_agent import Agent, Handoff, Tool
from chatflow_agent.core.agent import handoff_tool_name


@pytest.mark.parametrize(
    ("agent_name", "tool_name"),
    [
        ("Billing Team!", "transfer_to_billing_team"),
        ("billing", "transfer_to_billing"),
        ("  Tech--Support / L2  ", "transfer_to_tech_support_l2"),
        ("VIP_Desk", "transfer_to_vip_desk"),
        ("Agent 007", "transfer_to_agent_007"),
    ],
)
def test_handoff_tools_are_named_transfer_to_the_sanitised_agent_name(agent_name: str, tool_name: str) -> None:
    assert handoff_tool_name(agent_name) == tool_name
    front = Agent(name="Front", instructions="Route.", handoffs=[Agent(name=agent_name, instructions="x")])
    assert [t.name for t in front.get_all_tools()] == [tool_name]


def test_handing_off_to_itself_is_refused() -> None:
    agent = Agent(name="Loop", instructions="x")
    with pytest.raises(ValueError, match="itself"):
        agent.add_handoff(agent)
    with pytest.raises(ValueError, match="itself"):
        agent.add_handoff(Agent(name="Loop", instructions="a namesake is the same agent"))
    assert agent.handoffs == []


def test_the_handoff_tool_returns_a_handoff_to_its_target() -> None:
    billing = Agent(name="Billing Team", instructions="Handles invoices and refunds.")
    front = Agent(name="Front", instructions="Route.", handoffs=[billing])
    (transfer,) = front.get_all_tools()
    result = transfer.execute(reason="invoice question")
    assert result == Handoff(target_agent_name="Billing Team", reason="invoice question")
    assert "Handles invoices and refunds." in transfer.description
    assert transfer.json_schema["required"] == []


def test_agent_tool_decorator_registers_the_tool_bare_and_with_options() -> None:
    agent = Agent(name="Orders", instructions="x")

    @agent.tool
    def check_order_status(order_id: str) -> str:
        """Check an order."""
        return order_id

    @agent.tool(name="cancel", description="Cancel an order.")
    def cancel_order(order_id: str) -> str:
        return order_id

    assert isinstance(check_order_status, Tool)
    assert [(t.name, t.description) for t in agent.tools] == [
        ("check_order_status", "Check an order."),
        ("cancel", "Cancel an order."),
    ]


def test_plain_callables_become_tools_and_a_later_tool_replaces_a_namesake() -> None:
    def lookup(q: str) -> str:
        """First."""
        return q

    agent = Agent(name="A", instructions="x", tools=[lookup])
    agent.add_tool(Tool(lambda q: q, name="lookup", description="Second."))
    assert [(t.name, t.description) for t in agent.tools] == [("lookup", "Second.")]


def test_own_tools_come_before_handoff_tools() -> None:
    agent = Agent(name="A", instructions="x", handoffs=[Agent(name="B", instructions="y")])

    @agent.tool
    def own() -> None:
        """Own."""

    assert [t.name for t in agent.get_all_tools()] == ["own", "transfer_to_b"]


def test_instructions_may_be_a_callable_evaluated_each_time() -> None:
    counter = iter(range(10))
    agent = Agent(name="A", instructions=lambda: f"call {next(counter)}")
    assert (agent.get_instructions(), agent.get_instructions()) == ("call 0", "call 1")
    assert Agent(name="B", instructions="fixed").get_instructions() == "fixed"


def test_the_constructor_keeps_0_3_4s_parameters() -> None:
    engine = object()
    agent = Agent("A", "x", model="gpt-4o", provider="openai", base_url="https://api.openai.com/v1",
                  api_key="sk-test", engine=engine)
    assert (agent.name, agent.instructions, agent.model, agent.provider) == ("A", "x", "gpt-4o", "openai")
    assert (agent.base_url, agent.api_key, agent.engine) == ("https://api.openai.com/v1", "sk-test", engine)
    assert Agent("B", "y").model == "gemini-2.5-flash"
