"""The durable queue on ``InboundDelivery``: claim with a visibility timeout, renew, finish, fail, release.

Blocking functions (workers call them on their own threads). A claim is one statement in autocommit.
On SQLite, ``UPDATE … WHERE id = (the oldest claimable) RETURNING …``, serialised by the write lock
(after a read, so an idle poll takes no lock). On PostgreSQL, ``UPDATE … WHERE id = (SELECT …
FOR UPDATE SKIP LOCKED) AND`` (still claimable) ``RETURNING …``; the second condition tests the row
again under its lock (the subquery's choice alone is not re-tested when a concurrent claim changed the
row first, and can lease a finished delivery again); several worker processes never block on, or
take, the same delivery. A delivery is
claimable when queued, or running with an expired lease (its worker died: the visibility timeout),
and only when no earlier delivery of the same session is still queued or running, so one sender's
messages are played in the order they arrived even with many workers. Every later write is guarded
by the lease owner: a worker that lost its lease changes nothing.

The worker's statements (claim, renew, finish, fail, complete, release) run on the driver's cursor
(``sessions_app.store.driver_cursor``): building them through the ORM cost several times what running
them costs. They are written with ``?`` placeholders and rendered for the connection's dialect, and
every write after the claim carries the same lease-owner guard (``_MINE``). On PostgreSQL a slot's last
write for a delivery and its claim of the next are one statement (:func:`complete_and_claim_next`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Min
from django.utils import timezone

from chatflow_agent.jsonsafe import json_object
from chatflow_agent.types import AgentResponse
from sessions_app.models import ChatMessage, ChatSession
from sessions_app.store import driver_cursor
from webhooks_app.inbox import release_claim
from webhooks_app.models import InboundDelivery

__all__ = ["QueueRow", "depth", "MARKER_KEY", "answer_of", "claim_next", "claim", "renew", "finish", "fail", "complete",
           "complete_and_claim_next", "outcome",
           "release", "status_of", "turn_committed", "played_before", "playing_since_before", "last_answer",
           "ends_with_customer", "in_flight", "pending"]

Status = InboundDelivery.Status
MARKER_KEY = "webhook_delivery"  # session metadata: the marker of the last delivery whose turn committed


_TABLE = InboundDelivery._meta.db_table
_SESSIONS = ChatSession._meta.db_table
# A delivery waits while an earlier delivery of its session is open: per-session FIFO across workers.
_UNBLOCKED = (f"NOT EXISTS (SELECT 1 FROM {_TABLE} e WHERE e.session_id = c.session_id "
              f"AND e.status IN ('queued', 'running') AND e.id < c.id)")
# The two ways to be claimable, each its own query in id order: one query with ``queued OR (running AND
# expired)`` cannot walk the ``(status, id)`` index, and then tests and sorts every queued row of a
# backlog (docs/performance.md has the figures). Each of these stops at its first unblocked row.
_EXPIRED = (f"SELECT c.id FROM {_TABLE} c WHERE c.status = 'running' AND c.lease_expires_at < ? "
            f"AND {_UNBLOCKED} {{only}} ORDER BY c.id LIMIT 1 {{lock}}")
_QUEUED = (f"SELECT c.id FROM {_TABLE} c WHERE c.status = 'queued' AND {_UNBLOCKED} {{only}} "
           f"ORDER BY c.id LIMIT 1 {{lock}}")
# The session's marker (of the last delivery whose turn committed), read in the claim's statement.
_MARKER = {
    "postgresql": f"(SELECT s.metadata_json ->> '{MARKER_KEY}' FROM {_SESSIONS} s "
                  f"WHERE s.session_id = {_TABLE}.session_id)",
    "sqlite": f"(SELECT CASE WHEN json_valid(s.metadata_json) THEN json_extract(s.metadata_json, '$.{MARKER_KEY}') "
              f"END FROM {_SESSIONS} s WHERE s.session_id = {_TABLE}.session_id)",
}
_FIELDS = InboundDelivery._meta.concrete_fields
_COLUMNS = ", ".join(f.column for f in _FIELDS)
_SET = f"UPDATE {_TABLE} SET status = 'running', attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?"


@functools.lru_cache(maxsize=8)
def _claim_sql(vendor: str, only: str) -> str:
    """One statement: pick the oldest claimable delivery, lease it, return it with its session's marker.

    PostgreSQL: the candidates are locked with ``FOR UPDATE SKIP LOCKED`` inside the statement, so two
    claimers never wait for, or take, the same row, and the leased row is tested again under its lock
    (``_STILL``: the subquery's choice alone is not re-tested when a concurrent claim changed the row
    first). SQLite: statements are serialised by the write lock.
    """
    if vendor == "postgresql":
        pick = f"{_pick(only, 'FOR UPDATE SKIP LOCKED')} AND {_STILL}"
    else:
        pick = (f"(SELECT min(x.id) FROM (SELECT id FROM ({_EXPIRED.format(only=only, lock='')}) "
                f"UNION ALL SELECT id FROM ({_QUEUED.format(only=only, lock='')})) x)")
    return f"{_SET} WHERE id = {pick} RETURNING {_COLUMNS}, {_MARKER[vendor]} AS session_marker"


# Checked again on the row being leased (PostgreSQL re-reads its newest version under the row lock).
_STILL = "(status = 'queued' OR (status = 'running' AND lease_expires_at < ?))"


def _pick(only: str, lock: str) -> str:
    return f"LEAST(({_EXPIRED.format(only=only, lock=lock)}), ({_QUEUED.format(only=only, lock=lock)}))"


@functools.lru_cache(maxsize=4)
def _probe_sql(only: str) -> str:
    return (f"SELECT EXISTS ({_EXPIRED.format(only=only, lock='')}) "
            f"OR EXISTS ({_QUEUED.format(only=only, lock='')})")


def _take(owner: str, visibility: float, delivery_id: int | None = None, where: str = "") -> InboundDelivery | None:
    now = timezone.now()
    only, extra = ("AND c.id = ?", [delivery_id]) if delivery_id is not None else ("", [])
    only = f"{only} AND ({where})" if where else only
    at = connection.ops.adapt_datetimefield_value
    candidates = [at(now), *extra, *extra]  # expired (now, id), then queued (id)
    with driver_cursor() as (cursor, dialect):
        if dialect.name != "postgresql":
            # SQLite: a read first, so an idle poll never takes the write lock the webhooks need (an UPDATE
            # takes it even when it matches nothing).
            cursor.execute(dialect.render(_probe_sql(only)), candidates)
            if not cursor.fetchone()[0]:
                return None
        params = [owner, at(now + timedelta(seconds=visibility)), *candidates]
        if dialect.name == "postgresql":
            params.append(at(now))  # the re-test under the row lock (_STILL)
        cursor.execute(dialect.render(_claim_sql(dialect.name, only)), params)
        row = cursor.fetchone()
    return None if row is None else _delivery(row)


def _delivery(row: Any) -> InboundDelivery:
    """A claimed row (every column, then the session's marker) as the model instance the ORM would make."""
    values = list(row[: len(_FIELDS)])
    for i, convert in _converters(connection.vendor):
        values[i] = convert(values[i])
    delivery = InboundDelivery.from_db(connection.alias, [f.attname for f in _FIELDS], values)
    delivery.session_marker = row[len(_FIELDS)]
    return delivery


@functools.cache
def _converters(vendor: str) -> list[tuple[int, Any]]:
    """(column index, value converter) for the columns ``vendor``'s database returns in another form than the
    field's (SQLite's text datetimes, JSON text): the converters Django's compiler applies, looked up once."""
    found = []
    for i, field in enumerate(_FIELDS):
        col = field.get_col(_TABLE)
        chain = [*connection.ops.get_db_converters(col), *field.get_db_converters(connection)]
        if chain:
            found.append((i, _chained(chain, col)))
    return found


def _chained(chain: list[Any], col: Any) -> Any:
    def convert(value: Any) -> Any:
        for fn in chain:
            value = fn(value, col, connection)
        return value

    return convert


def claim_next(owner: str, visibility: float, where: str = "") -> InboundDelivery | None:
    """Claim the oldest claimable delivery for ``owner`` for ``visibility`` seconds, or None.

    One statement (see the module docstring): the delivery comes back leased (``status=running``,
    ``attempts`` counted), with ``session_marker`` — the session's marker when it was claimed (see
    :func:`played_before`). On SQLite an idle poll is one read and takes no lock. ``where``: a further
    condition on the candidate delivery (SQL on its row, alias ``c``, without parameters), e.g. only those
    that need no model call (``webhooks_app.worker``).
    """
    return _take(owner, visibility, where=where)


def claim(delivery_id: int, owner: str, visibility: float) -> InboundDelivery | None:
    """Claim this delivery if it is claimable now (``?wait=true`` plays it in the request)."""
    return _take(owner, visibility, delivery_id)


def played_before(delivery: InboundDelivery) -> bool:
    """True when the claimed ``delivery``'s turn was already in its session when it was claimed (a worker
    died after the turn's commit): read with the claim, so it costs no query."""
    return getattr(delivery, "session_marker", None) == delivery.marker


# The one guard of every write by the worker holding a delivery: its lease, still running.
_MINE = "WHERE id = ? AND lease_owner = ? AND status = 'running'"
_RENEW = f"UPDATE {_TABLE} SET lease_expires_at = ? {_MINE}"
_FINISH = f"UPDATE {_TABLE} SET answer = ?, reply_status = ?, error = '' {_MINE} AND token = ?"
_FINISH_DONE = (f"UPDATE {_TABLE} SET answer = ?, reply_status = ?, error = '', status = 'done', finished_at = ? "
                f"{_MINE} AND token = ?")
_STATUS = f"SELECT status FROM {_TABLE} WHERE id = ?"
_COMPLETE = (f"UPDATE {_TABLE} SET status = 'done', reply_status = ?, reply_error = ?, finished_at = ? "
             f"{_MINE} AND error = ''")
_COMPLETE_FAILED = (f"UPDATE {_TABLE} SET status = 'failed', reply_status = ?, reply_error = ?, finished_at = ? "
                    f"{_MINE} AND error <> ''")
_FAIL = f"UPDATE {_TABLE} SET error = ?, answer = ?, reply_status = ? {_MINE}"
_FAIL_NOW = f"UPDATE {_TABLE} SET error = ?, answer = ?, reply_status = ?, status = 'failed', finished_at = ? {_MINE}"
_RELEASE = (f"UPDATE {_TABLE} SET status = 'queued', lease_owner = '', lease_expires_at = NULL, "
            f"attempts = attempts - 1 {_MINE}")
_RELEASE_UNSENT = (f"UPDATE {_TABLE} SET status = 'queued', lease_owner = '', lease_expires_at = NULL, "
                   f"attempts = attempts - 1, "
                   f"reply_status = CASE WHEN reply_status = 'sending' THEN '' ELSE reply_status END {_MINE}")


def _write(sql: str, params: list[Any], using: str = "default") -> int:
    """One statement on the driver's cursor (in autocommit unless a transaction is open); its row count."""
    with driver_cursor(using) as (cursor, dialect):
        cursor.execute(dialect.render(sql), params)
        return cursor.rowcount


def renew(delivery: InboundDelivery, owner: str, visibility: float) -> bool:
    """Extend the lease; False when it was lost (expired and taken by another worker)."""
    until = connection.ops.adapt_datetimefield_value(timezone.now() + timedelta(seconds=visibility))
    return _write(_RENEW, [until, delivery.pk, owner]) == 1


def answer_of(response: AgentResponse) -> str | None:
    """What a turn's ``response`` gives its delivery to send: its text, or None when the turn was held for an
    operator without an answer (nothing to send)."""
    return None if response.held and not response.content else response.content


def outcome(answer: str | None, replies_out: bool) -> tuple[str, str]:
    """(answer text, reply status) recorded by :func:`finish`: HELD for a held turn (``answer`` None), SENDING
    when the channel sends replies (``replies_out``: WhatsApp, Telegram), else NONE."""
    if answer is None:
        return "", InboundDelivery.Reply.HELD
    return answer, InboundDelivery.Reply.SENDING if replies_out else InboundDelivery.Reply.NONE


def finish(delivery: InboundDelivery, owner: str, answer: str, reply: str, using: str = "default") -> bool:
    """Record the turn's ``answer``. ``reply`` NONE or HELD (held for an operator): done. SENDING: the reply
    goes out next and the delivery stays running (the sender's next delivery waits) until :func:`complete`.
    False if the lease was lost (or the delivery played again since: its token changed).

    Called only by ``webhooks_app.settle``: inside the commit's transaction of the delivery's turn (``using``:
    that commit's database), so what the turn answered is stored with it, or on its own after a turn whose
    commit did not record it."""
    if reply in (InboundDelivery.Reply.NONE, InboundDelivery.Reply.HELD):
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        return _write(_FINISH_DONE, [answer, reply, now, delivery.pk, owner, delivery.token], using) == 1
    return _write(_FINISH, [answer, reply, delivery.pk, owner, delivery.token], using) == 1


def in_flight(session_ids: Sequence[str], using: str = "default") -> set[str]:
    """Of ``session_ids``, those with a delivery queued or running (its turn is still to be played or ending)."""
    return set(InboundDelivery.objects.using(using)
               .filter(session_id__in=session_ids,
                       status__in=[InboundDelivery.Status.QUEUED, InboundDelivery.Status.RUNNING])
               .values_list("session_id", flat=True).distinct())


def status_of(delivery: InboundDelivery, using: str = "default") -> str | None:
    """The delivery's status now (None when it is gone)."""
    with driver_cursor(using) as (cursor, dialect):
        cursor.execute(dialect.render(_STATUS), [delivery.pk])
        row = cursor.fetchone()
    return None if row is None else row[0]


def fail(delivery: InboundDelivery, owner: str, error: str, fallback: str, reply: str) -> bool:
    """Record a failed turn. ``reply`` NONE: failed now, and the id's claim released (invariant 6) in the
    same transaction. SENDING: the fallback goes out next, then :func:`complete` marks it failed."""
    params: list[Any] = [error[:4000] or "failed", fallback, reply]
    if reply != InboundDelivery.Reply.NONE:
        return _write(_FAIL, [*params, delivery.pk, owner]) == 1
    with transaction.atomic():
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        ok = _write(_FAIL_NOW, [*params, now, delivery.pk, owner]) == 1
        if ok:
            release_claim(delivery.claim_key)
    return ok


def complete(delivery: InboundDelivery, owner: str, reply: str, reply_error: str = "") -> None:
    """After the reply (or the fallback) was sent, or not: done, or failed with the claim released.

    A delivery without an error (the usual case) is one UPDATE in autocommit; one with an error is
    marked failed and its id's claim released in one transaction.
    """
    params = _completing(delivery, owner, reply, reply_error, timezone.now())
    if not _write(_COMPLETE, params):
        _complete_failed(delivery, params)


def _completing(delivery: InboundDelivery, owner: str, reply: str, reply_error: str, now: Any) -> list[Any]:
    """The parameters of ``_COMPLETE`` and ``_COMPLETE_FAILED``."""
    return [reply, reply_error[:4000], connection.ops.adapt_datetimefield_value(now), delivery.pk, owner]


def _complete_failed(delivery: InboundDelivery, params: list[Any]) -> None:
    with transaction.atomic():
        if _write(_COMPLETE_FAILED, params):
            release_claim(delivery.claim_key)


@functools.cache
def _complete_and_claim_sql() -> str:
    """PostgreSQL: ``_COMPLETE`` and the claim of another delivery as one statement: the count of completed
    rows (0 or 1), then the claimed row's columns (NULLs when none was claimed). The claim's reads see the
    statement's snapshot, in which the delivery being completed is still running: its own row is left out
    (its lease may have expired) and its session's next delivery stays blocked.

    The sub-statements of a ``WITH`` run in no fixed order; the claim reads ``done`` (to leave out the
    delivery being completed), so the completion has run, and waited for its row's lock if it had to, before
    the claim locks any row. Locking the claimed row first could deadlock with a worker completing that one
    and claiming this one (both leases expired)."""
    claim = _claim_sql("postgresql", "AND c.id <> (SELECT COALESCE(MAX(id), ?) FROM done)")
    return (f"WITH done AS ({_COMPLETE} RETURNING id), claimed AS ({claim}) "
            f"SELECT (SELECT COUNT(*) FROM done), claimed.* FROM (SELECT 1) AS one LEFT JOIN claimed ON TRUE")


def complete_and_claim_next(delivery: InboundDelivery, owner: str, reply: str, reply_error: str,
                            visibility: float) -> InboundDelivery | None:
    """:func:`complete`, then :func:`claim_next` for ``owner`` and ``visibility`` (seconds); the claimed delivery
    or None. On PostgreSQL a delivery completed without an error (the usual case) and the claim of a delivery of
    another session are one statement, one commit; the next delivery of the same session (which that
    statement cannot see unblocked) is claimed by a second statement when the first claimed nothing. Each
    write is its own guard, and either may find nothing; unlike the two calls, the claim may pass over
    that next delivery for a newer one of another session (a caller with idle slots should look for it).
    Errors: ``django.db``'s; a delivery the statement claimed before recording a failure raised is given
    back to the queue first (when the database still answers; else its lease runs out)."""
    now = timezone.now()
    completing = _completing(delivery, owner, reply, reply_error, now)
    row = None
    with driver_cursor() as (cursor, dialect):
        if dialect.name == "postgresql":
            at = connection.ops.adapt_datetimefield_value
            claiming = [owner, at(now + timedelta(seconds=visibility)), at(now), delivery.pk, delivery.pk, at(now)]
            cursor.execute(dialect.render(_complete_and_claim_sql()), completing + claiming)
            row = cursor.fetchone()
    if row is None:  # SQLite
        complete(delivery, owner, reply, reply_error)
        return claim_next(owner, visibility)
    claimed = None if row[1] is None else _delivery(row[1:])
    if not row[0]:  # an error to record, or no longer this worker's (then nothing)
        try:
            _complete_failed(delivery, completing)
        except BaseException:
            if claimed is not None:
                with contextlib.suppress(DatabaseError):
                    release(claimed, owner)
            raise
    return claim_next(owner, visibility) if claimed is None else claimed


def release(delivery: InboundDelivery, owner: str, unsent: bool = False) -> None:
    """Give an unfinished delivery back to the queue (the worker is stopping). ``unsent``: this worker never
    started sending its reply, so a ``sending`` recorded for it (with its turn's commit) is cleared and the
    next claim sends it; otherwise a recorded ``sending`` stays (the reply may have gone out: never twice)."""
    _write(_RELEASE_UNSENT if unsent else _RELEASE, [delivery.pk, owner])


def turn_committed(delivery: InboundDelivery) -> bool:
    """True when this delivery's turn is in the session: its marker was committed with the turn's rows."""
    row = ChatSession.objects.filter(pk=delivery.session_id).values_list("metadata", flat=True).first()
    return row is not None and json_object(row).get(MARKER_KEY) == delivery.marker


def last_answer(session_id: str) -> str:
    """The newest model answer of the session (the turn of a delivery recovered after a crash)."""
    answers = ChatMessage.objects.filter(session_id=session_id, role="model").order_by("-id")
    content = answers.values_list("content", flat=True).first()
    return content or ""


def ends_with_customer(session_id: str) -> bool:
    """True when the session's newest message is the customer's (a USER row nothing answered: a held turn, as
    that of a delivery recovered after a crash may have been)."""
    role = ChatMessage.objects.filter(session_id=session_id).order_by("-id").values_list("role", flat=True).first()
    return role == "user"


def playing_since_before(session_id: str, since: Any) -> bool:
    """True while a delivery of ``session_id`` that arrived before ``since`` (a datetime) is being played
    by a live worker: running under an unexpired lease and not sending its reply. A delivery whose worker
    died does not count (its lease runs out; another worker plays it again)."""
    return InboundDelivery.objects.filter(
        session_id=session_id, status=Status.RUNNING, first_seen__lt=since, lease_expires_at__gt=timezone.now(),
    ).exclude(reply_status=InboundDelivery.Reply.SENDING).exists()


def pending() -> int:
    """Deliveries queued or running."""
    return InboundDelivery.objects.filter(status__in=[Status.QUEUED, Status.RUNNING]).count()


@dataclass(frozen=True)
class QueueRow:
    """One provider's queue: deliveries queued and running, and the age of the oldest queued one (seconds)."""

    provider: str
    label: str
    queued: int
    running: int
    oldest_age: float | None


def depth() -> list[QueueRow]:
    """The queue by provider: every provider (those with nothing queued too), in the providers' order."""
    now = timezone.now()
    status = InboundDelivery.Status
    open_ = (InboundDelivery.objects.filter(status__in=[status.QUEUED, status.RUNNING])
             .values("provider", "status").annotate(n=Count("id"), oldest=Min("first_seen")))
    found: dict[tuple[str, str], dict[str, Any]] = {(r["provider"], r["status"]): r for r in open_}
    rows = []
    for value, label in InboundDelivery.Provider.choices:
        queued = found.get((value, status.QUEUED), {})
        oldest = queued.get("oldest")
        rows.append(QueueRow(value, label, queued.get("n", 0), found.get((value, status.RUNNING), {}).get("n", 0),
                             None if oldest is None else (now - oldest).total_seconds()))
    return rows
