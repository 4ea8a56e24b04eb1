"""The demo team (CHATFLOW_AGENTS default): Support hands off to Billing and Tech, who hand back.

Every tool is deterministic — the same arguments give the same answer — so demo sessions, the
offline demo engine and tests agree on what a turn produces.
"""

from __future__ import annotations

import hashlib
from datetime import date, timedelta

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.gate import request_human_tool
from chatflow_agent.core.tools import tool

__all__ = ["build", "check_order_status", "diagnose_device", "get_invoice", "refund_order"]

_STATUSES = ("processing", "shipped", "in transit", "out for delivery", "delivered")
_EPOCH = date(2025, 1, 1)


def _digest(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


@tool
def check_order_status(order_id: str) -> dict:
    """Look up an order's shipping status and estimated delivery date."""
    order_id = order_id.strip()
    if not order_id:
        return {"order_id": order_id, "found": False, "error": "order id is empty"}
    n = _digest("order", order_id)
    status = _STATUSES[n % len(_STATUSES)]
    eta = None if status == "delivered" else (_EPOCH + timedelta(days=n % 28 + 1)).isoformat()
    carrier = ("DHL", "UPS", "FedEx")[n % 3]
    return {"order_id": order_id, "found": True, "status": status, "eta": eta, "carrier": carrier}


@tool
def refund_order(order_id: str, amount: float | None = None) -> dict:
    """Refund an order, fully (no amount) or partially (amount in the order's currency)."""
    total = round(20 + _digest("total", order_id) % 18000 / 100, 2)
    if amount is not None and (amount <= 0 or amount > total):
        return {"order_id": order_id, "refunded": False, "error": f"amount must be between 0 and {total:.2f}"}
    refunded = total if amount is None else round(amount, 2)
    return {
        "order_id": order_id,
        "refunded": True,
        "amount": refunded,
        "currency": "EUR",
        "refund_id": f"RF-{_digest('refund', order_id, str(refunded)) % 10**8:08d}",
    }


@tool
def get_invoice(invoice_id: str) -> dict:
    """Fetch an invoice's total, status and issue date."""
    n = _digest("invoice", invoice_id)
    return {
        "invoice_id": invoice_id,
        "total": round(10 + n % 50000 / 100, 2),
        "currency": "EUR",
        "status": ("paid", "open", "overdue")[n % 3],
        "issued_on": (_EPOCH + timedelta(days=n % 300)).isoformat(),
    }


_DIAGNOSES = (
    ("restart the device and check for firmware updates", False),
    ("reset the network settings and reconnect", False),
    ("run the built-in battery calibration", False),
    ("hardware fault suspected: book a repair", True),
)


@tool
def diagnose_device(device: str, symptom: str) -> dict:
    """Suggest a fix for a device symptom and say whether the device needs a repair."""
    advice, repair = _DIAGNOSES[_digest("diagnose", device.lower(), symptom.lower()) % len(_DIAGNOSES)]
    return {"device": device, "symptom": symptom, "advice": advice, "needs_repair": repair}


def build() -> Agent:
    """A fresh demo team; returns Support, the starting agent."""
    support = Agent(
        name="Support",
        instructions=(
            "You are the first-line support agent of an online shop. Track orders with check_order_status. "
            "Hand refunds and invoices to Billing and device problems to Tech. "
            "When the customer wants to talk to a person, call request_human."
        ),
        model="demo",
        tools=[check_order_status, request_human_tool()],
    )
    billing = Agent(
        name="Billing",
        instructions=(
            "You handle refunds (refund_order) and invoices (get_invoice). "
            "Hand anything else back to Support."
        ),
        model="demo",
        tools=[refund_order, get_invoice],
        handoffs=[support],
    )
    tech = Agent(
        name="Tech",
        instructions="You troubleshoot devices with diagnose_device. Hand anything else back to Support.",
        model="demo",
        tools=[diagnose_device],
        handoffs=[support],
    )
    support.add_handoff(billing)
    support.add_handoff(tech)
    return support
