"""What each channel sends: signature checks and payload parsing into ``inbox.Inbound`` messages.

Everything here is pure (no database): a payload is validated completely before anything is
written, so a malformed one is refused with a 4xx and leaves nothing behind.

Sources: WhatsApp Cloud API webhooks (developers.facebook.com/docs/whatsapp/cloud-api/webhooks:
``entry[].changes[].value.messages[]``, ``X-Hub-Signature-256: sha256=<hex>`` over the raw body
with the app secret); Telegram Bot API ``setWebhook`` (``X-Telegram-Bot-Api-Secret-Token``, the
``Update`` object).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from chatflow_agent.jsonsafe import json_safe
from sessions_app.ids import id_problem
from webhooks_app.inbox import Inbound
from webhooks_app.models import InboundDelivery

__all__ = ["Refused", "check_hmac", "check_secret_token", "parse_json", "placeholder", "whatsapp_messages",
           "telegram_messages", "generic_message"]

Provider = InboundDelivery.Provider
Kind = InboundDelivery.Kind
MAX_TEXT = 64 * 1024
MAX_DEPTH = 32  # nested arrays/objects in a body: far deeper than any provider sends
TELEGRAM_ID_BITS = 64  # Telegram ids fit a signed 64-bit integer (core.telegram.org/bots/api#chat)


class Refused(Exception):
    """A request refused with ``status`` and a JSON body ``{"error": code, "detail": detail}``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def check_hmac(body: bytes, header: str | None, secret: str, name: str) -> None:
    """``header`` must be ``sha256=<hex HMAC-SHA256 of body with secret>``: missing → 401, wrong → 403."""
    if not header:
        raise Refused(401, "signature_missing", f"The {name} header is missing.")
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(header.strip().lower().encode(), expected.encode()):
        raise Refused(403, "signature_invalid", f"The {name} header does not match the body.")


def check_secret_token(header: str | None, secret: str, name: str) -> None:
    if not header:
        raise Refused(401, "secret_token_missing", f"The {name} header is missing.")
    if not hmac.compare_digest(header.encode(), secret.encode()):
        raise Refused(403, "secret_token_invalid", f"The {name} header is wrong.")


def parse_json(body: bytes) -> Any:
    """The JSON body as sent: malformed or not UTF-8 → 400 ``malformed_json``; arrays/objects nested more
    than ``MAX_DEPTH`` deep → 400 ``nested_too_deeply``.

    Strings are not cleaned here: ids are checked as sent (:func:`_id` refuses what cannot be stored
    faithfully), and the text, metadata and payload a channel's parser returns are cleaned there
    (``json_safe``: JSON may escape a lone surrogate or NUL, which SQLite's UTF-8 and PostgreSQL's text
    cannot hold; invariant 8).
    """
    try:
        data = json.loads(body.decode("utf-8"))
    except RecursionError:
        raise _too_deep() from None
    except (UnicodeDecodeError, ValueError) as err:
        raise Refused(400, "malformed_json", f"The body is not valid UTF-8 JSON: {err}") from None
    if _depth(data) > MAX_DEPTH:
        raise _too_deep()
    return data


def _too_deep() -> Refused:
    return Refused(400, "nested_too_deeply", f"The body nests arrays/objects more than {MAX_DEPTH} deep.")


def _depth(value: Any) -> int:
    """How deep arrays/objects nest in ``value`` (0 for a scalar), counted without recursion; stops
    counting past ``MAX_DEPTH``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _inbound(provider: str, message_id: str, session_id: str, kind: str, text: str,
             metadata: dict[str, Any], payload: Any) -> Inbound:
    """The parsed message with its text, metadata and payload cleaned for storage (ids are checked)."""
    return Inbound(provider, message_id, session_id, kind, json_safe(text), json_safe(metadata),
                   json_safe(payload))


def _bad(detail: str) -> Refused:
    return Refused(400, "invalid_payload", detail)


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{where} must be an object.")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list.")
    return value


def _id(value: Any, where: str) -> str:
    """A message or session id exactly as sent (an integer as its digits), or 400 ``invalid_payload``
    (the rule: :func:`sessions_app.ids.id_problem`)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _bad(f"{where} must be a non-empty string.")
    text = str(value)
    if problem := id_problem(text):
        raise _bad(f"{where} {problem}.")
    return text


def _telegram_int(value: Any, where: str) -> int:
    """A Telegram id: an integer that fits a signed 64-bit integer, or 400 ``invalid_payload``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{where} must be an integer.")
    if not -(2 ** (TELEGRAM_ID_BITS - 1)) <= value < 2 ** (TELEGRAM_ID_BITS - 1):
        raise _bad(f"{where} does not fit a signed {TELEGRAM_ID_BITS}-bit integer.")
    return value


# ---- non-text messages ------------------------------------------------------------------------
#: What a non-text message is called in its placeholder, by its WhatsApp ``type`` or the Telegram
#: ``Message`` field that holds it (developers.facebook.com/docs/whatsapp/cloud-api/webhooks/components,
#: core.telegram.org/bots/api#message).
_NON_TEXT = {
    "image": "image", "photo": "image", "video": "video", "video_note": "video message", "animation": "GIF",
    "audio": "audio", "voice": "voice message", "document": "document", "sticker": "sticker",
    "location": "location", "venue": "location", "contacts": "contact", "contact": "contact",
    "reaction": "reaction", "poll": "poll", "dice": "dice", "interactive": "button reply", "button": "button reply",
    "order": "order",
}
_TELEGRAM_NON_TEXT = ("photo", "video", "video_note", "animation", "audio", "voice", "document", "sticker",
                      "venue", "location", "contact", "poll", "dice")


def placeholder(kind: str, caption: Any = None) -> str:
    """The line a non-text message of ``kind`` stands as in its session (the bot reads only text):
    ``[image]``, or ``[image] <caption>`` when the customer wrote one with it."""
    name = _NON_TEXT.get(kind, f"{kind} message" if kind.isascii() and kind.isidentifier() else "message")
    line = f"[{name}]"
    if isinstance(caption, str) and caption.strip():
        line += f" {caption.strip()[:MAX_TEXT]}"
    return line


# ---- WhatsApp ---------------------------------------------------------------------------------
def whatsapp_messages(data: Any) -> list[Inbound]:
    """Every message of a Cloud API payload, in payload order; statuses are ignored."""
    data = _obj(data, "The payload")
    if "entry" not in data:
        raise _bad("The payload has no 'entry' list.")
    found: list[Inbound] = []
    for i, entry in enumerate(_list(data["entry"], "entry")):
        for j, change in enumerate(_list(_obj(entry, f"entry[{i}]").get("changes"), f"entry[{i}].changes")):
            where = f"entry[{i}].changes[{j}]"
            value = _obj(_obj(change, where).get("value", {}), f"{where}.value")
            meta = _obj(value.get("metadata", {}), f"{where}.value.metadata")
            names = {}
            for contact in _list(value.get("contacts"), f"{where}.value.contacts"):
                contact = _obj(contact, f"{where}.value.contacts[]")
                if contact.get("wa_id") is not None:
                    names[str(contact["wa_id"])] = str(_obj(contact.get("profile", {}), "profile").get("name", ""))
            for k, msg in enumerate(_list(value.get("messages"), f"{where}.value.messages")):
                found.append(_whatsapp_message(_obj(msg, f"{where}.value.messages[{k}]"), meta, names,
                                               f"{where}.value.messages[{k}]"))
    return found


def _whatsapp_message(msg: dict[str, Any], meta: dict[str, Any], names: dict[str, str], where: str) -> Inbound:
    wamid = _id(msg.get("id"), f"{where}.id")
    wa_id = _id(msg.get("from"), f"{where}.from")
    phone_number_id = _id(meta.get("phone_number_id"), "value.metadata.phone_number_id")
    metadata = {"channel": "whatsapp", "phone_number_id": phone_number_id, "wa_id": wa_id}
    if names.get(wa_id):
        metadata["profile_name"] = names[wa_id]
    wa_type = str(msg.get("type") or "")[:40]
    content = msg.get(wa_type) if wa_type else None
    kind, text = Kind.UNSUPPORTED, placeholder(wa_type, content.get("caption") if isinstance(content, dict) else None)
    if msg.get("type") == "text":
        body = _obj(msg.get("text"), f"{where}.text").get("body")
        if not isinstance(body, str):
            raise _bad(f"{where}.text.body must be a string.")
        if len(body) > MAX_TEXT:
            raise _bad(f"{where}.text.body is longer than {MAX_TEXT} characters.")
        kind, text = Kind.TEXT, body
    return _inbound(Provider.WHATSAPP, wamid, wa_id, kind, text, metadata, msg)


# ---- Telegram ---------------------------------------------------------------------------------
def telegram_messages(data: Any) -> list[Inbound]:
    """The update's message (or edited/channel post) as one inbound message; other updates → []."""
    data = _obj(data, "The update")
    update_id = _telegram_int(data.get("update_id"), "update_id")
    msg = next((data[k] for k in ("message", "channel_post") if k in data), None)
    if msg is None:
        return []  # edited messages, callback queries, member updates…: nothing to answer
    msg = _obj(msg, "message")
    chat = _obj(msg.get("chat"), "message.chat")
    chat_id = _telegram_int(chat.get("id"), "message.chat.id")
    sender = msg.get("from") if isinstance(msg.get("from"), dict) else {}
    metadata = {"channel": "telegram", "chat_id": chat_id}
    name = " ".join(str(sender.get(k)) for k in ("first_name", "last_name") if sender.get(k))
    if name:
        metadata["profile_name"] = name
    if sender.get("username"):
        metadata["username"] = str(sender["username"])
    text = msg.get("text")
    if not isinstance(text, str):
        found = next((k for k in _TELEGRAM_NON_TEXT if k in msg), "")
        kind, text = Kind.UNSUPPORTED, placeholder(found, msg.get("caption"))
    elif text.strip().split("@", 1)[0].split(" ", 1)[0] == "/reset":
        kind = Kind.RESET
    else:
        if len(text) > MAX_TEXT:
            raise _bad(f"message.text is longer than {MAX_TEXT} characters.")
        kind = Kind.TEXT
    return [_inbound(Provider.TELEGRAM, _id(update_id, "update_id"), _id(f"tg:{chat_id}", "message.chat.id"),
                     kind, text, metadata, data)]


# ---- generic ----------------------------------------------------------------------------------
def generic_message(data: Any) -> Inbound:
    """``{"session_id": str, "message_id": str, "text": str, "metadata": {…} (optional: absent or null)}``;
    ``metadata.channel``, when given, a non-empty string (``generic`` otherwise). Anything else is 400
    ``invalid_payload``: a number id would be stored as its digits (``5`` and ``"5"`` one session), not as sent."""
    data = _obj(data, "The body")
    missing = [k for k in ("session_id", "message_id", "text") if k not in data]
    if missing:
        raise _bad(f"Missing field(s): {', '.join(missing)}.")
    for name in ("session_id", "message_id"):
        if not isinstance(data[name], str):
            raise _bad(f"{name} must be a string.")
    text = data["text"]
    if isinstance(text, str):
        text = json_safe(text)
    if not isinstance(text, str) or not text.strip():
        raise _bad("text must be a non-empty string.")
    if len(text) > MAX_TEXT:
        raise _bad(f"text is longer than {MAX_TEXT} characters.")
    metadata = data.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise _bad("metadata must be an object.")
    channel = metadata.get("channel", "generic")
    if not isinstance(channel, str) or not channel.strip():
        raise _bad("metadata.channel must be a non-empty string (generic when left out).")
    metadata = {"channel": "generic", **metadata}
    return _inbound(Provider.GENERIC, _id(data["message_id"], "message_id"), _id(data["session_id"], "session_id"),
                    Kind.TEXT, text, metadata, data)
