"""CHATFLOW_WORKER_SLOTS: a queue worker's slots (the embedded worker's too), range-checked at start-up."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.chatflow_site.test_settings import settings_from
from tests.processes import run_manage, site_env
from tests.webhooks_app.servers import database_url


@pytest.mark.parametrize("value", ["0", "65", "four"])
def test_a_slot_count_out_of_range_stops_start_up_with_the_range(value):
    with pytest.raises(ImproperlyConfigured) as refused:
        settings_from({"CHATFLOW_WORKER_SLOTS": value})
    assert "CHATFLOW_WORKER_SLOTS must be a whole number of slots from 1 to 64" in str(refused.value)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_started_without_slots_takes_the_setting():
    """The embedded worker is ``chatflow_worker --embedded`` without ``--slots``: the setting decides."""
    env = site_env(DATABASE_URL=database_url(), CHATFLOW_WORKER_SLOTS="3")
    result = run_manage("chatflow_worker", "--drain", env=env)
    assert result.returncode == 0, result.stderr
    assert ": 3 slot(s)," in result.stdout
    given = run_manage("chatflow_worker", "--drain", "--slots", "2", env=env)
    assert ": 2 slot(s)," in given.stdout
