"""The API's session JSON and filter carry the takeover mode; exports show operator-written messages by
their author; the private hand-back note is only in the operator view of a transcript (Operators only)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from api_app.models import ApiToken
from tests.sessions_app import personas
from tests.takeover_app import page_states

pytestmark = pytest.mark.django_db


def bearer(user) -> dict[str, str]:
    _token, secret = ApiToken.issue("tests", user)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


@pytest.fixture
def olga():
    return personas.operator()


@pytest.fixture
def human_session(olga):
    page_states.human("+15550100", olga, unread=2, note="Refund approved; be kind")
    page_states.operator_reply("+15550100", olga, "Your refund is on its way", status="sent")
    return "+15550100"


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_the_session_json_has_mode_owner_waiting_since_and_unread(client, olga, human_session):
    page_states.waiting("+15550111")
    auth = bearer(olga)
    one = client.get("/api/v1/sessions/+15550100", **auth).json()
    assert (one["mode"], one["owner"], one["unread"]) == ("human", "olga.operator", 2)
    waiting = client.get("/api/v1/sessions/+15550111", **auth).json()
    assert waiting["mode"] == "waiting" and waiting["owner"] is None
    assert waiting["waiting_since"].startswith("2026-01-10T09:00:00")
    page = client.get("/api/v1/sessions", {"mode": "waiting"}, **auth).json()
    assert [s["session_id"] for s in page["items"]] == ["+15550111"]
    bots = client.get("/api/v1/sessions", {"mode": "bot"}, **auth).json()
    assert bots["items"] == []
    refused = client.get("/api/v1/sessions", {"mode": "asleep"}, **auth)
    assert refused.status_code == 400 and "Unknown mode" in refused.json()["detail"]


def test_the_openapi_schema_documents_mode_and_the_operator_view(client, olga):
    schema = client.get("/api/v1/openapi.json", **bearer(olga)).json()
    out = schema["components"]["schemas"]["SessionOut"]["properties"]
    assert {"mode", "owner", "waiting_since", "unread"} <= set(out)
    params = {p["name"] for op in schema["paths"].values() for m in op.values() for p in m.get("parameters", [])}
    assert {"mode", "view"} <= params


def test_exports_show_operator_messages_by_their_author_and_never_the_private_note(client, olga, human_session):
    auth = bearer(olga)
    url = f"/api/v1/sessions/{human_session}/transcript"
    record = json.loads(body(client.get(url, **auth)))
    [reply] = [m for t in record["turns"] for m in t["messages"] if m.get("author")]
    assert reply["author"] == "olga.operator" and reply["content"] == "Your refund is on its way"
    assert "operator_view" not in record
    lines = [json.loads(line) for line in body(client.get(url, {"format": "jsonl"}, **auth)).splitlines()]
    assert [m["author"] for m in lines if "author" in m] == ["olga.operator"]
    rows = list(csv.DictReader(io.StringIO(body(client.get(url, {"format": "csv"}, **auth)).decode("utf-8-sig"))))
    assert [r["author"] for r in rows] == ["", "", "olga.operator"]
    md = body(client.get(url, {"format": "md"}, **auth)).decode()
    assert "**Operator · olga.operator** ·" in md
    for fmt in ("json", "jsonl", "csv", "md"):
        assert b"Refund approved" not in body(client.get(url, {"format": fmt}, **auth))


def test_the_operator_view_adds_the_note_and_deliveries_for_operators_only(client, olga, human_session):
    url = f"/api/v1/sessions/{human_session}/transcript"
    record = json.loads(body(client.get(url, {"view": "operator"}, **bearer(olga))))
    view = record["operator_view"]
    assert (view["mode"], view["owner"], view["private_note"]) == ("human", "olga.operator", "Refund approved; be kind")
    assert [(r["author"], r["status"]) for r in view["replies"]] == [("olga.operator", "sent")]
    assert client.get(url, {"view": "operator", "format": "csv"}, **bearer(olga)).status_code == 400
    assert client.get(url, {"view": "everything"}, **bearer(olga)).status_code == 400
    # a user with the export permission but not take_over (a Viewer given exports) is refused
    from django.contrib.auth.models import Permission

    viewer = personas.viewer()
    viewer.user_permissions.add(Permission.objects.get(codename="export_transcript"))
    refused = client.get(url, {"view": "operator"}, **bearer(viewer))
    assert refused.status_code == 403 and "take_over" in refused.json()["detail"]
    assert client.get(url, **bearer(viewer)).status_code == 200
