"""Webhook payloads as the providers send them, and their signatures."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

WA_SECRET = "wa-app-secret-for-tests"
WA_VERIFY = "wa-verify-token-for-tests"
WA_TOKEN = "wa-access-token-for-tests"
TG_SECRET = "tg-secret-token-for-tests"
TG_BOT = "123456:tg-bot-token-for-tests"
GENERIC_SECRET = "generic-secret-for-tests"
PHONE_NUMBER_ID = "106540352242922"

SETTINGS = {
    "WHATSAPP_APP_SECRET": WA_SECRET, "WHATSAPP_VERIFY_TOKEN": WA_VERIFY, "WHATSAPP_ACCESS_TOKEN": WA_TOKEN,
    "TELEGRAM_SECRET_TOKEN": TG_SECRET, "TELEGRAM_BOT_TOKEN": TG_BOT, "CHATFLOW_WEBHOOK_SECRET": GENERIC_SECRET,
}


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def wa_text(wamid: str, text: str, wa_id: str = "15550100", name: str = "Ana") -> dict[str, Any]:
    return {"from": wa_id, "id": wamid, "timestamp": "1764500000", "type": "text", "text": {"body": text}}


def whatsapp(*messages: dict[str, Any], statuses: list[dict[str, Any]] | None = None,
             wa_id: str = "15550100", name: str = "Ana") -> bytes:
    """A Cloud API webhook body (entry[].changes[].value) carrying ``messages``."""
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550000", "phone_number_id": PHONE_NUMBER_ID},
        "contacts": [{"profile": {"name": name}, "wa_id": wa_id}],
    }
    if messages:
        value["messages"] = list(messages)
    if statuses:
        value["statuses"] = statuses
    body = {"object": "whatsapp_business_account",
            "entry": [{"id": "WABA_ID", "changes": [{"field": "messages", "value": value}]}]}
    return json.dumps(body).encode()


def telegram(update_id: int, text: str | None, chat_id: int = 998877, **extra: Any) -> bytes:
    message: dict[str, Any] = {"message_id": update_id % 1000, "date": 1764500000,
                               "chat": {"id": chat_id, "type": "private"},
                               "from": {"id": chat_id, "is_bot": False, "first_name": "Tom"}}
    if text is not None:
        message["text"] = text
    message.update(extra)
    return json.dumps({"update_id": update_id, "message": message}).encode()


def generic(session_id: str, message_id: str, text: str, **metadata: Any) -> bytes:
    return json.dumps({"session_id": session_id, "message_id": message_id, "text": text,
                       "metadata": metadata}).encode()
