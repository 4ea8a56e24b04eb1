"""Sending replies through the platforms' APIs (aiohttp, configurable base URLs).

- WhatsApp Cloud API: ``POST {WHATSAPP_API_BASE}/{phone_number_id}/messages`` with a bearer token
  (developers.facebook.com/docs/whatsapp/cloud-api/reference/messages; text bodies ≤ 4,096 chars).
- Telegram Bot API: ``POST {TELEGRAM_API_BASE}/bot{token}/sendMessage`` with ``parse_mode=HTML``; a
  text is at most 4,096 characters after entity parsing (core.telegram.org/bots/api#sendmessage),
  so longer answers are split by :func:`split_message` into several messages.
"""

from __future__ import annotations

import html
import re
from typing import Any

import aiohttp
from django.conf import settings

from webhooks_app import tracing
from webhooks_app.models import InboundDelivery

__all__ = ["LIMIT", "split_message", "send", "send_to", "utf16_len"]

LIMIT = 4096
_TOKEN = re.compile(r"<[^<>]*>|&#?\w+;|[\ud800-\udbff][\udc00-\udfff]|.", re.S)
_TAG = re.compile(r"<\s*(/?)\s*([a-zA-Z][\w-]*)[^>]*?(/?)\s*>")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (what Telegram counts): 2 for a character outside the BMP."""
    return len(text.encode("utf-16-le")) // 2


def _tokens(text: str) -> list[str]:
    """Unbreakable pieces: an HTML tag, an entity, one character (a whole surrogate pair if any)."""
    return _TOKEN.findall(text)


def split_message(text: str, limit: int = LIMIT) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` UTF-16 code units.

    Never inside an HTML tag, an entity or a surrogate pair; at the last newline, else the last space,
    of a full chunk when there is one in its second half. Tags open at a split are closed at the end
    of the chunk and opened again at the start of the next, so every chunk is balanced HTML.
    """
    if utf16_len(text) <= limit:
        return [text] if text else []
    chunks: list[str] = []
    open_tags: list[tuple[str, str]] = []  # (name, opening tag) of tags open at the current position
    tokens = _tokens(text)
    i = 0
    while i < len(tokens):
        prefix = "".join(tag for _, tag in open_tags)
        budget = limit - utf16_len(prefix)
        size, j, stack = 0, i, list(open_tags)
        breaks: list[tuple[int, list[tuple[str, str]]]] = []
        while j < len(tokens):
            tok = tokens[j]
            new_stack = _apply(stack, tok)
            closing = sum(len(name) + 3 for name, _ in new_stack)
            if size + utf16_len(tok) + closing > budget:
                break
            size += utf16_len(tok)
            stack = new_stack
            j += 1
            if tok in ("\n", " "):
                breaks.append((j, list(stack)))
        if j == i:
            raise ValueError("The limit is too small for the open tags and the next token.")
        if j < len(tokens):
            nl = [b for b in breaks if tokens[b[0] - 1] == "\n" and b[0] - i > (j - i) // 2]
            sp = [b for b in breaks if b[0] - i > (j - i) // 2]
            if nl or sp:
                j, stack = (nl or sp)[-1]
        body = "".join(tokens[i:j])
        closers = "".join(f"</{name}>" for name, _ in reversed(stack))
        chunks.append(prefix + body + closers)
        open_tags, i = stack, j
    return [c for c in chunks if c.strip()]


def _apply(stack: list[tuple[str, str]], tok: str) -> list[tuple[str, str]]:
    m = _TAG.fullmatch(tok) if tok.startswith("<") else None
    if m is None or m.group(3):
        return stack
    name = m.group(2).lower()
    if not m.group(1):
        return [*stack, (name, tok)]
    for k in range(len(stack) - 1, -1, -1):
        if stack[k][0] == name:
            return stack[:k] + stack[k + 1:]
    return stack


async def _post(client: aiohttp.ClientSession, url: str, **kwargs: Any) -> None:
    async with client.post(url, allow_redirects=False, **kwargs) as response:
        body = await response.read()
    if response.status >= 300:
        text = body.decode("utf-8", "replace")
        raise RuntimeError(f"{response.status} from {url.split('/bot')[0]}: {text[:300]}")


@tracing.reply_span
async def send(client: aiohttp.ClientSession, delivery: InboundDelivery, text: str) -> int:
    """Send ``text`` as the reply to ``delivery``; returns the number of messages sent. Raises on failure."""
    return await send_to(client, delivery.provider, delivery.metadata, text)


async def send_to(client: aiohttp.ClientSession, provider: str, meta: dict[str, Any], text: str) -> int:
    """Send ``text`` to the customer a channel's ``meta`` names (a delivery's or its session's metadata:
    WhatsApp ``phone_number_id`` and ``wa_id``, Telegram ``chat_id``), split as every reply is; returns
    the number of messages sent (0 for a provider without an API here). Raises on failure."""
    if provider == InboundDelivery.Provider.WHATSAPP:
        url = f"{settings.WHATSAPP_API_BASE.rstrip('/')}/{meta['phone_number_id']}/messages"
        parts = split_message(html.escape(text, quote=False))  # only to measure: WhatsApp shows text as is
        parts = [html.unescape(p) for p in parts] or [""]
        for part in parts:
            await _post(client, url, headers={"Authorization": f"Bearer {settings.WHATSAPP_ACCESS_TOKEN}"}, json={
                "messaging_product": "whatsapp", "recipient_type": "individual", "to": meta["wa_id"],
                "type": "text", "text": {"preview_url": False, "body": part},
            })
        return len(parts)
    if provider == InboundDelivery.Provider.TELEGRAM:
        url = f"{settings.TELEGRAM_API_BASE.rstrip('/')}/bot{settings.TELEGRAM_BOT_TOKEN}/sendMessage"
        parts = split_message(html.escape(text, quote=False)) or [html.escape(" ")]
        for part in parts:
            await _post(client, url, json={"chat_id": meta["chat_id"], "text": part,
                                           "parse_mode": "HTML"})
        return len(parts)
    return 0


def client() -> aiohttp.ClientSession:
    """The client replies go out on (call it on the event loop that sends): explicit timeouts (a redirect is
    never followed: :func:`_post`)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15.0, connect=5.0))
