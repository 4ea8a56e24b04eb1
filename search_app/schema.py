"""The full-text index over the chatflow tables, written by the database itself.

Every writer of ``chatflow_messages`` and ``chatflow_sessions`` (the site's store, a bot on chatflow_agent's
SQLiteSessionStore, chatflow-agent 0.3.4, the ORM, an import, a rollback, a delete, an erasure) goes through the
database's triggers, so the index changes in the same transaction as the rows it derives from. The three chatflow
tables keep their columns; the index lives in tables of its own:

- ``search_messages``: one row per message (its id): ``body`` is the message text, each tool call's name and
  JSON arguments and each tool result's name and JSON content; ``tools`` the names of its tool calls and results.
  SQLite: an FTS5 table (``unicode61 remove_diacritics 2``: "acao" finds "ação"), rowid = message id, without
  per-row column sizes (``columnsize=0``: nothing ranks by them, and each would cost a b-tree write).
  PostgreSQL: a table with a ``tsvector`` (``simple`` configuration over the accent-folded text) under GIN, the
  tool names as a text array under GIN, and the session id (a message's hits are grouped per session).
- ``search_session_docs``: one row per session: its id and the values of its metadata (phone, username, customer
  name, channel...). SQLite: two FTS5 tables read it (``search_sessions``, words; ``search_sessions_trigram``,
  substrings of 3+ characters: a phone-number or id fragment). PostgreSQL: a ``tsvector`` and, with ``pg_trgm``,
  a trigram GIN index over the folded text for ``LIKE '%fragment%'``.

Text above :data:`BODY_LIMIT` characters is indexed up to the limit (PostgreSQL refuses a tsvector over 1 MB).
PostgreSQL folds accents with the ``unaccent`` extension where it can be created, else with a fixed
``translate()`` over Latin letters (:func:`postgresql_statements` says which; :func:`accent_folding` reports it).
"""

from __future__ import annotations

import unicodedata

from django.db import connections, transaction

__all__ = ["BODY_LIMIT", "PG_DROP", "SQLITE_DROP", "accent_folding", "install", "postgresql_statements",
           "sqlite_body", "sqlite_doc", "sqlite_statements", "sqlite_tools", "uninstall"]

#: Characters of a message's text (with its tool calls and results) the index holds.
BODY_LIMIT = 200_000

# --- SQLite ------------------------------------------------------------------------------------------------------
_TOKENIZER = "unicode61 remove_diacritics 2"


def _sqlite_json(row: str) -> str:
    return f"CASE WHEN json_valid({row}.message_json) THEN {row}.message_json END"


def _sqlite_parts(row: str, path: str, second: str) -> str:
    """``name second`` of each element of ``message_json``'s ``path`` list, space-separated ('' when none)."""
    return (f"coalesce((SELECT group_concat(coalesce(json_extract(value, '$.name'), '') || ' ' || "
            f"coalesce(json_extract(value, '$.{second}'), ''), ' ') FROM json_each({_sqlite_json(row)}, '$.{path}')),"
            " '')")


def _sqlite_no_tools(row: str) -> str:
    # Rows without tool calls or results (most of them) skip the JSON parse: the runtime writes these keys as null.
    return (f"instr({row}.message_json, '\"tool_calls\":null') > 0 "
            f"AND instr({row}.message_json, '\"tool_results\":null') > 0")


def sqlite_body(row: str) -> str:
    """The SQL expression of a message row's indexed text (``row``: ``new`` in a trigger, an alias elsewhere)."""
    calls = _sqlite_parts(row, "tool_calls", "args")
    results = _sqlite_parts(row, "tool_results", "content")
    return (f"substr(coalesce({row}.content, '') || CASE WHEN {_sqlite_no_tools(row)} THEN '' "
            f"ELSE ' ' || {calls} || ' ' || {results} END, 1, {BODY_LIMIT})")


def sqlite_tools(row: str) -> str:
    """The SQL expression of a message row's tool names (calls then results), space-separated."""
    names = "coalesce((SELECT group_concat(json_extract(value, '$.name'), ' ') FROM json_each({js}, '$.{path}')), '')"
    js = _sqlite_json(row)
    return (f"CASE WHEN {_sqlite_no_tools(row)} THEN '' ELSE "
            f"{names.format(js=js, path='tool_calls')} || ' ' || {names.format(js=js, path='tool_results')} END")


def sqlite_doc(row: str) -> str:
    """The SQL expression of a session row's indexed text: its id and its metadata's scalar values."""
    js = f"CASE WHEN json_valid({row}.metadata_json) THEN {row}.metadata_json END"
    return (f"{row}.session_id || ' ' || coalesce((SELECT group_concat(value, ' ') FROM json_each({js}) "
            "WHERE type IN ('text', 'integer', 'real')), '')")


def sqlite_statements() -> list[str]:
    """The DDL of the index and its triggers on SQLite (idempotent)."""
    return [
        "CREATE VIRTUAL TABLE IF NOT EXISTS search_messages USING fts5(body, tools, columnsize=0, "
        f"tokenize='{_TOKENIZER}')",
        "CREATE TABLE IF NOT EXISTS search_session_docs (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL UNIQUE,"
        " doc TEXT NOT NULL)",
        "CREATE VIRTUAL TABLE IF NOT EXISTS search_sessions USING fts5(doc, content='search_session_docs',"
        f" content_rowid='id', columnsize=0, tokenize='{_TOKENIZER}')",
        "CREATE VIRTUAL TABLE IF NOT EXISTS search_sessions_trigram USING fts5(doc, content='search_session_docs',"
        " content_rowid='id', columnsize=0, tokenize='trigram')",
        # messages → search_messages
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_message_ai AFTER INSERT ON chatflow_messages BEGIN "
        f"INSERT INTO search_messages(rowid, body, tools) VALUES (new.id, {sqlite_body('new')}, {sqlite_tools('new')});"
        " END",
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_message_ad AFTER DELETE ON chatflow_messages BEGIN "
        "DELETE FROM search_messages WHERE rowid = old.id; END",
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_message_au AFTER UPDATE OF id, content, message_json "
        "ON chatflow_messages BEGIN DELETE FROM search_messages WHERE rowid = old.id; "
        f"INSERT INTO search_messages(rowid, body, tools) VALUES (new.id, {sqlite_body('new')}, {sqlite_tools('new')});"
        " END",
        # sessions → search_session_docs
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_session_ai AFTER INSERT ON chatflow_sessions BEGIN "
        "DELETE FROM search_session_docs WHERE session_id = new.session_id; "
        f"INSERT INTO search_session_docs(session_id, doc) VALUES (new.session_id, {sqlite_doc('new')}); END",
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_session_au AFTER UPDATE OF session_id, metadata_json "
        "ON chatflow_sessions WHEN old.session_id IS NOT new.session_id OR old.metadata_json IS NOT new.metadata_json"
        " BEGIN DELETE FROM search_session_docs WHERE session_id IN (old.session_id, new.session_id); "
        f"INSERT INTO search_session_docs(session_id, doc) VALUES (new.session_id, {sqlite_doc('new')}); END",
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_session_ad AFTER DELETE ON chatflow_sessions BEGIN "
        "DELETE FROM search_session_docs WHERE session_id = old.session_id; END",
        # search_session_docs → its two FTS5 tables (external content: a delete names the old values)
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_doc_ai AFTER INSERT ON search_session_docs BEGIN "
        "INSERT INTO search_sessions(rowid, doc) VALUES (new.id, new.doc); "
        "INSERT INTO search_sessions_trigram(rowid, doc) VALUES (new.id, new.doc); END",
        "CREATE TRIGGER IF NOT EXISTS chatflow_search_doc_ad AFTER DELETE ON search_session_docs BEGIN "
        "INSERT INTO search_sessions(search_sessions, rowid, doc) VALUES ('delete', old.id, old.doc); "
        "INSERT INTO search_sessions_trigram(search_sessions_trigram, rowid, doc) VALUES ('delete', old.id, old.doc);"
        " END",
    ]


SQLITE_DROP = [
    *(f"DROP TRIGGER IF EXISTS chatflow_search_{name}" for name in
      ("message_ai", "message_ad", "message_au", "session_ai", "session_au", "session_ad", "doc_ai", "doc_ad")),
    "DROP TABLE IF EXISTS search_sessions_trigram", "DROP TABLE IF EXISTS search_sessions",
    "DROP TABLE IF EXISTS search_session_docs", "DROP TABLE IF EXISTS search_messages",
]

# --- PostgreSQL --------------------------------------------------------------------------------------------------


def _latin_fold_map() -> tuple[str, str]:
    """(accented, plain) Latin letters for the fallback fold: every letter of Latin-1 and Latin Extended-A that
    decomposes to an ASCII letter and a combining mark."""
    accented, plain = [], []
    for code in range(0xC0, 0x180):
        ch = chr(code)
        base = unicodedata.normalize("NFKD", ch)[:1]
        if base.isascii() and base.isalpha() and base != ch:
            accented.append(ch)
            plain.append(base)
    return "".join(accented), "".join(plain)


def _pg_fold(unaccent_schema: str | None) -> str:
    if unaccent_schema:
        body = f"SELECT lower({unaccent_schema}.unaccent('{unaccent_schema}.unaccent'::regdictionary, $1))"
    else:
        accented, plain = _latin_fold_map()
        body = f"SELECT lower(translate($1, '{accented}', '{plain}'))"
    return ("CREATE OR REPLACE FUNCTION chatflow_search_fold(text) RETURNS text LANGUAGE sql IMMUTABLE "
            f"PARALLEL SAFE AS $$ {body} $$")


_PG_FUNCTIONS = [
    f"""CREATE OR REPLACE FUNCTION chatflow_search_body(content text, message_json text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE AS $$
    DECLARE j jsonb; out text := coalesce(content, '');
    BEGIN
      IF position('"tool_calls":null' in message_json) > 0 AND position('"tool_results":null' in message_json) > 0
      THEN RETURN left(out, {BODY_LIMIT}); END IF;
      BEGIN j := message_json::jsonb; EXCEPTION WHEN others THEN RETURN left(out, {BODY_LIMIT}); END;
      SELECT out || ' ' || coalesce(string_agg(coalesce(c->>'name', '') || ' ' || coalesce(c->>'args', ''), ' '), '')
        INTO out FROM jsonb_array_elements(CASE WHEN jsonb_typeof(j->'tool_calls') = 'array'
                                           THEN j->'tool_calls' ELSE '[]'::jsonb END) c;
      SELECT out || ' ' || coalesce(string_agg(coalesce(c->>'name', '') || ' ' || coalesce(c->>'content', ''), ' '),
                                    '')
        INTO out FROM jsonb_array_elements(CASE WHEN jsonb_typeof(j->'tool_results') = 'array'
                                           THEN j->'tool_results' ELSE '[]'::jsonb END) c;
      RETURN left(out, {BODY_LIMIT});
    END $$""",
    """CREATE OR REPLACE FUNCTION chatflow_search_tools(message_json text) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE AS $$
    DECLARE j jsonb; names text[];
    BEGIN
      IF position('"tool_calls":null' in message_json) > 0 AND position('"tool_results":null' in message_json) > 0
      THEN RETURN '{}'; END IF;
      BEGIN j := message_json::jsonb; EXCEPTION WHEN others THEN RETURN '{}'; END;
      SELECT coalesce(array_agg(DISTINCT lower(c->>'name')) FILTER (WHERE c->>'name' IS NOT NULL), '{}') INTO names
        FROM (SELECT jsonb_array_elements(CASE WHEN jsonb_typeof(j->'tool_calls') = 'array'
                                          THEN j->'tool_calls' ELSE '[]'::jsonb END)
              UNION ALL SELECT jsonb_array_elements(CASE WHEN jsonb_typeof(j->'tool_results') = 'array'
                                                    THEN j->'tool_results' ELSE '[]'::jsonb END)) AS e(c);
      RETURN names;
    END $$""",
    """CREATE OR REPLACE FUNCTION chatflow_search_doc(session_id text, metadata jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
      SELECT chatflow_search_fold($1 || ' ' || coalesce((SELECT string_agg(value #>> '{}', ' ')
        FROM jsonb_each(CASE WHEN jsonb_typeof($2) = 'object' THEN $2 ELSE '{}'::jsonb END)
        WHERE jsonb_typeof(value) IN ('string', 'number')), ''))
    $$""",
    """CREATE OR REPLACE FUNCTION chatflow_search_message_row() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE b text;
    BEGIN
      IF TG_OP <> 'INSERT' THEN DELETE FROM search_messages WHERE message_id = OLD.id; END IF;
      IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
      b := chatflow_search_body(NEW.content, NEW.message_json);
      INSERT INTO search_messages (message_id, session_id, body, tools, tsv)
        VALUES (NEW.id, NEW.session_id, b, chatflow_search_tools(NEW.message_json),
                to_tsvector('simple', chatflow_search_fold(b)))
        ON CONFLICT (message_id) DO UPDATE SET session_id = EXCLUDED.session_id, body = EXCLUDED.body,
          tools = EXCLUDED.tools, tsv = EXCLUDED.tsv;
      RETURN NEW;
    END $$""",
    """CREATE OR REPLACE FUNCTION chatflow_search_session_row() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE d text;
    BEGIN
      IF TG_OP <> 'INSERT' THEN DELETE FROM search_session_docs WHERE session_id = OLD.session_id; END IF;
      IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
      d := chatflow_search_doc(NEW.session_id, NEW.metadata_json::jsonb);
      INSERT INTO search_session_docs (session_id, doc, tsv) VALUES (NEW.session_id, d, to_tsvector('simple', d))
        ON CONFLICT (session_id) DO UPDATE SET doc = EXCLUDED.doc, tsv = EXCLUDED.tsv;
      RETURN NEW;
    END $$""",
    # TRUNCATE fires no row trigger (Django's flush truncates): the index is emptied with its table.
    """CREATE OR REPLACE FUNCTION chatflow_search_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_TABLE_NAME = 'chatflow_sessions' THEN DELETE FROM search_session_docs; END IF;
      DELETE FROM search_messages;
      RETURN NULL;
    END $$""",
]

_PG_TABLES = [
    "CREATE TABLE IF NOT EXISTS search_messages (message_id BIGINT PRIMARY KEY, session_id TEXT NOT NULL,"
    " body TEXT NOT NULL, tools TEXT[] NOT NULL DEFAULT '{}', tsv TSVECTOR NOT NULL)",
    "CREATE INDEX IF NOT EXISTS search_messages_tsv ON search_messages USING gin (tsv)",
    "CREATE INDEX IF NOT EXISTS search_messages_session ON search_messages (session_id, message_id)",
    "CREATE INDEX IF NOT EXISTS search_messages_tools ON search_messages USING gin (tools)",
    "CREATE TABLE IF NOT EXISTS search_session_docs (session_id TEXT PRIMARY KEY, doc TEXT NOT NULL,"
    " tsv TSVECTOR NOT NULL)",
    "CREATE INDEX IF NOT EXISTS search_session_docs_tsv ON search_session_docs USING gin (tsv)",
]

_PG_TRIGGERS = [
    "DROP TRIGGER IF EXISTS chatflow_search_message ON chatflow_messages",
    "CREATE TRIGGER chatflow_search_message AFTER INSERT OR DELETE OR UPDATE OF id, session_id, content,"
    " message_json ON chatflow_messages FOR EACH ROW EXECUTE FUNCTION chatflow_search_message_row()",
    "DROP TRIGGER IF EXISTS chatflow_search_session ON chatflow_sessions",
    "CREATE TRIGGER chatflow_search_session AFTER INSERT OR DELETE ON chatflow_sessions FOR EACH ROW"
    " EXECUTE FUNCTION chatflow_search_session_row()",
    "DROP TRIGGER IF EXISTS chatflow_search_session_update ON chatflow_sessions",
    "CREATE TRIGGER chatflow_search_session_update AFTER UPDATE OF session_id, metadata_json ON chatflow_sessions"
    " FOR EACH ROW WHEN (OLD.session_id IS DISTINCT FROM NEW.session_id"
    " OR OLD.metadata_json IS DISTINCT FROM NEW.metadata_json)"
    " EXECUTE FUNCTION chatflow_search_session_row()",
    *(f"DROP TRIGGER IF EXISTS chatflow_search_truncate ON {table}" for table in ("chatflow_messages",
                                                                                  "chatflow_sessions")),
    *(f"CREATE TRIGGER chatflow_search_truncate AFTER TRUNCATE ON {table} FOR EACH STATEMENT"
      " EXECUTE FUNCTION chatflow_search_truncate()" for table in ("chatflow_messages", "chatflow_sessions")),
]

PG_DROP = [
    "DROP TRIGGER IF EXISTS chatflow_search_message ON chatflow_messages",
    "DROP TRIGGER IF EXISTS chatflow_search_session ON chatflow_sessions",
    "DROP TRIGGER IF EXISTS chatflow_search_session_update ON chatflow_sessions",
    "DROP TRIGGER IF EXISTS chatflow_search_truncate ON chatflow_messages",
    "DROP TRIGGER IF EXISTS chatflow_search_truncate ON chatflow_sessions",
    "DROP TABLE IF EXISTS search_messages", "DROP TABLE IF EXISTS search_session_docs",
    *(f"DROP FUNCTION IF EXISTS {f}" for f in (
        "chatflow_search_message_row()", "chatflow_search_session_row()", "chatflow_search_truncate()",
        "chatflow_search_doc(text, jsonb)", "chatflow_search_tools(text)", "chatflow_search_body(text, text)",
        "chatflow_search_fold(text)")),
]


def _try_extension(cursor, name: str) -> str | None:
    """Create extension ``name`` if this role may (a savepoint keeps a refusal from aborting the migration);
    the schema it lives in, or None."""
    try:
        with transaction.atomic(using=cursor.db.alias):
            cursor.execute(f"CREATE EXTENSION IF NOT EXISTS {name}")
    except Exception:  # noqa: BLE001 - not available or not allowed: the fallback is used
        pass
    cursor.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                   "WHERE e.extname = %s", [name])
    row = cursor.fetchone()
    return row[0] if row else None


def postgresql_statements(cursor) -> list[str]:
    """The DDL of the index on PostgreSQL, after creating ``unaccent`` and ``pg_trgm`` where this role may."""
    unaccent = _try_extension(cursor, "unaccent")
    trgm = _try_extension(cursor, "pg_trgm")
    statements = [_pg_fold(unaccent), *_PG_FUNCTIONS, *_PG_TABLES]
    if trgm:
        statements.append(f"CREATE INDEX IF NOT EXISTS search_session_docs_trgm ON search_session_docs "
                          f"USING gin (doc {trgm}.gin_trgm_ops)")
    return statements + _PG_TRIGGERS


def install(connection) -> None:
    """Create the index tables and triggers on ``connection`` (idempotent; the migration's forward step)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            statements = sqlite_statements()
        elif connection.vendor == "postgresql":
            statements = postgresql_statements(cursor)
        else:
            raise RuntimeError(f"search index: no DDL for database vendor {connection.vendor!r}")
        for statement in statements:
            cursor.execute(statement)


def uninstall(connection) -> None:
    """Drop the index (the migration's backward step): the chatflow tables are left as they are."""
    with connection.cursor() as cursor:
        for statement in SQLITE_DROP if connection.vendor == "sqlite" else PG_DROP:
            cursor.execute(statement)


def accent_folding(using: str = "default") -> str:
    """How the index folds accents: ``"unicode61"`` (SQLite), ``"unaccent"`` or ``"translate"`` (PostgreSQL's
    fallback when the extension could not be created)."""
    connection = connections[using]
    if connection.vendor == "sqlite":
        return "unicode61"
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'chatflow_search_fold'")
        row = cursor.fetchone()
    return "unaccent" if row and "unaccent" in row[0] else "translate"
