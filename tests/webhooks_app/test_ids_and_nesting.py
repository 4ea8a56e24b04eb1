"""Bodies the parsers must refuse with a 4xx JSON (not a 500, nothing written): nesting, and ids that cannot be
stored as sent (each channel alike)."""

from __future__ import annotations

import json
import logging

import pytest

from sessions_app.ids import SESSION_ID_MAX_LENGTH as MAX_ID
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import nothing_written, post_generic, post_tg, post_wa
from webhooks_app.models import InboundDelivery
from webhooks_app.providers import MAX_DEPTH

pytestmark = pytest.mark.django_db

DEEP = b"[" * 100_000 + b"]" * 100_000


def nested(levels: int) -> dict:
    """``{"n": {"n": … {"n": 1}}}`` with ``levels`` objects."""
    value: object = 1
    for _ in range(levels):
        value = {"n": value}
    return value  # type: ignore[return-value]


SEND = {
    "whatsapp": lambda c, body: post_wa(c, body),
    "telegram": lambda c, body: post_tg(c, body),
    "generic": lambda c, body: post_generic(c, body),
}


def refused(r, status: int = 400, code: str = "invalid_payload") -> None:
    assert r.status_code == status, r.content
    assert r["Content-Type"] == "application/json"
    assert r.json()["error"] == code and r.json()["detail"]
    assert nothing_written()


@pytest.mark.parametrize("channel", list(SEND))
def test_a_signed_deeply_nested_body_is_refused_with_400_json_on_every_webhook(client, channel, caplog):
    with caplog.at_level(logging.INFO):
        r = SEND[channel](client, DEEP)
    refused(r, code="nested_too_deeply")
    assert str(MAX_DEPTH) in r.json()["detail"]
    records = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert len(records) == 1 and records[0].exc_info is None  # one line, no traceback


@pytest.mark.parametrize("channel", list(SEND))
def test_a_body_nested_just_past_the_bound_is_refused_too(client, channel):
    refused(SEND[channel](client, json.dumps([nested(MAX_DEPTH)]).encode()), code="nested_too_deeply")


def test_moderately_nested_bodies_are_accepted(client):
    wa = json.loads(p.whatsapp(p.wa_text("wamid.N", "hi")))
    wa["entry"][0]["changes"][0]["value"]["messages"][0]["context"] = nested(12)
    assert post_wa(client, json.dumps(wa).encode()).status_code == 200
    tg = json.loads(p.telegram(77, "hi"))
    tg["message"]["reply_markup"] = nested(12)
    assert post_tg(client, json.dumps(tg).encode()).status_code == 200
    body = json.dumps({"session_id": "s-n", "message_id": "m-n", "text": "hi", "metadata": {"deep": nested(20)}})
    assert post_generic(client, body.encode()).status_code == 202
    generic = InboundDelivery.objects.get(provider="generic")
    assert generic.metadata["deep"] == nested(20)  # stored whole, not cut by the cleaning
    assert InboundDelivery.objects.count() == 3


# ---- ids: refused, never merged -------------------------------------------------------------------
UNSAFE = {
    "NUL": "a\x00b", "lone surrogate": "a\ud800b", "other lone surrogate": "a\udfffb", "newline": "a\nb",
    "escape": "a\x1bb", "C1 control": "a\x85b", "bidi override": "a\u202eb", "bidi isolate": "a\u2067b",
    "right-to-left mark": "a\u200fb", "leading space": " ab", "trailing space": "ab ",
    "too long": "x" * (MAX_ID + 1),
}


@pytest.mark.parametrize("value", list(UNSAFE.values()), ids=list(UNSAFE))
@pytest.mark.parametrize("field", ["session_id", "message_id"])
def test_generic_refuses_an_id_it_cannot_store_as_sent(client, field, value):
    body = {"session_id": "s1", "message_id": "m1", "text": "hi", field: value}
    refused(post_generic(client, json.dumps(body).encode()))


@pytest.mark.parametrize("value", list(UNSAFE.values()), ids=list(UNSAFE))
@pytest.mark.parametrize("field", ["from", "id"])
def test_whatsapp_refuses_an_id_it_cannot_store_as_sent(client, field, value):
    msg = {**p.wa_text("wamid.U", "hi"), field: value}
    refused(post_wa(client, p.whatsapp(msg)))


@pytest.mark.parametrize("value", [10 ** 300, 2 ** 63, -(2 ** 63) - 1], ids=["1e300", "2**63", "-2**63-1"])
@pytest.mark.parametrize("field", ["chat", "update_id"])
def test_telegram_refuses_ids_beyond_64_bits(client, field, value):
    body = p.telegram(value, "hi") if field == "update_id" else p.telegram(5, "hi", chat_id=value)
    refused(post_tg(client, body))


def test_telegram_accepts_the_widest_64_bit_ids(client):
    assert post_tg(client, p.telegram(2 ** 63 - 1, "hi", chat_id=-(2 ** 63))).status_code == 200
    d = InboundDelivery.objects.get()
    assert (d.provider_message_id, d.session_id) == (str(2 ** 63 - 1), f"tg:{-(2 ** 63)}")


def test_distinct_ids_stay_distinct_and_are_stored_as_sent(client):
    for session_id in ("web:\u00e9\U0001f600", "web:e\u0301", "ab"):
        body = {"session_id": session_id, "message_id": f"m-{session_id}", "text": "hi"}
        assert post_generic(client, json.dumps(body).encode()).status_code == 202
    assert sorted(InboundDelivery.objects.values_list("session_id", flat=True)) == sorted(
        ["web:\u00e9\U0001f600", "web:e\u0301", "ab"])
    assert post_generic(client, json.dumps({"session_id": "a\x00b", "message_id": "m-x", "text": "hi"}).encode()
                        ).status_code == 400
    assert InboundDelivery.objects.filter(session_id="ab").count() == 1  # "a\0b" was not merged into "ab"


def test_a_max_length_id_is_accepted_on_every_channel(client):
    long_id = "7" * MAX_ID
    assert post_wa(client, p.whatsapp(p.wa_text("w" * MAX_ID, "hi", wa_id=long_id))).status_code == 200
    assert post_generic(client, p.generic("s" * MAX_ID, "m" * MAX_ID, "hi")).status_code == 202
    assert InboundDelivery.objects.count() == 2
