"""Session leases: their TTL follows CHATFLOW_LEASE_SECONDS, the page shows the holder, stale rows are purged."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command

from chatflow_agent.exceptions import SessionBusyError
from sessions_app import actions, registry, runtime
from sessions_app.models import SessionLease, SessionWaiter
from sessions_app.store import DjangoSessionStore
from tests.sessions_app import personas

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def short_leases(settings):
    settings.CHATFLOW_LEASE_SECONDS = 1
    runtime.reset()
    yield
    runtime.reset()


def other_agent(session_id: str) -> str:
    active = runtime.site_store().get(session_id).active_agent.name
    return next(name for name in registry.agents() if name != active)


def dead_turn(session_id: str) -> tuple[DjangoSessionStore, object]:
    """A turn of another process holding the session's lease, whose renewals then stop (the process died)."""
    other = DjangoSessionStore()
    held = other.sync_turn(session_id, registry.starting_agent())
    held.__enter__()
    other.close()  # its lease keeper stops: nothing renews the lease any more
    return other, held


def test_a_dead_process_lease_blocks_the_session_only_for_the_lease_setting(short_leases):
    runtime.site_store().get_or_create("s", registry.starting_agent())
    operator = personas.operator()
    _other, held = dead_turn("s")
    lease = SessionLease.objects.get(pk="s")
    assert lease.expires_at - lease.acquired_at == pytest.approx(1)  # the setting, not the default
    with pytest.raises(actions.SessionBusy):
        actions.force_handoff(operator, "s", other_agent("s"))

    deadline = time.monotonic() + 10  # far shorter than the default lease
    while True:
        try:
            actions.force_handoff(operator, "s", other_agent("s"))
            break
        except actions.SessionBusy:
            assert time.monotonic() < deadline, "the dead process's lease still blocks the session"
            time.sleep(0.05)
    with pytest.raises(SessionBusyError):  # the dead turn lost its lease: it cannot commit any more
        held.__exit__(None, None, None)


def test_the_session_page_shows_who_holds_the_lease_and_since_when():
    runtime.site_store().get_or_create("s", registry.starting_agent())
    other = DjangoSessionStore()
    viewer = personas.client_for(personas.viewer())
    assert b'<dd id="session-lease">free</dd>' in viewer.get("/sessions/s/").content
    with other.sync_turn("s", registry.starting_agent()):
        lease = SessionLease.objects.get(pk="s")
        page = viewer.get("/sessions/s/").content.decode()
        fragment = viewer.get("/sessions/s/", HTTP_HX_REQUEST="true")
    other.close()
    assert lease.acquired_at is not None and lease.acquired_at <= lease.expires_at
    assert f"held by <code>{lease.owner}</code>" in page
    assert f'since <time datetime="{lease.acquired.isoformat()}' in page
    assert fragment.status_code == 200


def stale_rows(now: float) -> None:
    SessionLease.objects.create(session_id="killed", owner="host:111:dead:1", expires_at=now - 3600,
                                acquired_at=now - 3630)
    SessionWaiter.objects.create(session_id="killed", owner="host:111:dead:2", expires_at=now - 3600)
    SessionLease.objects.create(session_id="busy", owner="host:222:alive:1", expires_at=now + 3600)
    SessionWaiter.objects.create(session_id="busy", owner="host:222:alive:2", expires_at=now + 3600)


def test_a_turn_deletes_the_expired_lease_and_waiter_rows_of_killed_processes():
    stale_rows(time.time())
    with DjangoSessionStore().sync_turn("other", registry.starting_agent()):
        pass
    assert list(SessionLease.objects.values_list("session_id", flat=True)) == ["busy"]
    assert list(SessionWaiter.objects.values_list("session_id", flat=True)) == ["busy"]


def test_the_purge_command_deletes_them_too_and_says_how_many():
    stale_rows(time.time())
    out = io.StringIO()
    call_command("chatflow_purge_dedup", stdout=out)
    assert out.getvalue().splitlines()[1] == "Purged 2 expired session lease and waiter rows."
    assert list(SessionLease.objects.values_list("session_id", flat=True)) == ["busy"]
    assert list(SessionWaiter.objects.values_list("session_id", flat=True)) == ["busy"]
