"""How a session's customer reaches it: the webhook its messages arrive through.

What may be sent to a session's customer, and whether a session is a customer's at all, is decided here
from the session's arrival, never from its metadata's ``channel``: that is a label a generic integration
(``metadata.channel``), the live chat's channel field or an import writes as it likes. The arrival is the
webhook delivery whose turn last committed into the session: its turn writes the delivery's marker
(``taskqueue.MARKER_KEY``: ``<delivery id>:<token>``) into the session's metadata with its commit, and the
marker counts only when that delivery exists with that token for that session (a copied or typed marker
names no delivery). The delivery's own metadata, parsed from the provider's payload, says whom a reply
goes to (WhatsApp ``phone_number_id`` and ``wa_id``, Telegram ``chat_id``), as it does for the bot's
replies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhooks_app.models import SENDING_PROVIDERS, InboundDelivery
from webhooks_app.taskqueue import MARKER_KEY

__all__ = ["CUSTOMER_LABELS", "SENDING_PROVIDERS", "Arrival", "arrival_of", "customer_channel"]

Provider = InboundDelivery.Provider

#: Channels a session's metadata may name for a customer's conversation that reached the site without a
#: webhook here (imported from a bot on chatflow-agent, the demo's customers): a customer's all the same.
CUSTOMER_LABELS = frozenset(SENDING_PROVIDERS)


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


def _marker(metadata: Any) -> tuple[int, str] | None:
    """(delivery id, token) of the marker in a session's ``metadata``, None when it holds none."""
    value = metadata.get(MARKER_KEY) if isinstance(metadata, dict) else None
    if not isinstance(value, str):
        return None
    pk, _, token = value.partition(":")
    if not (pk.isascii() and pk.isdigit()) or not token or len(pk) > 18:
        return None
    return int(pk), token


def arrival_of(session_id: str, metadata: Any) -> Arrival | None:
    """The webhook ``session_id`` (whose stored metadata is ``metadata``) arrives through, or None for a
    session no webhook delivered to here: one the live chat, ``chatflow_chat``, the demo, a transcript restore
    or an import wrote. One query by primary key, none without a marker."""
    marker = _marker(metadata)
    if marker is None:
        return None
    found = (InboundDelivery.objects.filter(pk=marker[0], token=marker[1], session_id=session_id)
             .values_list("provider", "metadata").first())
    if found is None:
        return None
    provider, address = found
    return Arrival(provider, marker[0], address if isinstance(address, dict) else {})


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
