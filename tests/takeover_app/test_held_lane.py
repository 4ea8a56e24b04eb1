"""A message to a session an operator holds needs no model call: it is stored while every worker slot plays a
slow bot turn, not after them."""

from __future__ import annotations

import pytest

from tests.takeover_app.conftest import texts
from tests.takeover_app.test_held_and_replies import owned  # noqa: F401 - a fixture
from tests.webhooks_app import payloads as p
from tests.webhooks_app.running import running_worker
from tests.webhooks_app.servers import wait_until
from tests.webhooks_app.test_endpoints import post_wa
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"  # owned by an operator
BOT_CUSTOMER = "15550999"


def status(wamid: str) -> tuple[str, str]:
    d = InboundDelivery.objects.get(provider_message_id=wamid)
    return d.status, d.reply_status


def test_a_held_message_does_not_wait_behind_a_bot_turn_holding_every_slot(client, env, owned):  # noqa: F811
    env.block.touch()
    with running_worker(slots=1):
        try:
            post_wa(client, p.whatsapp(p.wa_text("wamid.slow", "think hard [block]", wa_id=BOT_CUSTOMER),
                                       wa_id=BOT_CUSTOMER))
            wait_until(lambda: any("[block]" in line for line in env.engine_calls()), 20, "the bot turn to start")
            post_wa(client, p.whatsapp(p.wa_text("wamid.held", "are you still there?")))
            wait_until(lambda: status("wamid.held") == ("done", "held"), 20, "the held message to be stored")
            assert status("wamid.slow")[0] == "running"  # the only slot still plays the bot turn
            assert texts(SID)[-1] == ("user", "are you still there?")
        finally:
            env.block.unlink(missing_ok=True)  # the bot turn ends
        wait_until(lambda: status("wamid.slow") == ("done", "sent"), 20, "the bot turn to end")
    assert [b["to"] for b in env.wa.bodies()] == [BOT_CUSTOMER]  # the held message got no answer
