"""Everything that belongs to a session: what each app holds of it, and what deleting the session does with it.

An app with a table that has a ``session_id`` column registers it from its ``ready()`` with :func:`register`:
how a delete forgets the session's rows (``forget``, run inside the delete's transaction; by default the rows
are deleted) and, when some of them stay, why (``kept``). :func:`erase` is the one delete sequence: every
delete runs it, through the site's session store (``DjangoSessionStore.delete``, ``clear`` and ``erase``, the
runtime API a bot sharing the store calls too), so the console's delete (``sessions_app.actions``), the admin
and an import that replaces a session (``console_app.restore``) forget the same things. The registry is filled
once at start-up, as Django's admin site is; nothing per turn or per session is kept in it. The system check
``sessions_app.E001`` (:func:`unregistered`) names every table of the project's own apps with a ``session_id``
column that nobody registered, so a new app's table cannot be forgotten.

Lock order: a turn's commit writes its delivery and its mode row before the session row, and its turn record
after it. :func:`erase` forgets the parts registered with ``before_session_row=True`` before it locks the
session row, the others after it: taking them the other way round could deadlock with a commit on PostgreSQL.
"""

from __future__ import annotations

import site
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.db import models, transaction

from chatflow_agent.types import Role
from sessions_app.models import ChatMessage, ChatSession

__all__ = ["REDACTED", "STORE_DELETES", "Erased", "Holding", "check", "erase", "erase_all", "forget", "holdings",
           "project_apps", "redacted", "register", "session_models", "unregistered"]

#: What the store's own statements remove (the session row and its messages), after every registered part.
STORE_DELETES = ("sessions_app.ChatSession", "sessions_app.ChatMessage")

#: The value a redacted text gets.
REDACTED = "(deleted with the session)"

Forget = Callable[[str], dict[str, int]]


@dataclass(frozen=True)
class Holding:
    """What one app holds of a session: ``models`` (their ``session_id`` column), how a delete forgets them
    (``forget(session_id)`` → counts for the delete's audit entry) and why rows stay (``kept``, "" when none)."""

    models: tuple[type[models.Model], ...]
    forget: Forget
    kept: str = ""
    before_session_row: bool = False


_holdings: list[Holding] = []


def register(*held: type[models.Model], forget: Forget | None = None, kept: str = "",
             before_session_row: bool = False) -> Holding:
    """Register the session rows of ``held`` (models with a ``session_id`` column); call it from ``ready()``.

    ``forget``: what a delete does with them, in its transaction (its counts are merged into the audit entry's
    ``after``; an exception aborts the delete); without it the rows are deleted, or, with ``kept`` (why they
    stay), left as they are. Registering a model again replaces its registration (``ready()`` may run twice)."""
    if forget is None:
        forget = _keep if kept else _deleting(held)
    holding = Holding(tuple(held), forget, kept, before_session_row)
    labels = {m._meta.label for m in held}
    _holdings[:] = [h for h in _holdings if not labels & {m._meta.label for m in h.models}] + [holding]
    return holding


def holdings() -> list[Holding]:
    """The registered parts, in the order a delete forgets them."""
    return [h for h in _holdings if h.before_session_row] + [h for h in _holdings if not h.before_session_row]


def forget(session_id: str, *, before_session_row: bool) -> dict[str, int]:
    """Forget ``session_id`` in every part registered with this ``before_session_row`` (call it inside the
    delete's transaction); their counts, merged."""
    counts: dict[str, int] = {}
    for holding in holdings():
        if holding.before_session_row == before_session_row:
            counts.update(holding.forget(session_id) or {})
    return counts


@dataclass
class Erased:
    """What :func:`erase` did: ``existed`` (a session row was deleted), ``before`` (the session as the delete
    found it once locked: active agent, metadata with its texts redacted, created/updated times, message and
    turn counts; empty without a row) and ``counts`` (what each registered part did, for the audit entry)."""

    existed: bool
    before: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


def erase(session_id: str, delete_rows: Callable[[], bool], *, using: str = "default") -> Erased:
    """Delete ``session_id`` and everything every app holds of it, in one transaction on ``using`` (a savepoint
    of the caller's): the parts registered ``before_session_row``, then the session row locked (and described),
    then the other parts, then ``delete_rows()`` (the store's statements: the session's messages and row; True
    when a row went). A session without a row still loses what the parts hold of its id (left by a process
    that deleted it without them). An exception rolls all of it back."""
    with transaction.atomic(using=using):
        counts = forget(session_id, before_session_row=True)
        row = ChatSession.objects.using(using).select_for_update().filter(pk=session_id).first()
        before: dict[str, Any] = {}
        if row is not None:
            messages = ChatMessage.objects.using(using).filter(session_id=session_id)
            before = {"active_agent": row.active_agent_name, "metadata": redacted(row.metadata),
                      "created_at": row.created_at.isoformat(), "updated_at": row.updated_at.isoformat(),
                      "messages": messages.count(), "turns": messages.filter(role=Role.USER.value).count()}
        counts.update(forget(session_id, before_session_row=False))
        return Erased(bool(delete_rows()), before, counts)


def erase_all(delete_rows: Callable[[], None], *, using: str = "default") -> None:
    """Delete every session and everything the parts hold of any session id (:func:`erase`'s order: every
    ``before_session_row`` part, then every session row locked, then the other parts, then ``delete_rows()``),
    in one transaction on ``using``."""
    with transaction.atomic(using=using):
        ids = set(ChatSession.objects.using(using).values_list("pk", flat=True))
        for holding in holdings():
            for model in holding.models:
                ids.update(model.objects.using(using).exclude(session_id="").values_list("session_id", flat=True)
                           .distinct())
        ordered = sorted(ids)
        for session_id in ordered:
            forget(session_id, before_session_row=True)
        list(ChatSession.objects.using(using).select_for_update().order_by("pk").values_list("pk", flat=True))
        for session_id in ordered:
            forget(session_id, before_session_row=False)
        delete_rows()


def _keep(session_id: str) -> dict[str, int]:
    return {}


def _deleting(held: tuple[type[models.Model], ...]) -> Forget:
    def delete(session_id: str) -> dict[str, int]:
        counts = {}
        for model in held:
            deleted, _by_model = model.objects.filter(session_id=session_id).delete()
            counts[f"{model._meta.db_table.removeprefix('chatflow_')}_deleted"] = deleted
        return counts

    return delete


def _library_dirs() -> list[Path]:
    """Where the interpreter's and the environment's packages live (a virtualenv may sit inside the project)."""
    names = ("purelib", "platlib", "stdlib", "platstdlib")
    found = {sysconfig.get_path(name) for name in names} | set(site.getsitepackages())
    return [Path(p).resolve() for p in found if p]


def project_apps() -> list[AppConfig]:
    """The project's own installed apps: those whose package lies under ``BASE_DIR`` and outside every
    directory packages are installed in (Django's, Channels' and the other third-party apps are not the
    project's, even when the virtualenv is inside ``BASE_DIR``)."""
    base, libraries = Path(settings.BASE_DIR).resolve(), _library_dirs()
    configs = []
    for config in apps.get_app_configs():
        path = Path(config.path).resolve()
        if path.is_relative_to(base) and not any(path.is_relative_to(lib) for lib in libraries):
            configs.append(config)
    return configs


def _project_models() -> Iterator[type[models.Model]]:
    for config in project_apps():
        yield from config.get_models()


def session_models() -> list[type[models.Model]]:
    """Every model of the project's apps with a ``session_id`` column (a field or a foreign key's)."""
    return [m for m in _project_models()
            if any(getattr(f, "column", None) == "session_id" for f in m._meta.concrete_fields)]


def unregistered() -> list[type[models.Model]]:
    """The models of :func:`session_models` that no part registered and the store does not delete."""
    known = {m._meta.label for h in _holdings for m in h.models} | set(STORE_DELETES)
    return [m for m in session_models() if m._meta.label not in known]


# What an audit entry keeps of a deleted session: the names of agents, modes, statuses, channels and ids, which
# say what was done; every other text (a reason, a note, a reply, tool arguments, metadata values) is redacted.
# A key missing here is redacted: a new kind of entry loses its texts rather than keeps them.
AUDIT_KEPT_KEYS = frozenset({
    "action", "active_agent", "agent_after", "agent_before", "acquired_at", "channel", "created_at", "delivery",
    "error_type", "fingerprint", "format", "from", "lease_owner", "mode", "name", "outcome", "owner", "provider",
    "provider_message_id", "reply", "reply_status", "status", "to", "trigger", "turn_id", "updated_at", "via",
    "view", "when",
})


def redacted(value: Any, key: str = "") -> Any:
    """``value`` (an audit entry's ``before`` or ``after``) with every text under a key not in
    :data:`AUDIT_KEPT_KEYS` replaced by :data:`REDACTED`; numbers, booleans and the structure stay."""
    if isinstance(value, dict):
        return {k: redacted(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key) for v in value]
    if isinstance(value, str) and value and key not in AUDIT_KEPT_KEYS:
        return REDACTED
    return value


def check(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """System check ``sessions_app.E001``: every table with a session id column is registered."""
    from django.core.checks import Error

    return [Error(f"{model._meta.label} has a session_id column but no app registered what deleting a session does "
                  "with its rows.", hint="Call sessions_app.holdings.register() from the app's ready().",
                  obj=model, id="sessions_app.E001") for model in unregistered()]
