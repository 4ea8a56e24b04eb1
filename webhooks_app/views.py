"""Webhook endpoints (acknowledge within milliseconds; turns run from the queue).

Every refusal is a 4xx JSON ``{"error": code, "detail": …}`` and writes nothing: the body is checked
(size, content type, signature, JSON, fields) before the one transaction of ``inbox.accept``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from webhooks_app import inbox, ledger, providers, settle, tracing
from webhooks_app.asgi import lean_webhook
from webhooks_app.counters import count_webhook
from webhooks_app.models import InboundDelivery
from webhooks_app.providers import Refused

WAIT_SECONDS = 60.0
#: A waiting request reads its delivery's status after the first of these (seconds), doubling up to the second.
WAIT_POLL_SECONDS = (0.02, 0.5)


def _refusal(err: Refused) -> JsonResponse:
    return JsonResponse({"error": err.code, "detail": err.detail}, status=err.status)


def _methods(*allowed: str) -> Callable:
    """``require_http_methods`` for the async webhook views, refusing with the JSON 405 (and ``Allow``); every
    answer is counted for ``/metrics`` (``chatflow_webhook_responses_total``)."""
    def decorator(view: Callable) -> Callable:
        @wraps(view)
        async def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in allowed:
                response = _refusal(Refused(405, "method_not_allowed",
                                            f"{request.method} is not allowed here; use {' or '.join(allowed)}."))
                response["Allow"] = ", ".join(allowed)
                count_webhook(view.__name__, 405)
                return response
            try:
                response = await view(request, *args, **kwargs)
            except Exception:
                count_webhook(view.__name__, 500)  # the lean path answers 500 for it
                raise
            count_webhook(view.__name__, response.status_code)
            return response
        return checked
    return decorator


def _body(request: HttpRequest) -> bytes:
    """The raw body, refused when too large (before reading it) or not JSON by content type."""
    limit = settings.CHATFLOW_WEBHOOK_MAX_BYTES
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not (length.isascii() and length.isdigit()):  # HTTP's 1*DIGIT: no sign, no spaces, no "1e3"
        raise Refused(400, "bad_content_length", "Content-Length is not a number.")
    declared = int(length)
    if declared > limit:
        raise Refused(413, "body_too_large", f"The body is larger than {limit} bytes.")
    if request.content_type != "application/json":
        raise Refused(415, "unsupported_media_type", "The body must be application/json.")
    try:
        body = request.body
    except RequestDataTooBig:  # above DATA_UPLOAD_MAX_MEMORY_SIZE, without a Content-Length
        raise Refused(413, "body_too_large", f"The body is larger than {limit} bytes.") from None
    if len(body) > limit:
        raise Refused(413, "body_too_large", f"The body is larger than {limit} bytes.")
    return body


def _configured(value: str, name: str) -> str:
    if not value:
        raise Refused(503, "not_configured", f"{name} is not set on this server.")
    return value


async def _accept(messages: list[inbox.Inbound]) -> inbox.Accepted:
    try:
        with tracing.acknowledging(messages) as traced:  # one trace per message (when tracing is on)
            return await inbox.aaccept(traced)
    except DatabaseError:
        # The provider will deliver again: that is what we want when nothing could be written.
        raise Refused(503, "unavailable", "The inbox is unavailable; deliver again later.") from None


def _acknowledged(accepted: inbox.Accepted, status: int = 200) -> JsonResponse:
    return JsonResponse({"ok": True, "queued": [d.pk for d in accepted.queued],
                         "duplicates": accepted.duplicates}, status=status)


# ---- WhatsApp ------------------------------------------------------------------------------------
@lean_webhook  # POSTs skip the browser middleware: see webhooks_app.asgi
@csrf_exempt
@_methods("GET", "POST")
async def whatsapp(request: HttpRequest) -> HttpResponse:
    """GET: Meta's verification handshake. POST: ``entry[].changes[].value.messages[]``."""
    try:
        if request.method == "GET":
            token = _configured(settings.WHATSAPP_VERIFY_TOKEN, "WHATSAPP_VERIFY_TOKEN")
            if request.GET.get("hub.mode") == "subscribe" and providers.hmac.compare_digest(
                request.GET.get("hub.verify_token", "").encode(), token.encode()
            ):
                return HttpResponse(request.GET.get("hub.challenge", ""), content_type="text/plain")
            raise Refused(403, "verification_failed", "hub.mode or hub.verify_token is wrong.")
        body = _body(request)
        secret = _configured(settings.WHATSAPP_APP_SECRET, "WHATSAPP_APP_SECRET")
        providers.check_hmac(body, request.headers.get("X-Hub-Signature-256"), secret, "X-Hub-Signature-256")
        messages = providers.whatsapp_messages(providers.parse_json(body))
        return _acknowledged(await _accept(messages))
    except Refused as err:
        return _refusal(err)


# ---- Telegram ------------------------------------------------------------------------------------
@lean_webhook  # POSTs skip the browser middleware: see webhooks_app.asgi
@csrf_exempt
@_methods("POST")
async def telegram(request: HttpRequest) -> HttpResponse:
    """An ``Update`` from ``setWebhook``; de-duplicated on ``update_id``; session ``tg:<chat id>``."""
    try:
        secret = _configured(settings.TELEGRAM_SECRET_TOKEN, "TELEGRAM_SECRET_TOKEN")
        providers.check_secret_token(request.headers.get("X-Telegram-Bot-Api-Secret-Token"), secret,
                                    "X-Telegram-Bot-Api-Secret-Token")
        body = _body(request)
        return _acknowledged(await _accept(providers.telegram_messages(providers.parse_json(body))))
    except Refused as err:
        return _refusal(err)


# ---- generic ---------------------------------------------------------------------------------------
async def _generic_accept(request: HttpRequest) -> tuple[inbox.Inbound, inbox.Accepted]:
    body = _body(request)
    secret = _configured(settings.CHATFLOW_WEBHOOK_SECRET, "CHATFLOW_WEBHOOK_SECRET")
    providers.check_hmac(body, request.headers.get("X-Chatflow-Signature"), secret, "X-Chatflow-Signature")
    message = providers.generic_message(providers.parse_json(body))
    return message, await _accept([message])


@lean_webhook  # POSTs skip the browser middleware: see webhooks_app.asgi
@csrf_exempt
@_methods("POST")
async def generic(request: HttpRequest) -> HttpResponse:
    """``{session_id, message_id, text, metadata}`` signed with CHATFLOW_WEBHOOK_SECRET.

    202 ``{"delivery": id}`` once queued; with ``?wait=true`` the request waits (up to ``WAIT_SECONDS``) for a
    queue worker to play the turn and returns its answer (200 ``{"answer": …}``; 502 with the error when the
    engine failed; 202 when no worker settled it in time). A duplicate → 200
    ``{"status": "duplicate"}``; with ``?wait=true`` a duplicate gets what the first request got: the
    answer of a finished delivery, or, for one still queued or running, the same wait for it. Message ids
    are de-duplicated across the channel, not per session: an id another session's message already has
    → 409 ``message_id_conflict`` (nothing queued, nothing of that session's returned).
    """
    wait = request.GET.get("wait", "").lower() in ("1", "true", "yes")
    try:
        message, accepted = await _generic_accept(request)
    except Refused as err:
        return _refusal(err)
    if accepted.conflicts:
        return _refusal(Refused(409, "message_id_conflict",
                                f"message_id {message.provider_message_id!r} is another session's message: ids are "
                                "de-duplicated across the channel, so use ids unique to each message."))
    if not accepted.queued:
        delivery_id = await _delivery_id(message) if wait else None
        if delivery_id is None:
            return JsonResponse({"ok": True, "status": "duplicate"}, status=200)
        return _answered(await _outcome(delivery_id), duplicate=True)
    delivery = accepted.queued[0]
    if not wait:
        return JsonResponse({"ok": True, "status": "queued", "delivery": delivery.pk}, status=202)
    return _answered(await _outcome(delivery.pk))


def _answered(final: InboundDelivery, duplicate: bool = False) -> JsonResponse:
    """The ``?wait=true`` answer: 200 with the answer, 502 with the error, 410 when its session was deleted
    (before it was played, or after: its answer went with it), 202 when still running."""
    body: dict[str, Any] = {"delivery": final.pk, "status": final.status, "session_id": final.session_id}
    if duplicate:
        body["duplicate"] = True
    if final.status == InboundDelivery.Status.DONE and final.error == settle.ANSWER_GONE:
        return JsonResponse({"ok": False, **body, "error": "session_deleted", "detail": final.error}, status=410)
    if final.status == InboundDelivery.Status.DONE:
        return JsonResponse({"ok": True, **body, "answer": final.answer})
    if final.status == InboundDelivery.Status.FAILED:
        return JsonResponse({"ok": False, **body, "error": "turn_failed", "detail": final.error}, status=502)
    if final.status == InboundDelivery.Status.CANCELLED:
        return JsonResponse({"ok": False, **body, "error": "session_deleted", "detail": final.error}, status=410)
    return JsonResponse({"ok": True, **body, "detail": "Still running; poll the console."}, status=202)


async def _delivery_id(message: inbox.Inbound) -> int | None:
    """The delivery a duplicate message belongs to (None if there is none)."""
    found = InboundDelivery.objects.filter(provider=message.provider, provider_message_id=message.provider_message_id,
                                           session_id=message.session_id)
    with ledger.queue_thread() as ex:
        return await asyncio.get_running_loop().run_in_executor(
            ex, lambda: found.values_list("pk", flat=True).first())


_SETTLED = (InboundDelivery.Status.DONE, InboundDelivery.Status.FAILED, InboundDelivery.Status.CANCELLED)


async def _outcome(delivery_id: int) -> InboundDelivery:
    """The delivery once a worker settled it (done, failed, cancelled), or as it is after ``WAIT_SECONDS``.

    The request only waits: the turn is played by a queue worker (the embedded one, or ``chatflow_worker``
    processes), like every delivery's, so a client that drops its connection cancels this wait and nothing
    else. It reads the delivery's status, more rarely as the wait goes on (``WAIT_POLL_SECONDS``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    pause = WAIT_POLL_SECONDS[0]
    with ledger.queue_thread() as ex:
        while True:
            final = await loop.run_in_executor(ex, lambda: InboundDelivery.objects.get(pk=delivery_id))
            if final.status in _SETTLED or loop.time() > deadline:
                return final
            await asyncio.sleep(pause)
            pause = min(pause * 2, WAIT_POLL_SECONDS[1])
