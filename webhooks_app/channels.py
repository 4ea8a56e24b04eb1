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
from webhooks_app.inbox import Inbound
from webhooks_app.models import InboundDelivery

__all__ = ["Refused", "check_hmac", "check_secret_token", "parse_json", "whatsapp_messages",
           "telegram_messages", "generic_message"]

Provider = InboundDelivery.Provider
Kind = InboundDelivery.Kind
MAX_ID = 255  # characters of a message or session id
MAX_TEXT = 64 * 1024


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
    """The JSON body with every string cleaned (``json_safe``): malformed or not UTF-8 → 400 ``malformed_json``.

    JSON may escape a lone surrogate (``"\\ud800"``) or NUL (``"\\u0000"``); neither can be stored (SQLite's
    UTF-8, PostgreSQL text), so they are replaced/removed here, once, before any field is read (invariant 8).
    """
    try:
        return json_safe(json.loads(body.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as err:
        raise Refused(400, "malformed_json", f"The body is not valid UTF-8 JSON: {err}") from None


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
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise _bad(f"{where} must be a non-empty string.")
    text = str(value).strip()
    if len(text) > MAX_ID:
        raise _bad(f"{where} is longer than {MAX_ID} characters.")
    return text


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
    kind, text = Kind.UNSUPPORTED, ""
    if msg.get("type") == "text":
        body = _obj(msg.get("text"), f"{where}.text").get("body")
        if not isinstance(body, str):
            raise _bad(f"{where}.text.body must be a string.")
        if len(body) > MAX_TEXT:
            raise _bad(f"{where}.text.body is longer than {MAX_TEXT} characters.")
        kind, text = Kind.TEXT, body
    return Inbound(Provider.WHATSAPP, wamid, wa_id, kind, text, metadata, msg)


# ---- Telegram ---------------------------------------------------------------------------------
def telegram_messages(data: Any) -> list[Inbound]:
    """The update's message (or edited/channel post) as one inbound message; other updates → []."""
    data = _obj(data, "The update")
    update_id = data.get("update_id")
    if isinstance(update_id, bool) or not isinstance(update_id, int):
        raise _bad("update_id must be an integer.")
    msg = next((data[k] for k in ("message", "channel_post") if k in data), None)
    if msg is None:
        return []  # edited messages, callback queries, member updates…: nothing to answer
    msg = _obj(msg, "message")
    chat = _obj(msg.get("chat"), "message.chat")
    chat_id = chat.get("id")
    if isinstance(chat_id, bool) or not isinstance(chat_id, int):
        raise _bad("message.chat.id must be an integer.")
    sender = msg.get("from") if isinstance(msg.get("from"), dict) else {}
    metadata = {"channel": "telegram", "chat_id": chat_id}
    name = " ".join(str(sender.get(k)) for k in ("first_name", "last_name") if sender.get(k))
    if name:
        metadata["profile_name"] = name
    if sender.get("username"):
        metadata["username"] = str(sender["username"])
    text = msg.get("text")
    if not isinstance(text, str):
        kind, text = Kind.UNSUPPORTED, ""
    elif text.strip().split("@", 1)[0].split(" ", 1)[0] == "/reset":
        kind = Kind.RESET
    else:
        if len(text) > MAX_TEXT:
            raise _bad(f"message.text is longer than {MAX_TEXT} characters.")
        kind = Kind.TEXT
    return [Inbound(Provider.TELEGRAM, str(update_id), f"tg:{chat_id}", kind, text, metadata, data)]


# ---- generic ----------------------------------------------------------------------------------
def generic_message(data: Any) -> Inbound:
    """``{"session_id": str, "message_id": str, "text": str, "metadata": {…} (optional)}``."""
    data = _obj(data, "The body")
    missing = [k for k in ("session_id", "message_id", "text") if k not in data]
    if missing:
        raise _bad(f"Missing field(s): {', '.join(missing)}.")
    text = data["text"]
    if not isinstance(text, str) or not text.strip():
        raise _bad("text must be a non-empty string.")
    if len(text) > MAX_TEXT:
        raise _bad(f"text is longer than {MAX_TEXT} characters.")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _bad("metadata must be an object.")
    metadata = {"channel": "generic", **metadata}
    return Inbound(Provider.GENERIC, _id(data["message_id"], "message_id"), _id(data["session_id"], "session_id"),
                   Kind.TEXT, text, metadata, data)
