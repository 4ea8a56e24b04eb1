"""Retention: a session is deleted a set number of days after its last message, per channel.

The policy is ``settings.CHATFLOW_RETENTION_DAYS`` (``{"web": 30, "whatsapp": 180, "default": 0}``: channel →
days; ``default`` covers every channel not listed and sessions without one; 0 or absent = kept for ever). A
session's age runs from its ``updated_at`` (its last message) and its channel is ``metadata["channel"]``, any case.

:func:`sweep` applies it, in batches of :data:`BATCH` sessions, each batch one short transaction that reads again
which of its sessions are still expired and not held, then deletes each through the site store
(``DjangoSessionStore.erase``: ``sessions_app.holdings.erase``, the one delete path, so a live turn gets
``SessionDeletedError`` and every app forgets what it holds of the session). A session is *held*, skipped and
tried again on a later run, while a reason registered with :func:`register_hold` says so: this app's own is a
session lease (a turn running, or waiting to run); apps above it register theirs from ``ready()``
(``takeover_app``: waiting for or owned by an operator; ``webhooks_app``: a delivery queued or running).

Each run that deleted or skipped anything (and every run of the command) writes one audit entry
(``OperatorAction``, action ``retention``, no session id) with counts per channel and per reason, and no
personal data. Processed-message ids are not touched: they expire with their own TTL, and a deleted session's
deliveries stay (redacted) with their provider ids, so a redelivery of an old message is still a duplicate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from sessions_app import actions, runtime
from sessions_app.models import ChatSession, SessionLease

__all__ = ["ACTION", "BATCH", "DEFAULT", "Hold", "Policy", "Report", "holds", "register_hold", "sweep"]

#: The audit entry's action.
ACTION = "retention"
#: The policy key of every channel it does not name.
DEFAULT = "default"
#: Sessions per batch (one transaction each).
BATCH = 10

#: ``held(session_ids, using)`` → the ids among them that must not be deleted now.
Held = Callable[[Sequence[str], str], Collection[str]]


@dataclass(frozen=True)
class Hold:
    """A reason to keep a session for now (``reason``, a short name for the audit entry) and who says so."""

    reason: str
    held: Held


def _leased(session_ids: Sequence[str], using: str) -> set[str]:
    """A turn holds the session's lease (running, or the lease its process left is not purged yet)."""
    return set(SessionLease.objects.using(using).filter(session_id__in=session_ids)
               .values_list("session_id", flat=True))


_holds: list[Hold] = [Hold("turn_running", _leased)]


def register_hold(reason: str, held: Held) -> Hold:
    """Keep the sessions ``held(session_ids, using)`` returns out of a retention run (counted as skipped with
    ``reason``); call it from ``ready()``. Registering a reason again replaces it."""
    hold = Hold(reason, held)
    _holds[:] = [h for h in _holds if h.reason != reason] + [hold]
    return hold


def holds() -> list[Hold]:
    """The registered holds, this app's lease first."""
    return list(_holds)


def _held(session_ids: Sequence[str], using: str) -> dict[str, str]:
    """session id → the first reason that holds it, for the held ones among ``session_ids``."""
    found: dict[str, str] = {}
    for hold in _holds:
        for sid in hold.held(session_ids, using):
            found.setdefault(sid, hold.reason)
    return found


@dataclass(frozen=True)
class Policy:
    """Days kept per channel (lower-case names, :data:`DEFAULT` for the rest; 0 = for ever)."""

    days: Mapping[str, int]

    @classmethod
    def from_settings(cls) -> Policy:
        """``settings.CHATFLOW_RETENTION_DAYS``."""
        return cls(dict(getattr(settings, "CHATFLOW_RETENTION_DAYS", {}) or {}))

    @property
    def keeps_all(self) -> bool:
        """True when no channel has a limit."""
        return not any(self.days.values())

    def lanes(self) -> list[tuple[str, int]]:
        """``(policy key, days)`` of every key with a limit, named channels first, :data:`DEFAULT` last."""
        named = sorted((k, d) for k, d in self.days.items() if d and k != DEFAULT)
        return named + ([(DEFAULT, self.days[DEFAULT])] if self.days.get(DEFAULT) else [])

    def expired(self, key: str, now: datetime, using: str = "default") -> Any:
        """The queryset of sessions past the limit of policy ``key`` at ``now``."""
        cutoff = now - timedelta(days=self.days[key])
        rows = ChatSession.objects.using(using).filter(updated_at__lt=cutoff)
        if key != DEFAULT:
            return rows.filter(metadata__channel__iexact=key)
        for named in (k for k in self.days if k != DEFAULT):  # those follow their own limit (or none)
            rows = rows.filter(Q(metadata__channel__isnull=True) | ~Q(metadata__channel__iexact=named))
        return rows

    def count_expired(self, now: datetime, using: str = "default") -> dict[str, int]:
        """Policy key → sessions past its limit at ``now`` (held ones included)."""
        return {key: self.expired(key, now, using).count() for key, _days in self.lanes()}


@dataclass
class Report:
    """What a run did (``dry_run``: would do): sessions ``deleted`` per policy key and ``skipped`` per policy key and
    reason. ``audit_id``: the audit entry written, if any."""

    dry_run: bool = False
    deleted: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, Counter[str]] = field(default_factory=dict)
    audit_id: int | None = None

    def skip(self, key: str, reason: str) -> None:
        self.skipped.setdefault(key, Counter())[reason] += 1

    @property
    def total_deleted(self) -> int:
        return sum(self.deleted.values())

    @property
    def total_skipped(self) -> int:
        return sum(sum(c.values()) for c in self.skipped.values())

    def by_reason(self) -> dict[str, int]:
        """Reason → sessions skipped for it, over every channel."""
        total: Counter[str] = Counter()
        for reasons in self.skipped.values():
            total.update(reasons)
        return dict(sorted(total.items()))

    def channels(self) -> dict[str, dict[str, Any]]:
        """Policy key → ``{"deleted": n, "skipped": n, "skipped_because": {reason: n}}``."""
        keys = sorted(set(self.deleted) | set(self.skipped))
        return {k: {"deleted": self.deleted.get(k, 0), "skipped": sum(self.skipped.get(k, Counter()).values()),
                    "skipped_because": dict(sorted(self.skipped.get(k, Counter()).items()))} for k in keys}


def _batches(policy: Policy, key: str, now: datetime, using: str, size: int) -> Iterator[list[str]]:
    """The ids of ``key``'s expired sessions, oldest first, ``size`` at a time (a keyset walk: a skipped session
    is not read again in this run)."""
    rows = policy.expired(key, now, using).order_by("updated_at", "pk")
    last: tuple[datetime, str] | None = None
    while True:
        page = rows if last is None else rows.filter(Q(updated_at__gt=last[0]) | Q(updated_at=last[0], pk__gt=last[1]))
        found = list(page.values_list("updated_at", "pk")[:size])
        if not found:
            return
        yield [sid for _at, sid in found]
        if len(found) < size:
            return
        last = found[-1]


def _delete_batch(store: Any, policy: Policy, key: str, ids: list[str], now: datetime, report: Report) -> None:
    """In one transaction: read again which of ``ids`` are still expired and which are held, delete the others."""
    using = store.using
    with transaction.atomic(using=using):
        # A turn may have committed (a newer last message) or begun since the batch was read.
        still = set(policy.expired(key, now, using).filter(pk__in=ids).values_list("pk", flat=True))
        held = _held(sorted(still), using) if still else {}
        for sid in ids:
            if sid not in still:
                continue
            if sid in held:
                report.skip(key, held[sid])
            elif store.erase(sid).existed:
                report.deleted[key] += 1


def _dry_batch(policy: Policy, key: str, ids: list[str], using: str, report: Report) -> None:
    held = _held(ids, using)
    for sid in ids:
        if sid in held:
            report.skip(key, held[sid])
        else:
            report.deleted[key] += 1


def sweep(*, policy: Policy | None = None, now: datetime | None = None, batch: int = BATCH,
          max_batches: int | None = None, dry_run: bool = False, via: str = "command",
          progress: Callable[[int], None] | None = None) -> Report:
    """Delete the sessions past their channel's limit (``policy``, default the settings') at ``now`` (default:
    now), ``batch`` per transaction, at most ``max_batches`` batches (None: all); held sessions are skipped.
    ``dry_run``: count what would be deleted and skipped, change nothing. ``progress(n)`` after each batch of
    ``n`` sessions looked at. Writes the run's audit entry (``via`` says who ran it: ``command``, ``worker``)
    unless ``dry_run``, or when a ``worker`` run found nothing. ``ValueError`` for a batch below 1."""
    if batch < 1:
        raise ValueError(f"A retention batch needs at least one session, not {batch!r}")
    policy = Policy.from_settings() if policy is None else policy
    report = Report(dry_run=dry_run)
    failed = True
    try:
        _run(policy, timezone.now() if now is None else now, batch, max_batches, report, progress)
        failed = False
    finally:
        if not dry_run and (via != "worker" or report.total_deleted or report.total_skipped):
            try:  # what a run deleted before it failed is audited too
                report.audit_id = _audit(policy, report, via).pk
            except DatabaseError:
                if not failed:
                    raise
    return report


def _run(policy: Policy, now: datetime, batch: int, max_batches: int | None, report: Report,
         progress: Callable[[int], None] | None) -> None:
    store = runtime.site_store()
    done = 0
    for key, _days in policy.lanes():
        for ids in _batches(policy, key, now, store.using, batch):
            if max_batches is not None and done >= max_batches:
                return
            if report.dry_run:
                _dry_batch(policy, key, ids, store.using, report)
            else:
                _delete_batch(store, policy, key, ids, now, report)
            done += 1
            if progress is not None:
                progress(len(ids))


def _audit(policy: Policy, report: Report, via: str) -> Any:
    """The run's audit entry: the policy, and counts only (no session id, no personal data)."""
    before = {"policy_days": dict(sorted(policy.days.items()))}
    after = {"via": via, "deleted": report.total_deleted, "skipped": report.total_skipped,
             "skipped_because": report.by_reason(), "channels": report.channels()}
    with transaction.atomic(using=runtime.site_store().using):
        return actions.audit(None, ACTION, "", before, after)
