"""Retention: sessions past their channel's limit are deleted through the store, held ones are skipped until free,
each run is audited with counts, the command's dry run changes nothing, and a malformed policy is refused."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.utils import timezone

from chatflow_agent.exceptions import SessionDeletedError
from sessions_app import retention, runtime
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from takeover_app import service
from tests.chatflow_site.test_settings import settings_from
from tests.sessions_app import personas
from tests.sessions_app.conversations import model, store, user

POLICY = "web=30,whatsapp=180,telegram=0,default=90"


def aged(session_id: str, days: float, channel: str | None) -> ChatSession:
    """A session of ``channel`` (None: no channel) whose last message was ``days`` ago."""
    metadata = {} if channel is None else {"channel": channel, "wa_id": "15550100", "profile_name": "Ana"}
    return store(session_id, [user("my phone is +1 555 0100"), model("noted")], metadata=metadata,
                 updated=timezone.now() - timedelta(days=days))


def remaining() -> set[str]:
    return set(ChatSession.objects.values_list("pk", flat=True))


@pytest.fixture
def policy(settings):
    settings.CHATFLOW_RETENTION_DAYS = settings_from({"CHATFLOW_RETENTION_DAYS": POLICY})["CHATFLOW_RETENTION_DAYS"]
    return retention.Policy.from_settings()


@pytest.mark.django_db
def test_it_deletes_exactly_the_sessions_past_their_channels_limit(policy):
    aged("web-old", 31, "web")
    aged("web-new", 29, "web")
    aged("wa-old", 181, "WhatsApp")  # the channel's case does not matter
    aged("wa-mid", 100, "whatsapp")  # past the default's limit, within WhatsApp's
    aged("tg-ancient", 5000, "telegram")  # 0: kept for ever
    aged("generic-old", 91, "generic")  # not listed: the default's limit
    aged("generic-new", 89, "generic")
    aged("none-old", 91, None)

    report = retention.sweep(policy=policy, batch=2)

    assert remaining() == {"web-new", "wa-mid", "tg-ancient", "generic-new"}
    assert dict(report.deleted) == {"web": 1, "whatsapp": 1, "default": 2}
    assert not ChatMessage.objects.filter(session_id__in=["web-old", "wa-old", "generic-old", "none-old"]).exists()


@pytest.mark.django_db
def test_the_audit_entry_has_the_counts_and_no_personal_data(policy):
    aged("web-old", 31, "web")
    aged("web-busy", 40, "web")
    aged("none-old", 91, None)
    store_ = runtime.site_store()
    assert store_.backend.acquire_lease("web-busy", "test:turn", 60, False)

    report = retention.sweep(policy=policy)

    entry = OperatorAction.objects.get(pk=report.audit_id)
    assert (entry.action, entry.session_id, entry.actor_id) == ("retention", "", None)
    assert entry.before == {"policy_days": {"default": 90, "telegram": 0, "web": 30, "whatsapp": 180}}
    assert entry.after == {
        "via": "command", "deleted": 2, "skipped": 1, "skipped_because": {"turn_running": 1},
        "channels": {"default": {"deleted": 1, "skipped": 0, "skipped_because": {}},
                     "web": {"deleted": 1, "skipped": 1, "skipped_because": {"turn_running": 1}}}}
    text = f"{entry.before} {entry.after}"
    assert "web-old" not in text and "555" not in text and "Ana" not in text


@pytest.mark.django_db
def test_a_session_whose_turn_is_running_is_skipped_then_deleted_once_free(policy):
    aged("web-busy", 31, "web")
    backend = runtime.site_store().backend
    assert backend.acquire_lease("web-busy", "test:turn", 60, False)

    first = retention.sweep(policy=policy)
    assert "web-busy" in remaining()
    assert first.by_reason() == {"turn_running": 1} and first.total_deleted == 0

    backend.release_lease("web-busy", "test:turn")
    second = retention.sweep(policy=policy)
    assert "web-busy" not in remaining() and second.total_deleted == 1


@pytest.mark.django_db
def test_a_session_in_takeover_is_skipped_then_deleted_once_handed_back(policy):
    aged("wa-waiting", 200, "whatsapp")
    service.start_waiting("wa-waiting", trigger="phrase", reason="asked for a person")

    assert retention.sweep(policy=policy).by_reason() == {"takeover": 1}
    assert "wa-waiting" in remaining()

    service.hand_back(personas.operator(), "wa-waiting")
    later = timezone.now() + timedelta(days=181)  # a later run, once the hand-back is old news too
    assert retention.sweep(policy=policy, now=later).total_deleted == 1
    assert "wa-waiting" not in remaining()


@pytest.mark.django_db
def test_a_live_session_object_learns_it_was_deleted(policy):
    aged("web-old", 31, "web")
    live = runtime.site_store().get("web-old")

    retention.sweep(policy=policy)

    with pytest.raises(SessionDeletedError):
        live.add_message(user("are you there?"))
    assert remaining() == set()


@pytest.mark.django_db
def test_the_commands_dry_run_counts_per_channel_and_changes_nothing(policy):
    aged("web-old", 31, "web")
    aged("web-busy", 32, "web")
    aged("none-old", 91, None)
    assert runtime.site_store().backend.acquire_lease("web-busy", "test:turn", 60, False)
    audits = OperatorAction.objects.count()
    out = io.StringIO()

    call_command("chatflow_retention", "--dry-run", stdout=out, verbosity=0)

    assert remaining() == {"web-old", "web-busy", "none-old"} and OperatorAction.objects.count() == audits
    text = out.getvalue()
    assert "web (after 30 days): would delete 1, skipped 1 (turn_running 1)" in text
    assert "default (after 90 days): would delete 1, skipped 0" in text
    assert "Kept for ever: telegram." in text and "Dry run: nothing was changed." in text


@pytest.mark.django_db
def test_the_command_deletes_and_audits(policy):
    aged("web-old", 31, "web")
    out = io.StringIO()

    call_command("chatflow_retention", "--batch", "1", stdout=out, verbosity=0)

    assert remaining() == set()
    assert "Total: 1 deleted, 0 skipped" in out.getvalue()
    assert OperatorAction.objects.get(action="retention").after["deleted"] == 1


@pytest.mark.django_db
def test_a_worker_run_that_finds_nothing_writes_no_audit_entry(policy):
    aged("web-new", 1, "web")

    report = retention.sweep(policy=policy, via="worker")

    assert report.audit_id is None and not OperatorAction.objects.filter(action="retention").exists()


@pytest.mark.parametrize(("value", "says"), [
    ("web=thirty", "must give web a whole number of days from 0 to 36500"),
    ("web=-1", "must give web a whole number of days"),
    ("web=99999999", "must give web a whole number of days"),
    ("web:30", "must be channel=days pairs"),
    ("=30", "must be channel=days pairs"),
    ("web=30,WEB=10", "names the channel 'web' twice"),
])
def test_a_malformed_policy_is_refused_naming_the_variable(value, says):
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_from({"CHATFLOW_RETENTION_DAYS": value})

    assert f"CHATFLOW_RETENTION_DAYS {says}" in str(refused.value)


def test_an_unset_policy_keeps_every_session():
    assert settings_from({})["CHATFLOW_RETENTION_DAYS"] == {}
    assert retention.Policy({}).keeps_all and retention.Policy({"web": 0, "default": 0}).keeps_all
    assert settings_from({"CHATFLOW_RETENTION_DAYS": " Web = 30 , default=0 "})["CHATFLOW_RETENTION_DAYS"] == {
        "web": 30, "default": 0}
