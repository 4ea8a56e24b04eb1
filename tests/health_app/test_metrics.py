"""/metrics: refused to anonymous callers (plain 401/403, no traceback), open to staff and the bearer token,
and the counters after known traffic (turn records, deliveries, webhook responses)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_generic, post_wa
from turns_app.models import TurnRecord

pytestmark = pytest.mark.django_db

TOKEN = "scrape-me-7f3a"


def samples(body: bytes) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text body."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


@pytest.fixture(autouse=True)
def token(settings):
    settings.CHATFLOW_METRICS_TOKEN = TOKEN


def test_anonymous_callers_and_wrong_tokens_are_refused_in_plain_text(client, caplog):
    r = client.get("/metrics")
    assert r.status_code == 401 and r["Content-Type"].startswith("text/plain") and r["WWW-Authenticate"]
    assert b"Traceback" not in r.content and b"chatflow_" not in r.content
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    assert wrong.status_code == 401 and b"chatflow_" not in wrong.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401
    customer = personas.client_for(personas.customer()).get("/metrics")
    assert customer.status_code == 403 and b"chatflow_" not in customer.content
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
    refusals = [r for r in caplog.records if r.name == "django.request"]
    assert len(refusals) == 5 and all(r.exc_info is None for r in refusals)  # one line each


def test_a_staff_login_and_the_bearer_token_may_read(client, settings):
    assert personas.client_for(personas.viewer()).get("/metrics").status_code == 200
    ok = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain; version=0.0.4")
    settings.CHATFLOW_METRICS_TOKEN = ""  # no token configured: a bearer header opens nothing
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_the_counters_after_known_traffic(client):
    now = timezone.now()

    def record(status: str, ms: float | None, calls: list, cost: str | None, tokens=(0, 0, 0)) -> None:
        TurnRecord.objects.create(session_id="m", owner="h:1:x:", status=status, started_at=now,
                                  finished_at=None if status == "running" else now, duration_ms=ms, calls=calls,
                                  input_tokens=tokens[0], output_tokens=tokens[1], cached_tokens=tokens[2],
                                  cost=None if cost is None else Decimal(cost))

    call = {"provider": "openai", "model": "gpt-4o-mini", "ttft_ms": 80.0}
    record("completed", 400.0, [call, {**call, "ttft_ms": 700.0}], "0.0125", (100, 20, 5))
    record("completed", 3000.0, [{**call, "ttft_ms": None}], "0.0075", (50, 10, 0))
    record("failed", 12000.0, [{**call, "model": "mystery"}], None, (7, 0, 0))
    record("running", None, [], None)
    post_generic(client, p.generic("q-1", "g-1", "one"))
    post_generic(client, p.generic("q-2", "g-2", "two"))
    post_generic(client, p.generic("q-3", "g-3", "bad"), signature="sha256=00")
    post_wa(client, p.whatsapp(p.wa_text("wamid.M1", "hi")))
    from webhooks_app.models import InboundDelivery
    InboundDelivery.objects.filter(provider_message_id="g-1").update(first_seen=now - timedelta(seconds=90))

    m = samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content)
    assert m[("chatflow_turns_total", (("status", "completed"),))] == 2
    assert m[("chatflow_turns_total", (("status", "failed"),))] == 1
    assert m[("chatflow_turns_running", ())] == 1  # a gauge: running is not an end
    assert ("chatflow_turns_total", (("status", "running"),)) not in m
    assert m[("chatflow_turns_total", (("status", "cancelled"),))] == 0
    assert m[("chatflow_turn_duration_seconds_count", ())] == 3
    assert m[("chatflow_turn_duration_seconds_sum", ())] == pytest.approx(15.4)
    assert m[("chatflow_turn_duration_seconds_bucket", (("le", "0.5"),))] == 1
    assert m[("chatflow_turn_duration_seconds_bucket", (("le", "5.0"),))] == 2
    assert m[("chatflow_turn_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert m[("chatflow_time_to_first_token_seconds_count", ())] == 3  # the calls that reported one
    assert m[("chatflow_time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 2
    assert m[("chatflow_time_to_first_token_seconds_bucket", (("le", "0.5"),))] == 2
    assert m[("chatflow_time_to_first_token_seconds_bucket", (("le", "1.0"),))] == 3
    assert m[("chatflow_tokens_total", (("kind", "input"),))] == 157
    assert m[("chatflow_tokens_total", (("kind", "output"),))] == 30
    assert m[("chatflow_tokens_total", (("kind", "cached"),))] == 5
    assert m[("chatflow_cost_usd_total", ())] == pytest.approx(0.02)
    assert m[("chatflow_turns_cost_unknown_total", ())] == 1
    assert m[("chatflow_queue_depth", (("provider", "generic"), ("status", "queued")))] == 2
    assert m[("chatflow_queue_depth", (("provider", "whatsapp"), ("status", "queued")))] == 1
    assert m[("chatflow_queue_depth", (("provider", "telegram"), ("status", "queued")))] == 0
    assert 90 <= m[("chatflow_queue_oldest_age_seconds", (("provider", "generic"),))] < 3600
    assert m[("chatflow_queue_oldest_age_seconds", (("provider", "telegram"),))] == 0


def test_webhook_responses_are_counted_by_channel_and_status(client):
    def responses() -> dict[tuple, float]:
        m = samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content)
        return {k: v for k, v in m.items() if k[0] == "chatflow_webhook_responses_total"}

    before = responses()
    assert post_generic(client, p.generic("w-1", "w-1", "one")).status_code == 202
    assert post_generic(client, p.generic("w-1", "w-1", "one")).status_code == 200  # a duplicate
    assert post_generic(client, p.generic("w-2", "w-2", "x"), signature="sha256=00").status_code == 403
    assert client.get("/webhooks/generic/").status_code == 405
    after = responses()

    def grew(code: str) -> float:
        key = ("chatflow_webhook_responses_total", (("channel", "generic"), ("code", code)))
        return after.get(key, 0) - before.get(key, 0)

    assert (grew("202"), grew("200"), grew("403"), grew("405")) == (1, 1, 1, 1)


def test_no_counter_goes_down_as_turns_end_and_are_rolled_back(client):
    from turns_app.usage import mark_rolled_back

    now = timezone.now()

    def counters() -> dict[tuple, float]:
        m = samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content)
        return {k: v for k, v in m.items() if k[0].endswith("_total") and not k[0].startswith("chatflow_webhook")}

    running = TurnRecord.objects.create(session_id="m", owner="h:1:a:", status="running", started_at=now)
    TurnRecord.objects.create(session_id="m", owner="h:1:b:", status="completed", started_at=now, finished_at=now,
                              first_message_id=7, input_tokens=5, output_tokens=1, cost=Decimal("0.1"))
    before = counters()
    gauge = samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content)
    assert gauge[("chatflow_turns_running", ())] == 1

    TurnRecord.objects.filter(pk=running.pk).update(status="completed", finished_at=now, input_tokens=2,
                                                    output_tokens=1, cost=Decimal("0.2"), first_message_id=9)
    assert mark_rolled_back("m", [7, 9]) == 2
    after = counters()

    assert all(after.get(key, 0) >= value for key, value in before.items()), (before, after)
    assert after[("chatflow_turns_total", (("status", "completed"),))] == 2  # how they ended
    assert after[("chatflow_turns_rolled_back_total", ())] == 2
    m = samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content)
    assert m[("chatflow_turns_running", ())] == 0
