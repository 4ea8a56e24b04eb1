"""Transcript formats: JSON (turn-grouped, re-importable), JSONL, Markdown, CSV; UTF-8 and JSON safety; redaction;
the 0.3.4 fixture database; the import command's round trip."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import re
import sqlite3
import uuid
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client

from api_app.models import ApiToken
from chatflow_agent.types import Message, Role
from sessions_app import actions
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from tests.processes import REPO
from tests.sessions_app import personas
from tests.sessions_app.conversations import (
    T0,
    call,
    handoff_result,
    model,
    result,
    results,
    store,
    support_story,
    user,
)

pytestmark = pytest.mark.django_db
FORMATS = ("json", "jsonl", "md", "csv")
FIXTURE_034 = REPO / "tests" / "fixtures" / "chatflow_034.db"


@pytest.fixture
def olga():
    return personas.operator()


@pytest.fixture
def bearer(olga):
    token, secret = ApiToken.issue("tests", olga)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def get(client_kwargs, session_id: str, fmt: str, **params):
    query = "&".join(f"{k}={quote(str(v))}" for k, v in {"format": fmt, **params}.items())
    response = Client().get(f"/api/v1/sessions/{quote(session_id, safe='/')}/transcript?{query}", **client_kwargs)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response, body


def text_of(body: bytes) -> str:
    return body.decode("utf-8", errors="strict")  # a single invalid byte fails the test


# ---- JSON -----------------------------------------------------------------------------------
def test_json_groups_turns_pairs_tool_calls_and_names_the_agents(bearer):
    store("+15550100", support_story(), agent="Billing", metadata={"channel": "whatsapp"})

    response, body = get(bearer, "+15550100", "json")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    doc = json.loads(text_of(body))
    assert doc["format"] == "chatflow-transcript" and doc["version"] == 1
    assert doc["session"]["session_id"] == "+15550100"
    assert doc["session"]["message_count"] == 15 and doc["session"]["turn_count"] == 3
    assert [m["role"] for m in doc["preamble"]] == ["system"]
    first, second, third = doc["turns"]
    assert first["agent"] == "Support" and first["agents"] == ["Support"]
    assert first["tool_calls"] == [{"id": "c1", "name": "check_order_status", "args": {"order_id": "42"},
                                    "result": {"content": {"order_id": "42", "status": "shipped"},
                                               "is_error": False}, "handoff": None}]
    assert second["agents"] == ["Support", "Billing"] and second["agent"] == "Billing"
    assert second["handoffs"] == [{"from": "Support", "to": "Billing", "reason": "refund"}]
    assert third["agent"] == "Billing" and third["tool_calls"][0]["result"]["is_error"] is True
    assert [m["content"] for m in third["messages"]][0] == "And my invoice?"


def test_datetimes_are_iso_8601_with_a_timezone(bearer):
    store("s1", support_story())

    _response, body = get(bearer, "s1", "json")

    doc = json.loads(body)
    stamps = [doc["session"]["created_at"], doc["session"]["updated_at"]]
    stamps += [t["started_at"] for t in doc["turns"]] + [m["timestamp"] for t in doc["turns"] for m in t["messages"]]
    for stamp in stamps:
        assert datetime.fromisoformat(stamp).utcoffset() == dt.timedelta(0), stamp


def test_tool_results_stored_from_datetime_decimal_uuid_and_bytes_export_cleanly(bearer):
    odd = {"when": datetime(2026, 1, 10, 9, 30, tzinfo=UTC), "day": dt.date(2026, 1, 10),
           "amount": decimal.Decimal("19.90"), "id": uuid.UUID(int=7), "blob": b"\x00\xff", "tags": {"b", "a"}}
    store("odd", [user("go"), model(None, [call("c1", "lookup", since=dt.date(2026, 1, 1))]),
                  results(result("c1", "lookup", odd)), model("done")])

    for fmt in FORMATS:
        response, body = get(bearer, "odd", fmt)
        assert response.status_code == 200, fmt
        text = text_of(body)
        assert "19.90" in text and "00000000-0000-0000-0000-000000000007" in text and "base64:AP8=" in text, fmt
    doc = json.loads(get(bearer, "odd", "json")[1])
    content = doc["turns"][0]["tool_calls"][0]["result"]["content"]
    assert content == {"when": "2026-01-10T09:30:00+00:00", "day": "2026-01-10", "amount": "19.90",
                       "id": "00000000-0000-0000-0000-000000000007", "blob": "base64:AP8=", "tags": ["a", "b"]}


# ---- UTF-8 ----------------------------------------------------------------------------------
EMOJI = "Olá 👋 — 你好, привет, مرحبا, 🇧🇷 👩‍👩‍👧"


def test_emoji_and_non_latin_text_survive_as_real_utf8_in_every_format(bearer):
    store("olá 👋", [user(EMOJI), model(None, [call("c1", "echo", text=EMOJI)]),
                    results(result("c1", "echo", {"echo": EMOJI})), model(EMOJI)],
          metadata={"name": "Zoë 🐙"})

    for fmt in FORMATS:
        response, body = get(bearer, "olá 👋", fmt)
        assert response.status_code == 200, fmt
        text = text_of(body)
        assert EMOJI in text and "Zoë 🐙" in text or fmt in ("jsonl", "csv"), fmt
        assert EMOJI.encode() in body, fmt  # real characters, not \\u escapes or surrogate pairs
        assert b"\\ud83d" not in body.lower(), fmt


def test_a_lone_surrogate_written_by_other_software_becomes_the_replacement_character(bearer):
    session = store("split", [user("hi")])
    # A client that cut an emoji in half wrote JSON escapes of its first half; the content column has
    # what its driver made of it. Written with the ORM as raw text, as such software would.
    broken_user = ('{"role":"user","content":"half \\ud83d emoji","tool_calls":null,"tool_results":null,'
                   '"timestamp":"2026-01-10T09:01:00Z"}')
    broken_tool = ('{"role":"tool","content":null,"tool_calls":null,"tool_results":[{"tool_call_id":"c1",'
                   '"name":"n\\udc00","content":{"k\\ude00":"v \\ud800"},"is_error":false}],'
                   '"timestamp":"2026-01-10T09:02:00Z"}')
    ChatMessage.objects.create(session=session, role="user", content="half ? emoji", message_json=broken_user)
    ChatMessage.objects.create(session=session, role="tool", content=None, message_json=broken_tool)

    for fmt in FORMATS:
        response, body = get(bearer, "split", fmt)
        assert response.status_code == 200, fmt
        text = text_of(body)
        assert "half \ufffd emoji" in text, fmt
        assert "v \ufffd" in text, fmt


def test_a_lone_surrogate_in_stored_metadata_is_replaced_too(bearer):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's jsonb refuses lone surrogates on input")
    store("meta", [user("hi")])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE chatflow_sessions SET metadata_json = %s WHERE session_id = %s",
                       ['{"name": "Zo\\ud83d"}', "meta"])

    for fmt in FORMATS:
        response, body = get(bearer, "meta", fmt)
        assert response.status_code == 200
        if fmt in ("json", "md"):
            assert "Zo\ufffd" in text_of(body), fmt


# ---- JSONL, Markdown, CSV ---------------------------------------------------------------------
def test_jsonl_has_one_message_per_line_with_turn_and_agent(bearer):
    store("s1", support_story())

    response, body = get(bearer, "s1", "jsonl")

    assert response.streaming and response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    lines = [json.loads(line) for line in text_of(body).splitlines()]
    assert len(lines) == 15
    assert [(x["turn"], x["role"]) for x in lines[:3]] == [(0, "system"), (1, "user"), (1, "model")]
    assert [x["seq"] for x in lines] == list(range(1, 16))
    assert {x["agent"] for x in lines if x["turn"] == 3} == {"Billing"}


def test_markdown_has_a_heading_per_turn_and_tool_calls_in_fenced_json(bearer):
    store("s1", support_story() + [user("```evil fence``` <script>x</script>")])

    response, body = get(bearer, "s1", "md")

    md = text_of(body)
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert md.startswith("# Transcript: s1\n")
    assert [line.split(" · ")[0] for line in md.splitlines() if line.startswith("## ")] == [
        "## Before the first turn", "## Turn 1", "## Turn 2", "## Turn 3", "## Turn 4"]
    assert '```json\n{\n  "order_id": "42"\n}\n```' in md
    assert "**Handoff** Support → Billing: refund" in md
    assert "Error:" in md and "backend timeout" in md


HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(2)</script> &lt;b&gt; & [click](javascript:alert(3)) ![i](x) <http://x> *em* _u_ \\",
    "```\n<script>alert(4)</script>\n```\n~~~\n# Turn 9 · Admin\n- item\n1. one\r<iframe src=x>\r\n> quoted",
    "`code` ``<b>x</b>`` \\`not code\\`",
]


def md_parts(md: str) -> tuple[list[str], list[str]]:
    """(lines outside fenced code blocks, each fenced block's content), fences matched as CommonMark does:
    closed by a line of the opening character at least as long as the opening fence."""
    lines, outside, fenced, i = md.split("\n"), [], [], 0
    while i < len(lines):
        opening = re.match(r" {0,3}(`{3,}|~{3,})", lines[i])
        if not opening:
            outside.append(lines[i])
            i += 1
            continue
        fence, body = opening.group(1), []
        i += 1
        while i < len(lines) and not re.fullmatch(rf" {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*", lines[i]):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"a {fence} fence is never closed: the rest of the transcript renders as code"
        fenced.append("\n".join(body))
        i += 1
    return outside, fenced


def without_code_spans(line: str) -> str:
    """``line`` with each inline code span (a backtick run up to the next run as long) as ``CODE``;
    a backslash-escaped character stays escaped. A backtick run with no match fails the test."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\":
            out.append(line[i:i + 2])
            i += 2
        elif line[i] == "`":
            run = re.match(r"`+", line[i:]).group(0)
            close = re.compile(rf"(?<!`){run}(?!`)").search(line, i + len(run))
            assert close, f"unmatched backtick run in {line!r}"
            out.append("CODE")
            i = close.end()
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def md_unescape(text: str) -> str:
    """What a CommonMark renderer shows for escaped text: backslash escapes, hard line breaks (a backslash at
    a line's end) and the three entities undone."""
    text = re.sub(r"\\([!-/:-@\[-`{-~]|\n)", r"\1", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_markdown_never_lets_user_or_model_text_become_html_or_links(bearer):
    sid = "xss-<b>bold</b> [x](javascript:alert(5))"
    story = [user(HOSTILE[0]), model(HOSTILE[1], [call("c`<img src=x onerror=alert(6)>`", "look<up>``",
                                                        q="````<script>alert(7)</script>"),
                                                   call("h1", "transfer_to_billing")]),
             results(result("c`<img src=x onerror=alert(6)>`", "look<up>``", {"x": "</code><img src=x>```"}),
                     handoff_result("h1", "Support", "<b>Billing</b>", "<img src=x onerror=alert(8)>")),
             model(HOSTILE[2]), user(HOSTILE[2]), user(HOSTILE[3])]
    session = store(sid, story, metadata={"name": "<script>alert(9)</script>```"})
    ChatMessage.objects.create(session=session, role="unknown", content="<img src=x onerror=alert(10)>\n\n<p>x",
                               message_json="{not json")

    md = text_of(get(bearer, sid, "md")[1])
    outside, fenced = md_parts(md)

    for line in outside:
        text = without_code_spans(re.sub(r"^(> ?)+", "", line))
        assert "<" not in text and ">" not in text, line
        assert not re.search(r"&(?!(amp|lt|gt);)", text), line
        assert not re.search(r"(?<!\\)[\[\]]", text), line  # no link or image can open
    for body in fenced:
        json.loads(body)  # a fence holds exactly its JSON: nothing closed it early
        assert "\n\n" not in body  # one paragraph even for a renderer that knows no fences
    assert len(fenced) == 5  # the metadata, the call's args and result, the handoff's args, the unreadable row
    quotes = re.findall(r"\*\*User\*\* · [^\n]*\n\n((?:>[^\n]*\n)+)", md)
    shown = [md_unescape("\n".join(re.sub(r"^> ?", "", q) for q in quote.rstrip("\n").split("\n")))
             for quote in quotes]
    assert shown == [HOSTILE[0], HOSTILE[2].replace("\r\n", "\n").replace("\r", "\n"), HOSTILE[3]]
    assert md_unescape(outside[0]) == f"# Transcript: {sid}"
    assert md_unescape(HOSTILE[1]) != HOSTILE[1] and md_unescape(
        next(line for line in outside if "javascript:alert(3)" in line)) == HOSTILE[1]


def test_csv_has_one_row_per_message_and_defuses_formulas(bearer):
    store("s1", support_story() + [user("=HYPERLINK(\"http://x\")")])

    response, body = get(bearer, "s1", "csv")

    assert response["Content-Type"] == "text/csv; charset=utf-8"
    text = text_of(body)
    assert text.startswith("\ufeff")
    rows = list(csv.DictReader(io.StringIO(text[1:])))
    assert len(rows) == 16
    assert rows[0]["role"] == "system" and rows[0]["turn"] == "0"
    assert json.loads(rows[2]["tool_calls"])[0]["name"] == "check_order_status"
    assert rows[-1]["content"] == "'=HYPERLINK(\"http://x\")"
    assert {r["session_id"] for r in rows} == {"s1"}


# ---- redaction --------------------------------------------------------------------------------
def test_redact_contacts_masks_phones_and_emails_in_content_metadata_and_tools(bearer):
    store("r1", [user("Call me at +55 11 91234-5678 or ana@example.com, order 42 on 2026-01-10 09:00"),
                 model(None, [call("c1", "notify", email="bob@example.org", phone="(555) 123-4567")]),
                 results(result("c1", "notify", {"sent_to": "+1 555 010 0199"})), model("ok")],
          metadata={"channel": "whatsapp", "phone": "+5511912345678", "email": "ana@example.com"})

    for fmt in FORMATS:
        _r, body = get(bearer, "r1", fmt, redact="contacts")
        text = text_of(body)
        for secret in ("91234-5678", "ana@example.com", "bob@example.org", "123-4567", "010 0199", "5511912345678"):
            assert secret not in text, (fmt, secret)
        assert "order 42 on 2026-01-10 09:00" in text, fmt
        assert "[phone]" in text and "[email]" in text
    _r, plain = get(bearer, "r1", "json")
    assert "ana@example.com" in text_of(plain)


# ---- the 0.3.4 fixture ------------------------------------------------------------------------
def load_034() -> dict[str, int]:
    """Copy every session and message row of chatflow_034.db into the test database as they are."""
    if not FIXTURE_034.exists():
        pytest.skip("tests/fixtures/chatflow_034.db is not committed")
    with sqlite3.connect(FIXTURE_034) as src:
        sessions = src.execute("SELECT session_id, active_agent_name, metadata_json, created_at, updated_at "
                               "FROM chatflow_sessions").fetchall()
        messages = src.execute("SELECT session_id, role, content, message_json, created_at FROM chatflow_messages "
                               "ORDER BY id").fetchall()
    with connection.cursor() as cursor:
        for sid, agent, meta, created, updated in sessions:
            cursor.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at,"
                           " updated_at) VALUES (%s, %s, %s, %s, %s)",
                           [sid, agent, meta, created + "+00:00", updated + "+00:00"])
        for sid, role, content, message_json, created in messages:
            cursor.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json, created_at)"
                           " VALUES (%s, %s, %s, %s, %s)", [sid, role, content, message_json, created + "+00:00"])
    counts: dict[str, int] = {}
    for sid, *_ in messages:
        counts[sid] = counts.get(sid, 0) + 1
    return {sid: counts.get(sid, 0) for sid, *_ in sessions}


def test_the_034_fixture_database_exports_in_every_format(bearer):
    counts = load_034()
    assert counts

    for sid, n in counts.items():
        for fmt in FORMATS:
            response, body = get(bearer, sid, fmt)
            assert response.status_code == 200, (sid, fmt)
            text = text_of(body)
            if fmt == "json":
                doc = json.loads(text)
                assert doc["session"]["message_count"] == n
                assert sum(len(t["messages"]) for t in doc["turns"]) + len(doc["preamble"]) == n
            elif fmt == "jsonl":
                assert len(text.splitlines()) == n
            elif fmt == "csv":
                assert len(list(csv.reader(io.StringIO(text[1:])))) == n + 1
    billing = json.loads(get(bearer, "tg:998877", "json")[1])
    assert billing["session"]["active_agent"] == "Billing"
    assert any(t["handoffs"] for t in billing["turns"])


# ---- import: the round trip --------------------------------------------------------------------
def test_export_import_into_an_empty_database_export_again_is_identical(bearer, tmp_path):
    odd = {"when": datetime(2026, 1, 10, 9, 30, tzinfo=UTC), "amount": decimal.Decimal("1.10"), "b": b"\x01"}
    story = support_story() + [user(EMOJI), model(None, [call("c9", "lookup", q="ü")]),
                               results(result("c9", "lookup", odd)), model("fin 👋")]
    store("a/b olá 👋", story, agent="Billing", metadata={"channel": "web", "n": 1, "nested": {"x": [1, "ü"]}},
          updated=datetime(2026, 2, 1, 12, 0, 0, 123456, tzinfo=UTC))
    _r, first = get(bearer, "a/b olá 👋", "json")
    path = tmp_path / "backup.json"
    path.write_bytes(first)
    ChatSession.objects.all().delete()
    assert not ChatMessage.objects.exists()

    out = io.StringIO()
    call_command("chatflow_import_transcript", str(path), stdout=out)

    assert "a/b olá 👋" in out.getvalue()
    _r, second = get(bearer, "a/b olá 👋", "json")
    assert second == first
    assert ChatMessage.objects.filter(session_id="a/b olá 👋").count() == len(story)


def test_importing_over_an_existing_session_needs_replace(bearer, tmp_path):
    store("s1", support_story())
    path = tmp_path / "s1.json"
    path.write_bytes(get(bearer, "s1", "json")[1])

    with pytest.raises(Exception, match="already exists"):
        call_command("chatflow_import_transcript", str(path), stdout=io.StringIO())
    call_command("chatflow_import_transcript", str(path), "--replace", stdout=io.StringIO())

    assert ChatMessage.objects.filter(session_id="s1").count() == 15


def test_replacing_a_session_forgets_what_the_apps_held_of_the_replaced_one(bearer, tmp_path):
    from takeover_app.models import SessionMode

    store("s1", support_story())
    path = tmp_path / "s1.json"
    path.write_bytes(get(bearer, "s1", "json")[1])
    SessionMode.objects.create(session_id="s1", mode="human", owner_username="olga.operator", pending_note="old")

    call_command("chatflow_import_transcript", str(path), "--replace", stdout=io.StringIO())

    assert not SessionMode.objects.filter(session_id="s1").exists()  # the restored session is the bot's again
    assert ChatMessage.objects.filter(session_id="s1").count() == 15


def test_the_bulk_jsonl_export_imports_back_too(bearer, tmp_path):
    store("one", support_story())
    store("two", [user("hi"), model("hello")], agent="Support")
    response = Client().get("/api/v1/export.jsonl", **bearer)
    body = b"".join(response.streaming_content)
    path = tmp_path / "all.jsonl"
    path.write_bytes(body)
    ChatSession.objects.all().delete()

    call_command("chatflow_import_transcript", str(path), stdout=io.StringIO())

    assert sorted(ChatSession.objects.values_list("session_id", flat=True)) == ["one", "two"]
    again = b"".join(Client().get("/api/v1/export.jsonl", **bearer).streaming_content)
    assert again == body


def test_a_message_row_is_unchanged_by_the_round_trip():
    msg = Message(role=Role.MODEL, content="x", timestamp=T0)
    assert Message.model_validate(json.loads(msg.model_dump_json())) == msg


def test_a_row_with_unreadable_json_is_exported_from_its_columns_dated_by_the_row(bearer):
    session = store("bad", [user("hi")])
    ChatMessage.objects.create(session=session, role="model", content="from the column", message_json="{not json",
                               created_at=datetime(2026, 1, 10, 9, 5, tzinfo=UTC))

    first = get(bearer, "bad", "json")[1]
    second = get(bearer, "bad", "json")[1]

    assert first == second
    message = json.loads(first)["turns"][0]["messages"][1]
    assert message["content"] == "from the column" and message["timestamp"] == "2026-01-10T09:05:00+00:00"


# ---- agents after operator actions ------------------------------------------------------------
def add_turn(session_id: str, messages: list[Message], agent: str | None = None) -> None:
    """Rows of a turn stored now, as the store commits them (after any operator action so far), and the
    agent that ended it."""
    now = datetime.now(UTC)
    if agent:
        ChatSession.objects.filter(pk=session_id).update(active_agent_name=agent)
    ChatMessage.objects.bulk_create([ChatMessage(session_id=session_id, role=m.role.value, content=m.content,
                                                 message_json=m.model_dump_json(), created_at=now)
                                     for m in messages])


def exported_agents(bearer, session_id: str) -> dict[str, list]:
    """Each format's agent per turn (JSON: per turn; JSONL, CSV: the set per turn; Markdown: the headings)."""
    doc = json.loads(get(bearer, session_id, "json")[1])
    lines = [json.loads(x) for x in text_of(get(bearer, session_id, "jsonl")[1]).splitlines()]
    rows = list(csv.DictReader(io.StringIO(text_of(get(bearer, session_id, "csv")[1])[1:])))
    md = text_of(get(bearer, session_id, "md")[1])
    bulk = [json.loads(x) for x in b"".join(Client().get("/api/v1/export.jsonl", **bearer).streaming_content)
            .decode().splitlines()]
    turns = range(1, len(doc["turns"]) + 1)
    return {
        "json": [t["agent"] for t in doc["turns"]],
        "jsonl": [{x["agent"] for x in lines if x["turn"] == n} for n in turns],
        "csv": [{r["agent"] for r in rows if r["turn"] == str(n)} for n in turns],
        "md": [line.split(" · ")[1] for line in md.splitlines() if line.startswith("## Turn ")],
        "bulk": [t["agent"] for doc in bulk if doc["session"]["session_id"] == session_id for t in doc["turns"]],
    }


def test_turns_before_a_forced_handoff_keep_the_agent_that_answered_them(bearer, olga):
    store("fh", [user("my screen flickers"), model("Let me look.")], agent="Support")
    actions.force_handoff(olga, "fh", "Tech", "screen")
    add_turn("fh", [user("still flickers"), model("Try a new cable.")])

    agents = exported_agents(bearer, "fh")

    assert agents["json"] == ["Support", "Tech"] and agents["bulk"] == ["Support", "Tech"]
    assert agents["jsonl"] == agents["csv"] == [{"Support"}, {"Tech"}]
    assert agents["md"] == ["Support", "Tech"]


def test_forced_handoffs_and_chat_handoffs_give_each_turn_its_own_trail(bearer, olga):
    store("mix", support_story(), agent="Billing")  # turn 2 hands off Support → Billing in the chat
    actions.force_handoff(olga, "mix", "Tech")
    add_turn("mix", [user("wifi?"), model("Restart it.")])
    actions.force_handoff(olga, "mix", "Support")
    add_turn("mix", [user("thanks"), model("Bye.")])

    doc = json.loads(get(bearer, "mix", "json")[1])

    assert [t["agents"] for t in doc["turns"]] == [["Support"], ["Support", "Billing"], ["Billing"], ["Tech"],
                                                   ["Support"]]
    assert exported_agents(bearer, "mix")["md"][3:] == ["Tech", "Support"]


def test_a_forced_handoff_recorded_for_an_earlier_session_with_the_same_id_does_not_count(bearer, olga):
    store("again", [user("hi"), model("hello")], agent="Support")
    actions.force_handoff(olga, "again", "Tech")
    ChatSession.objects.filter(pk="again").delete()
    session = store("again", [user("hi"), model("hello")], agent="Billing")
    ChatSession.objects.filter(pk="again").update(created_at=datetime.now(UTC))
    ChatMessage.objects.filter(session=session).update(created_at=datetime.now(UTC))

    assert json.loads(get(bearer, "again", "json")[1])["turns"][0]["agent"] == "Billing"


def test_a_forced_handoff_after_turns_a_rollback_removed_says_nothing_of_the_kept_turns(bearer, olga):
    store("rb", [user("a"), model("A")], agent="Support")
    add_turn("rb", [user("b"), model(None, [call("h1", "transfer_to_billing")]),
                    results(result("h1", "transfer_to_billing", {"status": "HANDOFF_SUCCESS",
                            "transferred_from": "Support", "transferred_to": "Billing", "reason": "r"})),
                    model("B")], agent="Billing")
    actions.force_handoff(olga, "rb", "Tech")
    actions.rollback(olga, "rb", 1, actions.plan_rollback("rb", 1).fingerprint)
    add_turn("rb", [user("c"), model("C")])

    doc = json.loads(get(bearer, "rb", "json")[1])

    assert ChatSession.objects.get(pk="rb").active_agent_name == "Support"  # the agent that ended turn 1
    assert [t["agents"] for t in doc["turns"]] == [["Support"], ["Support"]]  # not Billing, active before Tech


def test_a_restored_backup_keeps_each_turns_agent_across_forced_handoffs(bearer, olga, tmp_path):
    store("back", [user("screen?"), model("Looking.")], agent="Support")
    actions.force_handoff(olga, "back", "Tech")
    add_turn("back", [user("still"), model("New cable.")])
    actions.force_handoff(olga, "back", "Billing")
    add_turn("back", [user("refund"), model("Done.")])
    first = get(bearer, "back", "json")[1]
    path = tmp_path / "back.json"
    path.write_bytes(first)
    ChatSession.objects.all().delete()
    OperatorAction.objects.all().delete()  # a backup restored into another database has no audit log

    call_command("chatflow_import_transcript", str(path), stdout=io.StringIO())

    assert get(bearer, "back", "json")[1] == first
    assert [t["agent"] for t in json.loads(first)["turns"]] == ["Support", "Tech", "Billing"]
    restored = OperatorAction.objects.filter(action="force_handoff").order_by("created_at")
    assert [(e.before["active_agent"], e.after["active_agent"], e.after["restored"]) for e in restored] == [
        ("Support", "Tech", True), ("Tech", "Billing", True)]


def test_a_redacted_export_says_so_and_is_refused_as_a_backup(bearer, tmp_path):
    from django.core.management.base import CommandError

    store("+15550100777", [user("call me on +15550100777"), model("Sure.")], agent="Support")
    response, body = get(bearer, "+15550100777", "json", redact="contacts")
    assert response.status_code == 200
    doc = json.loads(body)
    assert doc["redacted"] is True and "+15550100777" not in body.decode()
    assert "redacted" not in json.loads(get(bearer, "+15550100777", "json")[1])
    path = tmp_path / "red.json"
    path.write_bytes(body)
    ChatSession.objects.all().delete()
    with pytest.raises(CommandError, match="redacted export"):
        call_command("chatflow_import_transcript", str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert not ChatSession.objects.exists()


# ---- each message's agent: the page's rule -------------------------------------------------------
def page_labels(olga, session_id: str) -> dict[int, str]:
    """What the session page says wrote each message row: its author line, a handoff chip's caller."""
    page = personas.client_for(olga).get(f"/sessions/{session_id}/").content.decode()
    labels = {int(rid): who for rid, who in re.findall(
        r'data-message-id="(\d+)">\s*<div class="who"><span class="author">([^<]+)</span>', page)}
    labels.update({int(rid): who for rid, who in re.findall(
        r'<div class="handoff chip"[^>]*data-message-id="(\d+)">⇄ Handoff <strong>([^<]+)</strong>', page)})
    return labels


def test_each_exported_message_names_the_agent_that_wrote_it_as_the_page_does(bearer, olga):
    store("st", [user("my wifi drops"),
                 model("Let me pass you on.", [call("h1", "transfer_to_tech", reason="wifi")]),
                 results(handoff_result("h1", "Support", "Tech", "wifi")),
                 model("Restart the router.")], agent="Tech")
    rows = list(ChatMessage.objects.filter(session_id="st").order_by("id").values_list("id", flat=True))

    lines = [json.loads(x) for x in text_of(get(bearer, "st", "jsonl")[1]).splitlines()]
    csv_rows = list(csv.DictReader(io.StringIO(text_of(get(bearer, "st", "csv")[1])[1:])))
    labels = page_labels(olga, "st")

    expected = ["Support", "Support", "Support", "Tech"]  # the customer's message goes to the turn's first agent
    assert [x["agent"] for x in lines] == [r["agent"] for r in csv_rows] == expected
    assert labels[rows[1]] == "Support" and labels[rows[3]] == "Tech"  # the call's chip, the answer's author
    for row_id, line in zip(rows, lines, strict=True):
        if row_id in labels and line["role"] != "user":  # (the page names the customer as a message's author)
            assert labels[row_id] == line["agent"]


def test_a_handoff_stored_by_0_3_4_names_its_caller_in_the_page_and_every_export(bearer, olga):
    legacy = result("h1", "transfer_to_billing", {"status": "HANDOFF_SUCCESS", "transferred_to": "Billing",
                                                  "reason": "refund"})  # 0.3.4 wrote no transferred_from
    store("old", [user("refund please"), model(None, [call("h1", "transfer_to_billing")]), results(legacy),
                  model("Refunded.")], agent="Billing")

    page = personas.client_for(olga).get("/sessions/old/").content.decode()
    doc = json.loads(get(bearer, "old", "json")[1])
    md = text_of(get(bearer, "old", "md")[1])

    assert "⇄ Handoff <strong>Support</strong> → <strong>Billing</strong>" in page
    assert "Handoff <strong>?</strong>" not in page
    assert doc["turns"][0]["handoffs"][0]["from"] == "Support"
    assert "**Handoff** Support → Billing" in md


def test_line_breaks_in_a_message_survive_the_rendered_markdown(bearer):
    store("lines", [user("first line\nsecond line\n\nnew paragraph\n===\nend"), model("one\ntwo")])

    md = text_of(get(bearer, "lines", "md")[1])

    quote = re.search(r"\*\*User\*\* · [^\n]*\n\n((?:>[^\n]*\n)+)", md).group(1)
    assert quote == "> first line\\\n> second line\n>\n> new paragraph\\\n> \\===\\\n> end\n"  # hard breaks
    assert "one\\\ntwo\n" in md
    assert md_unescape("\n".join(line[2:] for line in quote.rstrip("\n").split("\n"))) == (
        "first line\nsecond line\n\nnew paragraph\n===\nend")
