"""Demo conversations for `manage.py chatflow_demo`: who writes, on which channel, and what they say.

Each demo session is a customer on WhatsApp, Telegram or the web widget with a realistic session
id (``1555…``, the customer's wa_id, as the WhatsApp webhook names its sessions; ``tg:…``;
``web-…``) and channel metadata, and a script of user messages written for the demo team on the
demo engine: order tracking, handoffs to Billing (refunds, invoices) and Tech (device diagnosis),
handoffs back to Support, a refused refund. The agents' answers, tool
calls and handoffs are not scripted: :func:`play` runs each message as a real turn.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sessions_app.models import ChatMessage, ChatSession
from takeover_app import service
from takeover_app.models import SessionMode
from turns_app.models import TurnRecord

if TYPE_CHECKING:
    from chatflow_agent.core.runner import Runner

__all__ = ["SCRIPTS", "TAKEOVER_SCRIPTS", "DemoSession", "demo_colleague", "plan_sessions", "plan_takeover_sessions",
           "play", "spread_times", "stage_takeover"]

# {order}, {order2}, {invoice}, {device}, {symptom}, {amount} are filled per session.
SCRIPTS: tuple[tuple[str, ...], ...] = (
    ("Hi, where is my order {order}?", "Thanks!"),
    ("Hello, can you check order {order}?", "And order {order2}?", "Great, thank you"),
    ("I was charged twice on my card, I need a refund", "Please refund order {order}", "Thanks, that was quick!"),
    ("Hi! Where is order {order}?", "It arrived damaged, I want a refund", "refund order {order} amount {amount}"),
    ("Can I get a copy of my invoice {invoice}?", "Yes, invoice {invoice} please"),
    ("Is there a problem with my invoice? I think it's wrong", "invoice {invoice} please"),
    (
        "My router keeps dropping the wifi, can you help me troubleshoot it?",
        "The device is my '{device}' and the symptom is '{symptom}'",
        "Thanks. Back to support please",
        "Where is order {order}?",
    ),
    ("my {device} won't turn on, need tech support", "Device '{device}', symptom '{symptom}'"),
    ("I need a refund", "refund order {order} amount 900"),
    ("Hi there", "Where is my order {order}?"),
    ("Olá, order {order} por favor",),
)

_DEVICES = ("Pixel 8", "iPhone 13", "Galaxy S23", "ThinkPad X1", "Fritz!Box 7590", "Kindle Paperwhite", "AirPods Pro")
_SYMPTOMS = (
    "battery drains overnight", "no power", "wifi drops every evening", "screen flickers",
    "won't charge past 80%", "bluetooth keeps disconnecting", "overheats while charging",
)
_NAMES = ("Ana", "Bruno", "Chloé", "Dmitri", "Emeka", "Fatima", "Grace", "Hiro", "Inês", "Jonas", "Kofi", "Leila",
          "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Victor", "Wen", "Yusuf")
_PAGES = ("/orders", "/help", "/checkout", "/account/invoices", "/products/router-x2", "/returns")
_AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
)


@dataclass
class DemoSession:
    """One demo conversation: ``messages`` are played in order, one turn each; ``takeover`` (human
    takeover demos only) says what an operator does afterwards (:func:`stage_takeover`)."""

    session_id: str
    metadata: dict[str, Any]
    messages: list[str] = field(default_factory=list)
    takeover: str = ""
    values: dict[str, str] = field(default_factory=dict)  # what its scripts' placeholders were filled with


def _whatsapp(rng: random.Random, name: str) -> tuple[str, dict[str, Any]]:
    number = f"1555{rng.randrange(10**7):07d}"
    return number, {"channel": "whatsapp", "wa_id": number, "phone_number_id": "109876543210987",
                    "profile_name": name}


def _telegram(rng: random.Random, name: str) -> tuple[str, dict[str, Any]]:
    user_id = str(rng.randrange(10**8, 10**10))
    return f"tg:{user_id}", {"channel": "telegram", "user_id": user_id, "chat_id": user_id,
                             "username": f"{name.lower()}_{rng.randrange(100)}", "language_code": "en"}


def _web(rng: random.Random, name: str) -> tuple[str, dict[str, Any]]:
    visitor = "".join(rng.choices(string.hexdigits.lower()[:16], k=12))
    return f"web-{visitor}", {"channel": "web", "visitor_id": visitor, "page": rng.choice(_PAGES),
                              "user_agent": rng.choice(_AGENTS), "display_name": name}


#: Human takeover demos: (what happens, channel index in _CHANNELS, customer messages). "waiting": the
#: customer's words ask for a person (CHATFLOW_HUMAN_PHRASES), so the session waits; "human": an operator
#: took it over and replied, and the customer's next message is held for them; "handed_back": taken over,
#: answered and handed back to the bot with a private note. Operator replies go to web sessions, whose
#: replies travel over the console's own websocket (a demo sends nothing to WhatsApp or Telegram).
TAKEOVER_SCRIPTS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("waiting", 0, ("Hi, order {order} arrived broken", "This is the second time. I want to talk to a human")),
    ("waiting", 1, ("Olá, quero falar com um atendente, por favor",)),
    ("human", 2, ("I was charged twice for order {order}", "refund order {order} amount {amount}")),
    ("handed_back", 2, ("Is there a problem with my invoice? I think it's wrong",)),
)
#: What the demo colleague writes (per takeover kind) and the customer's message held for them.
_OPERATOR_REPLY = {"human": "Hi {name}, this is Dana from the support team. I see the double charge on {order}; "
                            "I am checking it with Billing now.",
                   "handed_back": "Hi {name}, Dana here. Invoice {invoice} had the wrong address; it is corrected. "
                                  "Our assistant can send you the new copy."}
_HELD = "Thank you! Will the refund go back to my card?"
_NOTE = "Invoice {invoice} was re-issued with the corrected address; offer to send the new copy, no refund needed."
DEMO_COLLEAGUE = "dana.demo"

_CHANNELS: tuple[Callable[[random.Random, str], tuple[str, dict[str, Any]]], ...] = (_whatsapp, _telegram, _web)


def _order(rng: random.Random) -> str:
    return f"{rng.choice('ABCKPQW')}-{rng.randrange(1000, 10000)}"


def plan_sessions(count: int, rng: random.Random, taken: Collection[str] = ()) -> list[DemoSession]:
    """``count`` demo sessions with ids not in ``taken``: every script and channel in turn, details random."""
    used = set(taken)
    sessions = []
    for n in range(count):
        name = rng.choice(_NAMES)
        session_id, metadata = _CHANNELS[n % len(_CHANNELS)](rng, name)
        while session_id in used:
            session_id, metadata = _CHANNELS[n % len(_CHANNELS)](rng, name)
        used.add(session_id)
        order = _order(rng)
        values = {
            "order": order, "order2": f"{order[:-1]}{(int(order[-1]) + 1) % 10}",
            "invoice": f"INV-{rng.randrange(2024, 2027)}-{rng.randrange(1, 10000):04d}",
            "device": rng.choice(_DEVICES), "symptom": rng.choice(_SYMPTOMS),
            "amount": f"{rng.randrange(5, 40)}.{rng.choice(('00', '50', '99'))}",
        }
        script = SCRIPTS[n % len(SCRIPTS)]
        sessions.append(DemoSession(session_id, {**metadata, "demo": True}, [m.format(**values) for m in script]))
    return sessions


def plan_takeover_sessions(count: int, rng: random.Random, taken: Collection[str] = ()) -> list[DemoSession]:
    """``count`` human takeover demo sessions (:data:`TAKEOVER_SCRIPTS` in turn) with ids not in ``taken``."""
    used = set(taken)
    sessions = []
    for n in range(count):
        kind, channel, script = TAKEOVER_SCRIPTS[n % len(TAKEOVER_SCRIPTS)]
        name = rng.choice(_NAMES)
        session_id, metadata = _CHANNELS[channel](rng, name)
        while session_id in used:
            session_id, metadata = _CHANNELS[channel](rng, name)
        used.add(session_id)
        values = {"order": _order(rng), "amount": f"{rng.randrange(5, 40)}.00", "name": name,
                  "invoice": f"INV-{rng.randrange(2024, 2027)}-{rng.randrange(1, 10000):04d}"}
        sessions.append(DemoSession(session_id, {**metadata, "demo": True}, [m.format(**values) for m in script],
                                    kind, values))
    return sessions


def demo_colleague() -> Any:
    """The demo's colleague operator (``dana.demo``, Operators group, no usable password: nobody logs in
    as her) who owns the demo's taken-over sessions."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    user, created = get_user_model().objects.get_or_create(username=DEMO_COLLEAGUE, defaults={
        "is_staff": True, "first_name": "Dana", "email": "dana.demo@example.test"})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
        user.groups.add(Group.objects.get(name="Operators"))
    return user


def stage_takeover(runner: Runner, session: DemoSession, operator: Any) -> None:
    """After the session's customer messages were played: what an operator did on it, through the
    takeover service (audited, as in the console). Sync: call it outside an event loop."""
    import asyncio


    values = session.values
    if session.takeover == "waiting":  # the wait began with the customer's words (their time, once spread)
        asked = (ChatMessage.objects.filter(session_id=session.session_id, role="user").order_by("-id")
                 .values_list("created_at", flat=True).first())
        SessionMode.objects.filter(pk=session.session_id, mode="waiting").update(since=asked, waiting_since=asked)
        return
    if session.takeover not in ("human", "handed_back"):
        return
    service.take_over(operator, session.session_id)
    service.send_reply(operator, session.session_id, _OPERATOR_REPLY[session.takeover].format(**values))
    if session.takeover == "human":  # the customer answers: held for the operator, no bot turn
        asyncio.run(runner.run_async(session.session_id, _HELD, metadata=session.metadata))
    else:
        service.hand_back(operator, session.session_id, note=_NOTE.format(**values))


async def play(runner: Runner, session: DemoSession) -> None:
    """Run the session's messages as real turns on ``runner`` (the first turn stores the metadata)."""
    for message in session.messages:
        await runner.run_async(session.session_id, message, metadata=session.metadata)


def spread_times(session_id: str, ends_at: datetime, rng: random.Random) -> None:
    """Move the session's timestamps so it looks written before ``ends_at``, a minute or two per turn.

    Demo sessions are played in a second; a console showing them all "just now" would look
    nothing like a live site. Only timestamps change; the rows and their order stay. Each message's
    own ``timestamp`` (in its JSON, what the transcript export writes) moves with its row's
    ``created_at`` (what the console shows), so both say the same time, as for a restored transcript;
    each turn record moves with its USER message (so the dashboard spreads the turns the same way).
    """
    from django.db import transaction


    with transaction.atomic():
        messages = list(ChatMessage.objects.filter(session_id=session_id).order_by("id"))
        # A user thinks for 20-150 s before writing; the agent's rows follow within seconds.
        gaps = [rng.randrange(20, 150) if m.role == "user" else rng.randrange(1, 4) for m in messages]
        start = moment = ends_at - timedelta(seconds=sum(gaps))
        for message, gap in zip(messages, gaps, strict=True):
            moment += timedelta(seconds=gap)
            message.created_at = moment
            message.message_json = _dated(message.message_json, moment)
        ChatMessage.objects.bulk_update(messages, ["created_at", "message_json"])
        ChatSession.objects.filter(pk=session_id).update(created_at=start, updated_at=moment)
        _move_records(session_id, {m.id: m.created_at for m in messages})


def _move_records(session_id: str, moments: dict[int, datetime]) -> None:
    """The session's turn records start when their USER message now says (the dashboard draws them)."""
    records = list(TurnRecord.objects.filter(session_id=session_id, first_message_id__in=list(moments)))
    for record in records:
        record.started_at = moments[record.first_message_id]
        record.finished_at = record.started_at + timedelta(milliseconds=record.duration_ms or 0)
    TurnRecord.objects.bulk_update(records, ["started_at", "finished_at"])


def _dated(message_json: str, moment: datetime) -> str:
    """A stored message (``Message`` JSON) with its timestamp set to ``moment``."""
    from chatflow_agent.types import Message

    message = Message.model_validate_json(message_json)
    return message.model_copy(update={"timestamp": moment.astimezone(UTC)}).model_dump_json()
