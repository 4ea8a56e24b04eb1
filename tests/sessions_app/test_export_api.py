"""The /api/v1/ sessions and export API: auth (tokens, console login), permissions, errors, pagination, weird ids,
downloads, audit, the offline docs page, tokens' admin and command, and generated requests (hypothesis)."""

from __future__ import annotations

import base64
import io
import json
import re
from datetime import timedelta
from urllib.parse import quote, unquote

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_app.models import ApiToken, hash_secret
from sessions_app.models import ChatSession, OperatorAction
from tests.sessions_app import personas
from tests.sessions_app.conversations import T0, model, store, support_story, user

pytestmark = pytest.mark.django_db
WEIRD_IDS = ["a/b", "olá 👋", "+15550100", "x" * 255, "tg:998877", "a b?c#d%e&f=g", "ends/with/slash/", "🦜" * 60]


def bearer_for(user) -> dict[str, str]:
    _token, secret = ApiToken.issue("tests", user)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


@pytest.fixture
def operator():
    return personas.operator()


@pytest.fixture
def auth(operator):
    return bearer_for(operator)


def url(session_id: str, tail: str = "") -> str:
    return f"/api/v1/sessions/{quote(session_id, safe='/')}{tail}"


def body_of(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


# ---- auth ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/api/v1/sessions", "/api/v1/sessions/s1", "/api/v1/sessions/s1/transcript",
                                  "/api/v1/export.jsonl", "/api/v1/sessions/", "/api/v1/sessions/s1/",
                                  "/api/v1/sessions/nope/", "/api/v1/no-such-endpoint", "/api/v1/openapi.json"])
def test_it_answers_401_without_credentials(path):
    store("s1", [user("hi")])

    response = Client().get(path)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "detail" in response.json()


@pytest.mark.parametrize("header", ["Bearer nope", "Bearer cft_" + "x" * 43, "Basic dXNlcjpwYXNz", "Bearer",
                                    "bearer  "])
def test_a_wrong_or_malformed_token_is_401(header):
    response = Client().get("/api/v1/sessions", HTTP_AUTHORIZATION=header)

    assert response.status_code == 401


def test_a_revoked_token_or_an_inactive_owner_is_401(operator):
    token, secret = ApiToken.issue("old", operator)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    assert Client().get("/api/v1/sessions", **headers).status_code == 200

    token.revoke()
    assert Client().get("/api/v1/sessions", **headers).status_code == 401

    _t, fresh = ApiToken.issue("new", operator)
    operator.is_active = False
    operator.save()
    assert Client().get("/api/v1/sessions", HTTP_AUTHORIZATION=f"Bearer {fresh}").status_code == 401


@pytest.mark.parametrize("persona", [personas.viewer, personas.outsider, personas.customer])
def test_it_answers_403_without_the_export_permission(persona):
    store("s1", [user("hi")])
    who = persona()
    for client, headers in ((personas.client_for(who), {}), (Client(), bearer_for(who))):
        for path in ("/api/v1/sessions", url("s1"), url("s1", "/transcript"), "/api/v1/export.jsonl"):
            response = client.get(path, **headers)
            assert response.status_code == 403, (persona.__name__, path)
    assert not OperatorAction.objects.filter(action="export").exists()


def test_the_api_pages_urls_with_a_trailing_slash_work(auth):
    store("s1", [user("hi")])
    store("s1-other", [user("other")])

    listed = Client().get("/api/v1/sessions/", **auth)
    shown = Client().get("/api/v1/sessions/s1/", **auth)
    missing = Client().get("/api/v1/sessions/nope/", **auth)

    assert listed.status_code == 200
    assert listed.json() == Client().get("/api/v1/sessions", **auth).json()
    assert shown.status_code == 200 and shown.json()["session_id"] == "s1"
    assert missing.status_code == 404 and missing.json()["detail"] == "No session 'nope/'."


def test_an_id_that_ends_with_a_slash_is_itself_before_the_id_without_it(auth):
    store("a", [user("a")])
    store("a/", [user("a slash")])

    assert Client().get("/api/v1/sessions/a/", **auth).json()["session_id"] == "a/"
    assert Client().get("/api/v1/sessions/a", **auth).json()["session_id"] == "a"


def test_a_method_other_than_get_is_a_json_405(auth):
    store("s1", [user("hi")])
    paths = ["/api/v1/sessions", "/api/v1/sessions/", "/api/v1/sessions/s1", "/api/v1/sessions/s1/transcript",
             "/api/v1/export.jsonl", "/api/v1/nowhere", "/api/v1/openapi.json", "/api/v1/docs"]

    for path in paths:
        for method in ("post", "put", "patch", "delete", "options"):
            response = getattr(Client(), method)(path, **auth)
            assert response.status_code == 405, (method, path)
            assert response["Content-Type"].startswith("application/json") and response["Allow"] == "GET"
            assert response.json()["error"] == "method_not_allowed"
            assert f"{method.upper()} is not allowed on {path}" in response.json()["detail"]
    assert ChatSession.objects.filter(pk="s1").exists() and not OperatorAction.objects.exists()


def test_a_logged_in_operator_uses_the_api_with_the_console_session(operator):
    store("s1", [user("hi")])

    response = personas.client_for(operator).get("/api/v1/sessions")

    assert response.status_code == 200
    assert [s["session_id"] for s in response.json()["items"]] == ["s1"]


def test_tokens_are_stored_hashed_and_record_their_last_use(operator):
    token, secret = ApiToken.issue("bi", operator)
    assert secret.startswith("cft_") and len(secret) > 40
    assert token.token_hash == hash_secret(secret) and secret not in token.token_hash
    assert token.last_used_at is None

    Client().get("/api/v1/sessions", HTTP_AUTHORIZATION=f"Bearer {secret}")

    token.refresh_from_db()
    assert token.last_used_at is not None


def test_the_token_command_creates_lists_and_revokes(operator):
    out = io.StringIO()
    call_command("chatflow_token", "create", "nightly", "--user", operator.username, stdout=out)
    secret = out.getvalue().strip()
    assert Client().get("/api/v1/sessions", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200

    listing = io.StringIO()
    call_command("chatflow_token", "list", stdout=listing)
    assert "nightly" in listing.getvalue() and secret not in listing.getvalue()

    call_command("chatflow_token", "revoke", "nightly", stdout=io.StringIO())
    assert Client().get("/api/v1/sessions", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401
    with pytest.raises(CommandError):
        call_command("chatflow_token", "create", "x", "--user", "nobody", stdout=io.StringIO())


def test_the_admin_shows_a_new_tokens_secret_once(operator):
    admin = personas._user("root.admin")
    admin.is_superuser = True
    admin.save()
    client = personas.client_for(admin)

    response = client.post("/admin/api_app/apitoken/add/", {"name": "from admin", "owner": operator.pk}, follow=True)

    token = ApiToken.objects.get(name="from admin")
    secret = re.search(r"cft_[A-Za-z0-9_\-]{43}", response.content.decode()).group(0)
    assert token.token_hash == hash_secret(secret)
    assert secret not in client.get(f"/admin/api_app/apitoken/{token.pk}/change/").content.decode()


# ---- errors -------------------------------------------------------------------------------------
def test_an_unknown_session_is_a_json_404(auth):
    for path in (url("nope"), url("nope", "/transcript"), url("no/such/id", "/transcript?format=md")):
        response = Client().get(path, **auth)
        assert response.status_code == 404, path
        assert response["Content-Type"].startswith("application/json")
        assert "detail" in response.json()


def test_an_unknown_format_is_a_400_naming_the_valid_ones(auth):
    store("s1", [user("hi")])

    response = Client().get(url("s1", "/transcript?format=xml"), **auth)

    assert response.status_code == 400
    assert all(f in response.json()["detail"] for f in ("json", "jsonl", "md", "csv"))


@pytest.mark.parametrize("params", ["cursor=%%%", "cursor=bm90IGpzb24", "cursor=WzEsMl0", "sort=sideways",
                                    "updated_from=2026-02-30", "updated_to=yesterday", "limit=many", "redact=all",
                                    "updated_from=2026-01-13&updated_to=2026-01-11",
                                    "cursor=" + base64.urlsafe_b64encode(b"[" * 1490).decode()])
def test_bad_list_parameters_are_400(auth, params):
    response = Client().get(f"/api/v1/sessions?{params}", **auth)

    assert response.status_code == 400, response.content
    assert "detail" in response.json()


# ---- listing ------------------------------------------------------------------------------------
def test_the_list_pages_with_an_opaque_cursor_and_the_console_filters(auth):
    for i in range(7):
        store(f"s{i}", [user(f"hello {i}"), model("hi")], agent="Billing" if i % 2 else "Support",
              metadata={"channel": "telegram" if i < 3 else "whatsapp"}, updated=T0 + timedelta(minutes=i))

    seen, cursor = [], ""
    while True:
        page = Client().get(f"/api/v1/sessions?limit=3&cursor={cursor}", **auth).json()
        seen += [s["session_id"] for s in page["items"]]
        if not page["next_cursor"]:
            break
        cursor = page["next_cursor"]
    assert seen == [f"s{i}" for i in reversed(range(7))]

    filtered = Client().get("/api/v1/sessions?agent=Billing&channel=whatsapp&sort=updated", **auth).json()
    assert [s["session_id"] for s in filtered["items"]] == ["s3", "s5"]
    found = Client().get("/api/v1/sessions?q=hello%205", **auth).json()
    assert [s["session_id"] for s in found["items"]] == ["s5"]
    item = found["items"][0]
    assert item["message_count"] == 2 and item["turn_count"] == 1 and item["last_message"]["text"] == "hi"


def test_an_oversized_page_size_is_capped(auth):
    ChatSession.objects.bulk_create([ChatSession(session_id=f"bulk-{i:04d}", active_agent_name="Support",
                                                 created_at=T0, updated_at=T0) for i in range(205)])

    page = Client().get("/api/v1/sessions?limit=100000", **auth).json()
    small = Client().get("/api/v1/sessions?limit=0", **auth).json()
    default = Client().get("/api/v1/sessions", **auth).json()

    assert len(page["items"]) == 200 and page["next_cursor"]
    assert len(small["items"]) == 1
    assert len(default["items"]) == 50


def test_one_session_has_metadata_agent_counts_and_timestamps(auth):
    store("+15550100", support_story(), agent="Billing", metadata={"channel": "whatsapp"})

    data = Client().get(url("+15550100"), **auth).json()

    assert data["session_id"] == "+15550100" and data["active_agent"] == "Billing"
    assert data["metadata"] == {"channel": "whatsapp"}
    assert data["message_count"] == 15 and data["turn_count"] == 3 and data["running"] is False
    assert data["created_at"].startswith("2026-01-10T09:00:00")


# ---- weird ids and downloads ----------------------------------------------------------------------
@pytest.mark.parametrize("session_id", WEIRD_IDS)
def test_any_session_id_works_and_gets_a_safe_download_name(auth, session_id):
    store(session_id, [user("hi 👋"), model("hello")])

    show = Client().get(url(session_id), **auth)
    assert show.status_code == 200 and show.json()["session_id"] == session_id
    for fmt in ("json", "jsonl", "md", "csv"):
        response = Client().get(url(session_id, f"/transcript?format={fmt}"), **auth)
        assert response.status_code == 200, fmt
        body_of(response).decode("utf-8")
        disposition = response["Content-Disposition"]
        disposition.encode("ascii")  # a header value must be ASCII
        ascii_name = re.search(r'filename="([^"]*)"', disposition).group(1)
        assert re.fullmatch(r"[A-Za-z0-9._+\-]+", ascii_name) and ascii_name.endswith(f".{fmt}")
        exact = unquote(re.search(r"filename\*=UTF-8''(\S+)", disposition).group(1))
        assert "/" not in exact and exact.endswith(f".{fmt}")
    listed = Client().get(f"/api/v1/sessions?q={quote(session_id)}", **auth).json()
    assert session_id in [s["session_id"] for s in listed["items"]]


@pytest.mark.parametrize("session_id", ["+15550100199", "wa:+1 555 010 0199", "ana@example.com"])
def test_a_redacted_export_masks_the_contact_in_the_session_id_and_the_file_name(auth, session_id):
    store(session_id, [user("hi"), model("hello")], metadata={"phone": "+15550100199"})
    secrets = ("5550100199", "555 010 0199", "ana@example.com", "ana%40example.com")

    for fmt in ("json", "jsonl", "md", "csv"):
        response = Client().get(url(session_id, f"/transcript?format={fmt}&redact=contacts"), **auth)
        assert response.status_code == 200, fmt
        text = body_of(response).decode("utf-8")
        disposition = unquote(response["Content-Disposition"])
        for secret in secrets:
            assert secret not in text and secret not in disposition, (fmt, secret)
        assert "[phone]" in text or "[email]" in text, fmt
    bulk = Client().get("/api/v1/export.jsonl?redact=contacts", **auth)
    text = body_of(bulk).decode("utf-8") + unquote(bulk["Content-Disposition"])
    assert not any(secret in text for secret in secrets)
    plain = Client().get(url(session_id, "/transcript?format=csv"), **auth)
    assert session_id in body_of(plain).decode("utf-8")


# ---- audit --------------------------------------------------------------------------------------
def test_every_export_is_written_to_the_audit_log(operator, auth):
    store("s1", [user("hi")])

    Client().get(url("s1", "/transcript?format=md&redact=contacts"), **auth)
    personas.client_for(operator).get(url("s1", "/transcript?format=csv"))
    body_of(Client().get("/api/v1/export.jsonl?channel=web", **auth))
    Client().get("/api/v1/sessions", **auth)  # listing is not an export

    entries = list(OperatorAction.objects.filter(action="export").order_by("id"))
    assert [(e.session_id, e.after["format"]) for e in entries] == [("s1", "md"), ("s1", "csv"), ("*", "jsonl")]
    assert all(e.actor == operator for e in entries)
    assert entries[0].after["via"].startswith("token 'tests'") and entries[0].after["redact"] == "contacts"
    assert entries[1].after["via"] == "session"
    assert entries[2].after["filters"] == {"channel": "web"}


# ---- bulk export ----------------------------------------------------------------------------------
def test_the_bulk_export_streams_one_transcript_per_matching_session(auth, monkeypatch):
    from console_app import export

    monkeypatch.setattr(export, "SESSION_BATCH", 2)
    for i in range(5):
        store(f"s{i}", [user(f"hi {i}"), model("yo")], metadata={"channel": "web" if i != 2 else "sms"},
              updated=T0 + timedelta(minutes=i))

    response = Client().get("/api/v1/export.jsonl?channel=web&sort=updated", **auth)

    assert response.streaming and response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    assert 'filename="sessions-all.jsonl"' in response["Content-Disposition"]
    lines = [json.loads(line) for line in body_of(response).decode("utf-8").splitlines()]
    assert [d["session"]["session_id"] for d in lines] == ["s0", "s1", "s3", "s4"]
    assert lines[0]["turns"][0]["messages"][0]["content"] == "hi 0"



@pytest.mark.parametrize("sort", ["", "sort=-updated", "sort=-tokens", "sort=agent"])
def test_the_bulk_export_leaves_out_no_session_that_a_turn_moves_while_it_runs(auth, monkeypatch, sort):
    from django.utils import timezone

    from console_app import export

    monkeypatch.setattr(export, "SESSION_BATCH", 2)
    monkeypatch.setattr(export, "CHUNK", 1)  # a line a chunk: the export is read a session at a time
    for i in range(6):
        store(f"s{i}", [user(f"hi {i}"), model("yo")], updated=T0 + timedelta(minutes=i))

    chunks = iter(Client().get(f"/api/v1/export.jsonl?{sort}", **auth).streaming_content)
    seen = [json.loads(next(chunks))["session"]["session_id"]]
    ChatSession.objects.filter(pk="s2").update(updated_at=timezone.now(), active_agent_name="Billing")  # its turn
    seen += [json.loads(chunk)["session"]["session_id"] for chunk in chunks]
    assert sorted(seen) == [f"s{i}" for i in range(6)]  # each once
    assert seen == [f"s{i}" for i in range(6)]  # oldest first (then by id): the order of what never changes

# ---- OpenAPI and docs ------------------------------------------------------------------------------
def test_the_docs_and_the_schema_need_the_apis_credentials(operator):
    page, schema = "/api/v1/docs", "/api/v1/openapi.json"
    anonymous = Client()

    assert anonymous.get(page).status_code == 302
    assert anonymous.get(page)["Location"] == "/accounts/login/?next=/api/v1/docs"
    refused = anonymous.get(schema)
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert "Authentication required" in refused.json()["detail"]
    assert Client().get(schema, HTTP_AUTHORIZATION="Bearer nope").status_code == 401

    for client, headers in ((personas.client_for(operator), {}), (Client(), bearer_for(operator))):
        assert client.get(page, **headers).status_code == 200
        assert client.get(schema, **headers).json()["openapi"].startswith("3.")


@pytest.mark.parametrize("persona", [personas.viewer, personas.outsider, personas.customer])
def test_the_docs_and_the_schema_need_the_export_permission(persona):
    who = persona()
    for client, headers in ((personas.client_for(who), {}), (Client(), bearer_for(who))):
        for path in ("/api/v1/docs", "/api/v1/openapi.json"):
            response = client.get(path, **headers)
            assert response.status_code == 403, (persona.__name__, path)
            assert "export_transcript" in response.json()["detail"]


def test_the_openapi_schema_lists_the_endpoints(auth):
    schema = Client().get("/api/v1/openapi.json", **auth).json()

    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/sessions", "/api/v1/sessions/{session_id}", "/api/v1/sessions/{session_id}/transcript",
            "/api/v1/export.jsonl"} <= set(schema["paths"])
    assert "BearerToken" in schema["components"]["securitySchemes"]


def test_the_openapi_schema_has_no_duplicate_keys(auth):
    """Swagger UI parses the schema as YAML and refuses a duplicated key ("duplicated mapping key"): an
    ``openapi_extra`` response keyed "200" beside ninja's int 200 used to serialise as two "200" keys."""
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicated keys in {keys}"
        return dict(pairs)

    schema = json.loads(Client().get("/api/v1/openapi.json", **auth).content, object_pairs_hook=no_duplicates)
    transcript = schema["paths"]["/api/v1/sessions/{session_id}/transcript"]["get"]["responses"]["200"]
    assert {"application/json", "application/x-ndjson", "text/markdown", "text/csv"} <= set(transcript["content"])
    bulk = schema["paths"]["/api/v1/export.jsonl"]["get"]["responses"]["200"]
    assert "application/x-ndjson" in bulk["content"]


def test_the_docs_page_works_offline(operator):
    response = personas.client_for(operator).get("/api/v1/docs")

    html = response.content.decode()
    assert response.status_code == 200
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html, re.I), "the docs page references another host"
    assert '"validatorUrl": null' in html
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        served = Client().get(asset)
        assert served.status_code == 200, asset
        served.close()


# ---- generated requests --------------------------------------------------------------------------
ids = st.text(min_size=1, max_size=40)
params = st.dictionaries(
    st.sampled_from(["q", "agent", "channel", "updated_from", "updated_to", "sort", "cursor", "limit", "redact",
                     "format"]),
    st.one_of(st.text(max_size=30), st.integers(-10**6, 10**6).map(str),
              st.sampled_from(["json", "jsonl", "md", "csv", "contacts", "-created", "2026-01-10", "2026-02-30"])),
    max_size=5,
)


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(endpoint=st.sampled_from(["list", "show", "transcript", "export"]), session_id=ids, query=params,
       existing=st.booleans())
def test_generated_requests_never_get_a_500(auth, endpoint, session_id, query, existing):
    """Every operation of the OpenAPI schema with generated ids and parameters: 2xx or a 4xx JSON error."""
    ChatSession.objects.get_or_create(session_id="+15550100 olá 👋",
                                      defaults={"active_agent_name": "Support", "created_at": T0, "updated_at": T0})
    sid = "+15550100 olá 👋" if existing else session_id
    qs = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
    path = {"list": "/api/v1/sessions", "show": url(sid), "transcript": url(sid, "/transcript"),
            "export": "/api/v1/export.jsonl"}[endpoint]

    response = Client().get(f"{path}?{qs}", **auth)
    body = body_of(response)

    assert response.status_code < 500, (path, qs, body[:300])
    body.decode("utf-8")
    if response.status_code >= 400:
        assert "detail" in json.loads(body)


# ---- ASGI -----------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_under_asgi_downloads_stream_through_an_async_iterator(monkeypatch):
    """Django buffers a sync iterator whole under ASGI (with a warning, an error here): ours is async."""
    from asgiref.sync import sync_to_async
    from django.db import connections
    from django.test import AsyncClient

    from console_app import export

    monkeypatch.setattr(export, "CHUNK", 64)

    def setup() -> dict[str, str]:
        for i in range(3):
            store(f"s{i}", support_story(), updated=T0 + timedelta(minutes=i))
        return bearer_for(personas.operator())

    headers = await sync_to_async(setup)()
    for path in ("/api/v1/export.jsonl", url("s1", "/transcript?format=jsonl"), url("s1", "/transcript?format=md")):
        response = await AsyncClient().get(path, headers={"Authorization": headers["HTTP_AUTHORIZATION"]})
        assert response.status_code == 200 and response.streaming and response.is_async
        chunks = [chunk async for chunk in response.streaming_content]
        assert len(chunks) >= 3  # one per session or line at least: pulled one by one, not buffered
        b"".join(chunks).decode("utf-8")
    # setup() ran on asgiref's long-lived sync thread: close its connection (PostgreSQL refuses to drop
    # a test database that is still in use).
    await sync_to_async(connections.close_all)()
