"""The webhook endpoints: verification, signatures, parsing, de-duplication and refusals (in process)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from sessions_app.models import ChatMessage, ChatSession, ProcessedMessage
from tests.webhooks_app import payloads as p
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db


def post_wa(client: Client, body: bytes, signature: str | None = "auto", **extra):
    headers = {}
    if signature == "auto":
        signature = p.sign(body, p.WA_SECRET)
    if signature is not None:
        headers["HTTP_X_HUB_SIGNATURE_256"] = signature
    return client.post("/webhooks/whatsapp/", body, content_type="application/json", **headers, **extra)


def post_tg(client: Client, body: bytes, secret: str | None = p.TG_SECRET, content_type="application/json"):
    headers = {} if secret is None else {"HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": secret}
    return client.post("/webhooks/telegram/", body, content_type=content_type, **headers)


def post_generic(client: Client, body: bytes, signature: str | None = "auto", query: str = "",
                 content_type="application/json"):
    headers = {}
    if signature == "auto":
        signature = p.sign(body, p.GENERIC_SECRET)
    if signature is not None:
        headers["HTTP_X_CHATFLOW_SIGNATURE"] = signature
    return client.post(f"/webhooks/generic/{query}", body, content_type=content_type, **headers)


def nothing_written() -> bool:
    return not (InboundDelivery.objects.exists() or ProcessedMessage.objects.exists()
                or ChatSession.objects.exists() or ChatMessage.objects.exists())


# ---- WhatsApp verification -------------------------------------------------------------------------
def test_it_echoes_the_challenge_for_the_right_verify_token(client):
    r = client.get("/webhooks/whatsapp/", {"hub.mode": "subscribe", "hub.verify_token": p.WA_VERIFY,
                                           "hub.challenge": "1158201444"})
    assert r.status_code == 200 and r.content == b"1158201444"


@pytest.mark.parametrize("params", [
    {"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1"},
    {"hub.mode": "unsubscribe", "hub.verify_token": p.WA_VERIFY, "hub.challenge": "1"},
    {"hub.challenge": "1"},
])
def test_it_refuses_verification_with_403(client, params):
    r = client.get("/webhooks/whatsapp/", params)
    assert r.status_code == 403 and r.json()["error"] == "verification_failed"


# ---- WhatsApp messages -------------------------------------------------------------------------------
def test_it_queues_a_text_message_with_the_senders_session_and_metadata(client):
    r = post_wa(client, p.whatsapp(p.wa_text("wamid.A1", "Where is order 404?")))
    assert r.status_code == 200 and r.json()["duplicates"] == 0
    d = InboundDelivery.objects.get()
    assert (d.provider, d.provider_message_id, d.session_id, d.kind, d.text, d.status) == (
        "whatsapp", "wamid.A1", "15550100", "text", "Where is order 404?", "queued")
    assert d.metadata == {"channel": "whatsapp", "phone_number_id": p.PHONE_NUMBER_ID, "wa_id": "15550100",
                          "profile_name": "Ana"}
    assert ProcessedMessage.objects.filter(pk="wamid.A1").exists()


def test_a_redelivery_only_counts_a_suppressed_duplicate(client):
    body = p.whatsapp(p.wa_text("wamid.A1", "hi"))
    for _ in range(3):
        assert post_wa(client, body).status_code == 200
    d = InboundDelivery.objects.get()
    assert d.duplicates_suppressed == 2 and d.status == "queued" and d.last_seen >= d.first_seen


def test_several_messages_in_one_payload_are_queued_in_order_and_statuses_ignored(client):
    body = p.whatsapp(p.wa_text("wamid.1", "one"), {"from": "15550100", "id": "wamid.2", "type": "audio",
                                                   "audio": {"id": "x"}}, p.wa_text("wamid.3", "three"),
                      statuses=[{"id": "wamid.0", "status": "delivered", "recipient_id": "15550100"}])
    r = post_wa(client, body)
    assert r.status_code == 200
    rows = list(InboundDelivery.objects.order_by("id").values_list("provider_message_id", "kind"))
    assert rows == [("wamid.1", "text"), ("wamid.2", "unsupported"), ("wamid.3", "text")]


def test_a_statuses_only_payload_is_acknowledged_and_writes_nothing(client):
    body = p.whatsapp(statuses=[{"id": "wamid.0", "status": "read", "recipient_id": "15550100"}])
    assert post_wa(client, body).status_code == 200
    assert nothing_written()


# ---- refusals: 4xx JSON, nothing written -------------------------------------------------------------
BAD_WA = [
    ("missing signature", lambda c: post_wa(c, p.whatsapp(p.wa_text("w1", "x")), signature=None), 401),
    ("wrong signature", lambda c: post_wa(c, p.whatsapp(p.wa_text("w1", "x")), signature="sha256=" + "0" * 64), 403),
    ("signature of another body", lambda c: post_wa(c, p.whatsapp(p.wa_text("w1", "x")),
                                                   signature=p.sign(b"{}", p.WA_SECRET)), 403),
    ("malformed JSON", lambda c: post_wa(c, b'{"entry": [', ), 400),
    ("not UTF-8", lambda c: post_wa(c, b'\xff\xfe{}'), 400),
    ("wrong content type", lambda c: c.post("/webhooks/whatsapp/", b"{}", content_type="text/plain",
                                            HTTP_X_HUB_SIGNATURE_256=p.sign(b"{}", p.WA_SECRET)), 415),
    ("oversized body", lambda c: post_wa(c, b'{"entry": [], "pad": "' + b"x" * 300_000 + b'"}'), 413),
    ("no entry", lambda c: post_wa(c, b'{"object": "whatsapp_business_account"}'), 400),
    ("entry not a list", lambda c: post_wa(c, b'{"entry": {}}'), 400),
    ("a JSON array", lambda c: post_wa(c, b"[]"), 400),
    ("message without id", lambda c: post_wa(c, p.whatsapp({"from": "1", "type": "text", "text": {"body": "x"}})),
     400),
    ("message without from", lambda c: post_wa(c, p.whatsapp({"id": "w9", "type": "text", "text": {"body": "x"}})),
     400),
    ("text without body", lambda c: post_wa(c, p.whatsapp({"id": "w9", "from": "1", "type": "text", "text": {}})),
     400),
    ("one bad message among good ones", lambda c: post_wa(c, p.whatsapp(
        p.wa_text("w1", "fine"), {"id": "w2", "from": "1", "type": "text", "text": {"body": 7}})), 400),
]


@pytest.mark.parametrize(("case", "send", "status"), BAD_WA, ids=[c[0] for c in BAD_WA])
def test_whatsapp_refuses_bad_input_with_4xx_json_and_writes_nothing(client, case, send, status):
    r = send(client)
    assert r.status_code == status, r.content
    assert r["Content-Type"] == "application/json" and r.json()["error"] and r.json()["detail"]
    assert nothing_written()


BAD_TG = [
    ("missing secret", lambda c: post_tg(c, p.telegram(1, "hi"), secret=None), 401),
    ("wrong secret", lambda c: post_tg(c, p.telegram(1, "hi"), secret="nope"), 403),
    ("malformed JSON", lambda c: post_tg(c, b"{nope"), 400),
    ("wrong content type", lambda c: post_tg(c, p.telegram(1, "hi"), content_type="application/x-www-form-urlencoded"),
     415),
    ("no update_id", lambda c: post_tg(c, b'{"message": {"chat": {"id": 1}, "text": "hi"}}'), 400),
    ("string update_id", lambda c: post_tg(c, b'{"update_id": "7", "message": {"chat": {"id": 1}}}'), 400),
    ("no chat", lambda c: post_tg(c, b'{"update_id": 7, "message": {"text": "hi"}}'), 400),
    ("oversized body", lambda c: post_tg(c, b'{"update_id": 1, "pad": "' + b"x" * 300_000 + b'"}'), 413),
]


@pytest.mark.parametrize(("case", "send", "status"), BAD_TG, ids=[c[0] for c in BAD_TG])
def test_telegram_refuses_bad_input_with_4xx_json_and_writes_nothing(client, case, send, status):
    r = send(client)
    assert r.status_code == status, r.content
    assert r.json()["error"]
    assert nothing_written()


BAD_GENERIC = [
    ("missing signature", lambda c: post_generic(c, p.generic("s1", "m1", "hi"), signature=None), 401),
    ("wrong signature", lambda c: post_generic(c, p.generic("s1", "m1", "hi"), signature="sha256=abc"), 403),
    ("malformed JSON", lambda c: post_generic(c, b'{"session_id": '), 400),
    ("wrong content type", lambda c: post_generic(c, p.generic("s1", "m1", "hi"), content_type="text/plain"), 415),
    ("missing text", lambda c: post_generic(c, json.dumps({"session_id": "s", "message_id": "m"}).encode()), 400),
    ("missing session_id", lambda c: post_generic(c, json.dumps({"message_id": "m", "text": "x"}).encode()), 400),
    ("empty message_id", lambda c: post_generic(c, json.dumps({"session_id": "s", "message_id": " ",
                                                                "text": "x"}).encode()), 400),
    ("metadata not an object", lambda c: post_generic(c, json.dumps({"session_id": "s", "message_id": "m",
                                                                      "text": "x", "metadata": [1]}).encode()), 400),
    ("oversized body", lambda c: post_generic(c, p.generic("s1", "m1", "x" * 300_000)), 413),
    ("GET", lambda c: c.get("/webhooks/generic/"), 405),
]


@pytest.mark.parametrize(("case", "send", "status"), BAD_GENERIC, ids=[c[0] for c in BAD_GENERIC])
def test_generic_refuses_bad_input_with_4xx_and_writes_nothing(client, case, send, status):
    r = send(client)
    assert r.status_code == status, r.content
    assert r.json()["error"]
    assert nothing_written()


GENERIC_TYPES = [
    # The documented body is {"session_id": str, "message_id": str, "text": str, "metadata": {…}}: an id sent as
    # a number would be stored as its digits (5 and "5" one session, one claim), not as sent.
    ("number session_id", {"session_id": 5}, "session_id must be a string"),
    ("number message_id", {"message_id": 7}, "message_id must be a string"),
    ("metadata an empty list", {"metadata": []}, "metadata must be an object"),
    ("metadata an empty string", {"metadata": ""}, "metadata must be an object"),
    ("metadata false", {"metadata": False}, "metadata must be an object"),
    ("metadata.channel an object", {"metadata": {"channel": {"name": "web"}}}, "metadata.channel must be a"),
    ("metadata.channel a number", {"metadata": {"channel": 3}}, "metadata.channel must be a"),
    ("metadata.channel empty", {"metadata": {"channel": ""}}, "metadata.channel must be a"),
]


@pytest.mark.parametrize(("case", "fields", "detail"), GENERIC_TYPES, ids=[c[0] for c in GENERIC_TYPES])
def test_generic_refuses_fields_of_the_wrong_type_with_400_json(client, case, fields, detail):
    body = {"session_id": "web:1", "message_id": "m-1", "text": "hi", **fields}
    r = post_generic(client, json.dumps(body).encode())
    assert r.status_code == 400, r.content
    assert r.json()["error"] == "invalid_payload" and detail in r.json()["detail"]
    assert nothing_written()


@pytest.mark.parametrize(("metadata", "stored"), [
    (None, {"channel": "generic"}),  # metadata is optional: absent
    ({"metadata": None}, {"channel": "generic"}),  # or null
    ({"metadata": {}}, {"channel": "generic"}),
    ({"metadata": {"channel": "web", "locale": "pt-BR"}}, {"channel": "web", "locale": "pt-BR"}),
])
def test_generic_takes_metadata_as_an_object_or_not_at_all(client, metadata, stored):
    body = {"session_id": "web:1", "message_id": "m-1", "text": "hi", **(metadata or {})}
    assert post_generic(client, json.dumps(body).encode()).status_code == 202
    assert InboundDelivery.objects.get().metadata == stored


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("get", "/webhooks/generic/", "POST"),
    ("put", "/webhooks/generic/", "POST"),
    ("get", "/webhooks/telegram/", "POST"),
    ("delete", "/webhooks/telegram/", "POST"),
    ("put", "/webhooks/whatsapp/", "GET, POST"),
    ("patch", "/webhooks/whatsapp/", "GET, POST"),
])
def test_a_wrong_method_is_a_json_405_naming_the_allowed_ones(client, method, path, allowed):
    r = getattr(client, method)(path)

    assert r.status_code == 405 and r["Allow"] == allowed
    assert r["Content-Type"] == "application/json"
    assert r.json() == {"error": "method_not_allowed",
                        "detail": f"{method.upper()} is not allowed here; use {allowed.replace(', ', ' or ')}."}
    assert nothing_written()


@pytest.mark.parametrize("length", ["abc", "12abc", "1e3", "-5", "+5", " 5", "٥"])
def test_a_content_length_that_is_not_a_number_is_a_json_400(client, length):
    body = p.generic("s1", "m1", "hi")
    for path, headers in (("/webhooks/generic/", {"HTTP_X_CHATFLOW_SIGNATURE": p.sign(body, p.GENERIC_SECRET)}),
                          ("/webhooks/whatsapp/", {"HTTP_X_HUB_SIGNATURE_256": p.sign(body, p.WA_SECRET)}),
                          ("/webhooks/telegram/", {"HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": p.TG_SECRET})):
        r = client.post(path, body, content_type="application/json", CONTENT_LENGTH=length, **headers)
        assert r.status_code == 400, (path, r.content)
        assert r.json() == {"error": "bad_content_length", "detail": "Content-Length is not a number."}
    assert nothing_written()


def test_an_unconfigured_secret_refuses_every_post(client, settings):
    settings.WHATSAPP_APP_SECRET = ""
    r = post_wa(client, p.whatsapp(p.wa_text("w1", "x")))
    assert r.status_code == 503 and r.json()["error"] == "not_configured"
    assert nothing_written()


# ---- Telegram and generic acceptance ----------------------------------------------------------------
def test_telegram_queues_on_the_chat_session_and_dedups_on_update_id(client):
    assert post_tg(client, p.telegram(5001, "hello")).status_code == 200
    assert post_tg(client, p.telegram(5001, "hello")).status_code == 200
    d = InboundDelivery.objects.get()
    assert (d.session_id, d.provider_message_id, d.kind, d.duplicates_suppressed) == ("tg:998877", "5001", "text", 1)
    assert ProcessedMessage.objects.filter(pk="telegram:5001").exists()


def test_telegram_reset_and_unsupported_kinds(client):
    post_tg(client, p.telegram(1, "/reset"))
    post_tg(client, p.telegram(2, "/reset@chatflow_bot"))
    post_tg(client, p.telegram(3, None, photo=[{"file_id": "x"}]))
    assert list(InboundDelivery.objects.order_by("id").values_list("kind", flat=True)) == ["reset", "reset",
                                                                                          "unsupported"]


def test_telegram_updates_without_a_message_are_acknowledged_and_ignored(client):
    r = post_tg(client, json.dumps({"update_id": 9, "edited_message": {"chat": {"id": 1}}}).encode())
    assert r.status_code == 200 and nothing_written()


def test_generic_answers_202_then_200_for_a_duplicate(client):
    body = p.generic("web:42", "m-1", "hi", locale="pt-BR")
    r = post_generic(client, body)
    assert r.status_code == 202 and r.json()["status"] == "queued"
    r = post_generic(client, body)
    assert r.status_code == 200 and r.json()["status"] == "duplicate"
    d = InboundDelivery.objects.get()
    assert d.metadata == {"channel": "generic", "locale": "pt-BR"} and d.duplicates_suppressed == 1


@pytest.mark.django_db(transaction=True)
def test_the_inbox_thread_waits_for_a_held_sqlite_write_lock_and_then_accepts():
    """The inbox's own lock polling (no SQLite busy handler back-off): accepted just after the lock frees."""
    import sqlite3
    import threading
    import time

    from django.db import connection, connections

    from webhooks_app import inbox

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    result: list = []

    def accept() -> None:
        try:
            result.append(inbox._accept_on_inbox_thread([inbox.Inbound("generic", "m-lock", "s", text="hi")]))
        finally:
            connections.close_all()

    thread = threading.Thread(target=accept)
    thread.start()
    time.sleep(0.3)
    assert not result  # still waiting for the lock
    holder.execute("ROLLBACK")
    holder.close()
    thread.join(10)  # a hang guard; how soon after the release it accepts is measured by bench/webhooks.py
    assert result and len(result[0].queued) == 1
    assert InboundDelivery.objects.filter(provider_message_id="m-lock").exists()


@pytest.mark.parametrize("send", [
    lambda c, text: post_wa(c, p.whatsapp(p.wa_text("wamid.S1", text))),
    lambda c, text: post_tg(c, p.telegram(41, text)),
    lambda c, text: post_generic(c, p.generic("s1", "m1", text)),
], ids=["whatsapp", "telegram", "generic"])
def test_a_lone_surrogate_or_nul_in_the_text_is_cleaned_not_a_500(client, send):
    # json.dumps escapes them as \ud800 and \u0000: valid JSON that SQLite/PostgreSQL cannot store as is.
    r = send(client, "a\ud800b\x00c")
    assert r.status_code in (200, 202), r.content
    assert InboundDelivery.objects.get().text == "a\ufffdbc"


@pytest.mark.parametrize("debug", [False, True])
def test_the_webhooks_answer_without_their_trailing_slash(client, settings, debug):
    """A provider configured without the slash reaches the endpoint: no redirect that drops the body (and,
    with DEBUG, no 500 from APPEND_SLASH)."""
    settings.DEBUG = debug
    body = p.generic("web:slash", "m-slash", "hello")
    r = client.post("/webhooks/generic", body, content_type="application/json",
                    HTTP_X_CHATFLOW_SIGNATURE=p.sign(body, p.GENERIC_SECRET))
    assert r.status_code == 202, r.content
    assert InboundDelivery.objects.filter(session_id="web:slash").count() == 1
    body = p.whatsapp(p.wa_text("wamid.slash", "hi"))
    r = client.post("/webhooks/whatsapp", body, content_type="application/json",
                    HTTP_X_HUB_SIGNATURE_256=p.sign(body, p.WA_SECRET))
    assert r.status_code == 200, r.content
    r = client.post("/webhooks/telegram", p.telegram(1, "hi"), content_type="application/json",
                    HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=p.TG_SECRET)
    assert r.status_code == 200, r.content
    assert InboundDelivery.objects.count() == 3
