"""How a session's customer reaches it: the webhook its messages arrive through.

What may be sent to a session's customer, and whether a session is a customer's at all, is decided here
from the session's arrival, never from its metadata's ``channel``: that is a label a generic integration
(``metadata.channel``), the live chat's channel field or an import writes as it likes. The arrival is the
last webhook delivery from a provider that sends (:data:`SENDING_PROVIDERS`: WhatsApp, Telegram) whose turn
committed into the session or, for a session no such delivery reached, the last delivery of any provider
(a generic webhook's). A delivery's turn writes its marker (``<delivery id>:<token>``) into the session's
metadata with its commit: under ``taskqueue.MARKER_KEY`` always, and under :data:`ARRIVAL_KEY` too when its
provider sends (:func:`arrival_metadata`); so a signed generic message on a WhatsApp customer's session
does not take that customer's replies away from WhatsApp. A marker counts only when that delivery exists
with that token for that session (a copied or typed marker names no delivery). The delivery's own
metadata, parsed from the provider's payload, says whom a reply goes to (WhatsApp ``phone_number_id`` and
``wa_id``, Telegram ``chat_id``), as it does for the bot's replies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhooks_app.models import SENDING_PROVIDERS, InboundDelivery
from webhooks_app.taskqueue import MARKER_KEY

__all__ = ["ARRIVAL_KEY", "CUSTOMER_LABELS", "SENDING_PROVIDERS", "Arrival", "arrival_metadata", "arrival_of",
           "customer_channel"]

Provider = InboundDelivery.Provider

#: Channels a session's metadata may name for a customer's conversation that reached the site without a
#: webhook here (imported from a bot on chatflow-agent, the demo's customers): a customer's all the same.
CUSTOMER_LABELS = frozenset(SENDING_PROVIDERS)

#: Session metadata: the marker of the last delivery from a provider that sends whose turn committed.
ARRIVAL_KEY = "webhook_arrival"


@dataclass(frozen=True)
class Arrival:
    """The webhook a session's messages arrive through: its ``provider`` (``whatsapp``, ``telegram``,
    ``generic``), the delivery that last reached the session and that delivery's ``address`` (its channel
    metadata: whom a reply goes to)."""

    provider: str
    delivery_id: int
    address: dict[str, Any] = field(default_factory=dict)

    @property
    def sends_out(self) -> bool:
        """True when a reply to this session goes out through its provider's API."""
        return self.provider in SENDING_PROVIDERS


def arrival_metadata(delivery: InboundDelivery) -> dict[str, str]:
    """What ``delivery``'s turn writes into its session's metadata, beside its marker, to be the session's
    arrival: its marker under :data:`ARRIVAL_KEY` when its provider sends, nothing otherwise (a delivery
    from a provider that sends nothing never replaces one that does)."""
    return {ARRIVAL_KEY: delivery.marker} if delivery.provider in SENDING_PROVIDERS else {}


def _marker(metadata: Any, key: str) -> tuple[int, str] | None:
    """(delivery id, token) of the marker under ``key`` in a session's ``metadata``, None when it holds none."""
    value = metadata.get(key) if isinstance(metadata, dict) else None
    if not isinstance(value, str):
        return None
    pk, _, token = value.partition(":")
    if not (pk.isascii() and pk.isdigit()) or not token or len(pk) > 18:
        return None
    return int(pk), token


def arrival_of(session_id: str, metadata: Any) -> Arrival | None:
    """The webhook ``session_id`` (whose stored metadata is ``metadata``) arrives through, or None for a
    session no webhook delivered to here: one the live chat, ``chatflow_chat``, the demo, a transcript restore
    or an import wrote. The last delivery from a provider that sends, else the last delivery (see the module
    docstring). One query by primary key (a second when the first marker names no delivery), none without
    a marker."""
    for key in (ARRIVAL_KEY, MARKER_KEY):
        marker = _marker(metadata, key)
        if marker is None:
            continue
        found = (InboundDelivery.objects.filter(pk=marker[0], token=marker[1], session_id=session_id)
                 .values_list("provider", "metadata").first())
        if found is not None:
            provider, address = found
            return Arrival(provider, marker[0], address if isinstance(address, dict) else {})
    return None


def customer_channel(arrival: Arrival | None, metadata: Any) -> str:
    """The channel a customer writes to a session through, ``""`` for a session no customer writes to.

    ``arrival`` is the session's (:func:`arrival_of`; None for a new session): its provider, any provider,
    generic included. A session no webhook delivered to is a customer's only when its ``metadata`` names a
    :data:`CUSTOMER_LABELS` channel (a conversation imported from a bot): naming one never makes a reply
    go out (that is the arrival's), it only keeps the live chat and ``chatflow_chat`` from writing there
    as the customer.
    """
    if arrival is not None:
        return arrival.provider
    label = str(metadata.get("channel") or "").lower() if isinstance(metadata, dict) else ""
    return label if label in CUSTOMER_LABELS else ""
