"""The queue worker in process: turns, replies to fake provider APIs, failures, recovery, ledger and TTL."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections
from django.utils import timezone

from chatflow_agent.types import Role
from sessions_app import runtime
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, ProcessedMessage
from sessions_app.store import session_committing
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.test_endpoints import post_generic, post_tg, post_wa
from webhooks_app import ledger, replies, settle, taskqueue
from webhooks_app.models import InboundDelivery
from webhooks_app.worker import FALLBACK_REPLY, RESET_REPLY, UNSUPPORTED_REPLY, Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def apis(settings, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATFLOW_TEST_DOWN_FILE", str(tmp_path / "down"))
    settings.CHATFLOW_AGENTS = "tests.webhooks_app.agents.build"
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        settings.WHATSAPP_API_BASE = wa.base
        settings.TELEGRAM_API_BASE = tg.base
        yield wa, tg


def drain(slots: int = 2) -> int:
    return asyncio.run(Worker(slots=slots, poll=0.05).run(drain=True))


def texts(session_id: str) -> list[tuple[str, str]]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id").values_list("role", "content"))


def test_a_whatsapp_text_plays_one_turn_and_sends_one_reply(client, apis):
    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.A", "Where is order 404?")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.A", "Where is order 404?")))  # redelivery before the worker
    assert drain() == 1
    assert texts("15550100") == [("user", "Where is order 404?"), ("model", "echo: Where is order 404?")]
    assert wa.bodies() == [{"messaging_product": "whatsapp", "recipient_type": "individual", "to": "15550100",
                            "type": "text", "text": {"preview_url": False, "body": "echo: Where is order 404?"}}]
    assert wa.requests[0]["path"] == f"/{p.PHONE_NUMBER_ID}/messages"
    assert wa.requests[0]["headers"]["Authorization"] == f"Bearer {p.WA_TOKEN}"
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status, d.attempts, d.duplicates_suppressed) == ("done", "sent", 1, 1)
    meta = ChatSession.objects.get(pk="15550100").metadata
    assert meta["channel"] == "whatsapp" and meta["profile_name"] == "Ana"
    assert meta["phone_number_id"] == p.PHONE_NUMBER_ID
    assert meta[taskqueue.MARKER_KEY] == d.marker


def test_messages_of_one_sender_are_played_in_order_in_one_session(client, apis):
    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.1", "first [slow 0.3]")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.2", "second")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.3", "third")))
    assert drain(slots=4) == 3
    users = [c for r, c in texts("15550100") if r == Role.USER.value]
    assert users == ["first [slow 0.3]", "second", "third"]
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: first [slow 0.3]", "echo: second", "echo: third"]


def test_an_unsupported_type_gets_one_polite_reply_and_its_placeholder_in_the_conversation(client, apis):
    wa, _ = apis
    audio = {"from": "15550100", "id": "wamid.V", "type": "audio", "audio": {"id": "media1"}}
    post_wa(client, p.whatsapp(audio))
    post_wa(client, p.whatsapp(audio))
    drain()
    assert [b["text"]["body"] for b in wa.bodies()] == [UNSUPPORTED_REPLY]
    assert texts("15550100") == [("user", "[audio]"), ("model", UNSUPPORTED_REPLY)]  # no model call


def test_a_whatsapp_image_after_a_text_stands_in_the_conversation_and_the_transcript(client, apis):
    from console_app import export

    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.T", "my order is damaged")))
    image = {"from": "15550100", "id": "wamid.I", "type": "image",
             "image": {"id": "media2", "mime_type": "image/jpeg", "caption": "the box"}}
    post_wa(client, p.whatsapp(image))
    location = {"from": "15550100", "id": "wamid.L", "type": "location",
                "location": {"latitude": 38.7, "longitude": -9.1}}
    post_wa(client, p.whatsapp(location))
    drain()
    assert texts("15550100") == [("user", "my order is damaged"), ("model", "echo: my order is damaged"),
                                 ("user", "[image] the box"), ("model", UNSUPPORTED_REPLY),
                                 ("user", "[location]"), ("model", UNSUPPORTED_REPLY)]
    assert [b["text"]["body"] for b in wa.bodies()][1:] == [UNSUPPORTED_REPLY, UNSUPPORTED_REPLY]
    said = [m["content"] for turn in export.transcript(ChatSession.objects.get(pk="15550100"))["turns"]
            for m in turn["messages"] if m["role"] == "user"]
    assert said == ["my order is damaged", "[image] the box", "[location]"]
    staff = personas.client_for(personas.operator())
    page = staff.get("/sessions/15550100/").content.decode()
    assert "[image] the box" in page and "[location]" in page


def test_a_telegram_voice_message_stands_in_the_conversation(client, apis):
    _, tg = apis
    post_tg(client, p.telegram(20, None, voice={"file_id": "v1", "duration": 3}))
    drain()
    session_id = ChatSession.objects.get().session_id
    assert texts(session_id) == [("user", "[voice message]"), ("model", UNSUPPORTED_REPLY)]
    assert [b["text"] for b in tg.bodies()] == [UNSUPPORTED_REPLY]


def test_a_provider_outage_rolls_back_sends_one_fallback_and_can_be_retried(client, apis, tmp_path):
    wa, _ = apis
    (tmp_path / "down").touch()
    post_wa(client, p.whatsapp(p.wa_text("wamid.F", "help [down]")))
    drain()
    d = InboundDelivery.objects.get()
    assert d.status == "failed" and "ProviderDown" in d.error and d.reply_status == "sent"
    assert texts("15550100") == [] and not ProcessedMessage.objects.filter(pk="wamid.F").exists()
    assert [b["text"]["body"] for b in wa.bodies()] == [FALLBACK_REPLY]

    viewer = personas.client_for(personas.viewer())
    assert viewer.post(f"/webhooks/deliveries/{d.pk}/retry/").status_code == 403
    assert personas.client_for(None).post(f"/webhooks/deliveries/{d.pk}/retry/").status_code == 302
    (tmp_path / "down").unlink()
    operator = personas.client_for(personas.operator())
    r = operator.post(f"/webhooks/deliveries/{d.pk}/retry/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and b"queued again" in r.content
    audit = OperatorAction.objects.get(action="retry_delivery")
    assert audit.actor_username == "olga.operator" and audit.session_id == "15550100"
    assert operator.post(f"/webhooks/deliveries/{d.pk}/retry/").status_code == 409  # queued, not failed
    drain()
    d.refresh_from_db()
    assert (d.status, d.attempts) == ("done", 2)  # attempts count every play, retries included
    assert texts("15550100") == [("user", "help [down]"), ("model", "echo: help [down]")]
    assert [b["text"]["body"] for b in wa.bodies()] == [FALLBACK_REPLY, "echo: help [down]"]


def test_a_retry_needs_csrf(client, apis, tmp_path):
    (tmp_path / "down").touch()
    post_wa(client, p.whatsapp(p.wa_text("wamid.C", "x [down]")))
    drain()
    d = InboundDelivery.objects.get()
    operator = personas.client_for(personas.operator(), csrf=True)
    assert operator.post(f"/webhooks/deliveries/{d.pk}/retry/").status_code == 403
    d.refresh_from_db()
    assert d.status == "failed"


def _play_turn(delivery: InboundDelivery, owner: str) -> None:
    """Play ``delivery``'s turn as a worker does, up to its commit (then nothing: a crash, or the caller's test)."""
    async def play() -> None:
        play = settle.Playing(delivery, owner, replies_out=True)
        await runtime.site_runner().run_async(delivery.session_id, delivery.text, delivery.metadata,
                                              turn_metadata={taskqueue.MARKER_KEY: delivery.marker},
                                              hooks=play.hooks())

    asyncio.run(play())


def test_the_turns_commit_records_its_answer_and_that_the_reply_is_being_sent(client, apis):
    post_wa(client, p.whatsapp(p.wa_text("wamid.K", "once")))
    d = taskqueue.claim_next("worker:crashed", 30)
    _play_turn(d, "worker:crashed")
    d.refresh_from_db()
    assert len(texts("15550100")) == 2
    assert (d.status, d.reply_status, d.answer, d.lease_owner) == ("running", "sending", "echo: once", "worker:crashed")


def test_a_turn_committed_before_a_crash_is_neither_played_nor_answered_again(client, apis):
    """SIGKILL after the turn's commit and before the send, simulated: the reclaiming worker finds the marker,
    does not play the turn again and does not send (the reply may have gone out): the ledger shows it unknown,
    for an operator to send again."""
    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.K", "once")))
    d = taskqueue.claim_next("worker:crashed", 30)
    _play_turn(d, "worker:crashed")
    InboundDelivery.objects.filter(pk=d.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert drain() == 0  # finished, not played
    assert len(texts("15550100")) == 2 and wa.bodies() == []
    d = ledger.with_reply_state().get(pk=d.pk)
    assert (d.status, d.attempts, d.reply_status, d.reply_unknown, d.resendable) == ("done", 2, "sending", True, True)


def test_a_worker_stopped_after_the_commit_and_before_the_send_gives_the_reply_back_to_be_sent(client, apis):
    """Cancelled (a second SIGTERM) once the turn committed, before its send began: nothing went out, so the
    delivery goes back to the queue with its ``sending`` cleared; the next worker sends the reply, once,
    without playing the turn again."""
    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.C", "hello")))

    async def stop_after_the_commit() -> None:
        run = asyncio.ensure_future(Worker(slots=1, poll=0.05).run())

        async def on_event(event) -> None:
            if event.type == "turn_completed":  # committed; the worker stops while the turn still reports it
                run.cancel()
                await asyncio.sleep(5)  # a slow subscriber: the stop reaches the turn here, before the send

        stop = runtime.site_runner().subscribe(on_event)
        try:
            with pytest.raises(asyncio.CancelledError):
                await run
        finally:
            stop()

    asyncio.run(stop_after_the_commit())
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status, d.lease_owner) == ("queued", "", "") and wa.bodies() == []
    assert len(texts("15550100")) == 2
    assert drain() == 1
    assert len(texts("15550100")) == 2 and [b["text"]["body"] for b in wa.bodies()] == ["echo: hello"]
    d.refresh_from_db()
    assert (d.status, d.reply_status) == ("done", "sent")


def test_a_turn_whose_delivery_passed_to_another_worker_is_refused_at_its_commit(client, apis):
    """The delivery's lease expired mid-turn and another worker claimed it: this turn's commit writes nothing
    (the other worker plays it), instead of a turn the other would play a second time."""
    post_wa(client, p.whatsapp(p.wa_text("wamid.L", "hello")))
    d = taskqueue.claim_next("worker:slow", 30)

    def taken_over() -> None:  # on a thread of its own, which closes its connection
        try:
            InboundDelivery.objects.filter(pk=d.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
            assert taskqueue.claim_next("worker:other", 30) is not None
        finally:
            connection.close()

    async def on_event(event) -> None:
        if event.type == "turn_started":
            await asyncio.to_thread(taken_over)

    stop = runtime.site_runner().subscribe(on_event)
    try:
        with pytest.raises(settle.DeliveryLost):
            _play_turn(d, "worker:slow")
    finally:
        stop()
    assert texts("15550100") == []
    d.refresh_from_db()
    assert (d.status, d.lease_owner, d.reply_status, d.answer) == ("running", "worker:other", "", "")


def test_a_delivery_whose_worker_died_is_claimed_again_after_the_visibility_timeout(client, apis):
    post_wa(client, p.whatsapp(p.wa_text("wamid.D", "hello")))
    dead = taskqueue.claim_next("worker:dead", 30)
    assert dead is not None and taskqueue.claim_next("worker:other", 30) is None  # invisible while leased
    InboundDelivery.objects.filter(pk=dead.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert drain() == 1
    assert not taskqueue.renew(dead, "worker:dead", 30)  # the dead owner's lease is gone
    assert InboundDelivery.objects.get().status == "done"


def test_claims_take_the_oldest_unblocked_delivery_whether_queued_or_expired(client, apis):
    """Claimable = queued, or running with an expired lease; never behind an earlier open delivery of
    its session. The oldest such delivery goes first, whichever of the two kinds it is."""
    def send(wamid: str, wa_id: str) -> None:
        post_wa(client, p.whatsapp(p.wa_text(wamid, "hi", wa_id=wa_id), wa_id=wa_id))

    send("wamid.A1", "15550101")  # A1 (oldest)
    send("wamid.B1", "15550102")  # B1
    send("wamid.A2", "15550101")  # A2: behind A1 while A1 is open
    send("wamid.C1", "15550103")  # C1
    ids = dict(InboundDelivery.objects.values_list("provider_message_id", "pk"))

    def claimed(owner: str) -> str | None:
        d = taskqueue.claim_next(owner, 30)
        return None if d is None else d.provider_message_id

    assert [claimed("w1"), claimed("w1")] == ["wamid.A1", "wamid.B1"]
    assert claimed("w1") == "wamid.C1"  # A2 waits behind the running A1
    assert claimed("w1") is None
    # A1's worker dies: once its lease expires A1 (older than everything queued) is claimed again
    # before anything else, and A2 still waits.
    InboundDelivery.objects.filter(pk=ids["wamid.A1"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    send("wamid.D1", "15550104")
    assert [claimed("w2"), claimed("w2"), claimed("w2")] == ["wamid.A1", "wamid.D1", None]
    # A1 done, B1 expired: B1 (running, older) is claimed before A2 (queued, newer).
    InboundDelivery.objects.filter(pk=ids["wamid.A1"]).update(status="done")
    InboundDelivery.objects.filter(pk=ids["wamid.B1"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert [claimed("w3"), claimed("w3"), claimed("w3")] == ["wamid.B1", "wamid.A2", None]
    assert InboundDelivery.objects.get(pk=ids["wamid.A1"]).attempts == 2


def test_telegram_long_answers_are_split_and_reset_clears_history(client, apis):
    _, tg = apis
    post_tg(client, p.telegram(10, "hello"))
    post_tg(client, p.telegram(11, "[long]"))
    drain()
    bodies = tg.bodies()
    assert [b["chat_id"] for b in bodies] == [998877] * 3
    assert all(b["parse_mode"] == "HTML" for b in bodies)
    assert bodies[0]["text"] == "echo: hello"
    assert all(replies.utf16_len(b["text"]) <= 4096 for b in bodies[1:])
    assert "".join(b["text"] for b in bodies[1:]).replace("&lt;b&gt;", "<b>").replace("&lt;/b&gt;", "</b>") == \
        "Ω<b>" + "x" * 5000 + "😀" * 10 + "</b>"
    assert tg.requests[0]["path"] == f"/bot{p.TG_BOT}/sendMessage"
    assert len(texts("tg:998877")) == 4
    post_tg(client, p.telegram(12, "/reset"))
    drain()
    assert texts("tg:998877") == []
    assert tg.bodies()[-1]["text"] == RESET_REPLY


def test_generic_wait_returns_the_answer(client, apis):
    from tests.webhooks_app.running import running_worker

    with running_worker():
        r = post_generic(client, p.generic("web:1", "m-1", "hi there"), query="?wait=true")
        assert r.status_code == 200, r.content
        assert r.json()["answer"] == "echo: hi there" and r.json()["status"] == "done"
        r = post_generic(client, p.generic("web:1", "m-2", "boom [fail]"), query="?wait=true")
    assert r.status_code == 502 and r.json()["error"] == "turn_failed"
    assert texts("web:1") == [("user", "hi there"), ("model", "echo: hi there")]


def test_the_ledger_shows_on_the_session_page(client, apis, tmp_path):
    (tmp_path / "down").touch()
    post_wa(client, p.whatsapp(p.wa_text("wamid.<L>", "x [down]")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.<L>", "x [down]")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.ok", "fine")))
    drain()
    ChatSession.objects.get_or_create(pk="15550100", defaults={"active_agent_name": "Echo"})
    page = personas.client_for(personas.operator()).get("/sessions/15550100/")
    html = page.content.decode()
    assert page.status_code == 200 and 'id="dedup-ledger"' in html
    assert "wamid.&lt;L&gt;" in html and "wamid.<L>" not in html
    assert ">Retry</button>" in html
    fragment = personas.client_for(personas.viewer()).get("/webhooks/ledger/15550100/", HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and b"dedup-ledger" in fragment.content
    assert b">Retry</button>" not in fragment.content


# ---- TTL ---------------------------------------------------------------------------------------------
def _age(key: str, hours: float) -> None:
    ProcessedMessage.objects.filter(pk=key).update(processed_at=timezone.now() - timedelta(hours=hours))


def test_the_ttl_window_is_fixed_from_the_first_delivery(client, apis, settings):
    body = p.whatsapp(p.wa_text("wamid.T", "hi"))
    post_wa(client, body)
    first = ProcessedMessage.objects.get(pk="wamid.T").processed_at
    for _ in range(3):
        post_wa(client, body)
    assert ProcessedMessage.objects.get(pk="wamid.T").processed_at == first  # redeliveries never extend it
    _age("wamid.T", 191.9)
    post_wa(client, body)
    d = InboundDelivery.objects.get()
    assert d.duplicates_suppressed == 4 and d.status == "queued"
    drain()
    _age("wamid.T", 192.1)  # past the TTL from the FIRST delivery: a new delivery
    post_wa(client, body)
    d.refresh_from_db()
    assert (d.status, d.duplicates_suppressed) == ("queued", 0)
    drain()
    assert [c for r, c in texts("15550100") if r == "user"] == ["hi", "hi"]


def test_a_delivery_reclaimed_while_its_reply_was_sending_is_finished_without_sending_again(client, apis):
    """SIGKILL after the ``sending`` write, simulated: the reply may have gone out, so it is never re-sent."""
    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.S", "hello")))
    dead = taskqueue.claim_next("worker:dead", 30)
    assert taskqueue.finish(dead, "worker:dead", "echo: hello", InboundDelivery.Reply.SENDING)
    InboundDelivery.objects.filter(pk=dead.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    drain()
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status, d.attempts) == ("done", "sending", 2) and "not sent again" in d.reply_error
    assert wa.bodies() == []


def test_a_failed_reply_is_recorded_and_the_delivery_is_done(client, apis):
    wa, _ = apis
    wa.fail_status = 500
    post_wa(client, p.whatsapp(p.wa_text("wamid.R", "hello")))
    drain()
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status) == ("done", "failed") and "500" in d.reply_error
    assert len(wa.bodies()) == 1  # tried once, not retried


def test_a_turn_whose_commit_is_refused_after_the_answer_was_recorded_records_it_again_when_played_again(client, apis):
    """The commit records the answer first, then is refused (the session lease passed to an operator's takeover
    "now", say): that write rolls back with the turn, so the turn played again records it in its own commit, and
    the reply goes out once, marked sending first."""
    from chatflow_agent.exceptions import SessionBusyError
    from sessions_app.store import session_committing

    wa, _ = apis
    post_wa(client, p.whatsapp(p.wa_text("wamid.B", "hello")))
    refused: list[str] = []
    seen: list[str] = []

    def refuse_first(sender, session_id, **kwargs) -> None:  # the signal comes after the turn's settle hook
        seen.append(InboundDelivery.objects.get().reply_status)
        if not refused:
            refused.append(session_id)
            raise SessionBusyError(session_id)

    session_committing.connect(refuse_first, dispatch_uid="test.refuse_first")
    try:
        assert drain() == 1
    finally:
        session_committing.disconnect(dispatch_uid="test.refuse_first")
    assert refused == ["15550100"] and seen == ["sending", "sending"]  # recorded in each commit's transaction
    assert texts("15550100") == [("user", "hello"), ("model", "echo: hello")]
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status, d.answer) == ("done", "sent", "echo: hello")
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: hello"]


def test_a_delivery_done_by_its_turns_commit_is_not_taken_for_a_lost_lease(client, apis):
    """A delivery with no reply to send is done in its turn's commit; a heartbeat after that commit (the turn
    still reporting it) finds it done, not lost: the worker counts it and carries on."""
    post_generic(client, p.generic("web:3", "m-1", "hi"))
    post_generic(client, p.generic("web:3", "m-2", "again"))

    async def slow(event) -> None:
        if event.type == "turn_completed":
            await asyncio.sleep(0.4)  # several heartbeats after the commit

    async def run() -> int:
        stop = runtime.site_runner().subscribe(slow)
        try:
            return await Worker(slots=1, poll=0.05, visibility=0.3).run(drain=True)
        finally:
            stop()

    assert asyncio.run(run()) == 2
    assert list(InboundDelivery.objects.order_by("id").values_list("status", "answer")) == [
        ("done", "echo: hi"), ("done", "echo: again")]


def test_a_worker_cancelled_while_a_slot_claims_its_next_delivery_gives_that_delivery_back(client, apis, monkeypatch):
    """A hard stop (a second SIGTERM) while a slot's thread completes one delivery and claims the next: the
    claim finishes on its thread, and the delivery it took goes back to the queue at once instead of staying
    leased to a worker that is gone until its lease runs out."""
    import threading

    post_wa(client, p.whatsapp(p.wa_text("wamid.F", "first", wa_id="15550101")))
    post_wa(client, p.whatsapp(p.wa_text("wamid.N", "next", wa_id="15550102")))
    real = taskqueue.complete_and_claim_next
    entered, go = threading.Event(), threading.Event()

    def slow_complete_and_claim(*args: object):  # the slot's claim after completing its first delivery
        entered.set()
        go.wait(10)
        return real(*args)

    monkeypatch.setattr(taskqueue, "complete_and_claim_next", slow_complete_and_claim)

    async def cancel_during_the_claim() -> None:
        loop = asyncio.get_running_loop()
        run = asyncio.ensure_future(Worker(slots=1, poll=0.05).run())
        await loop.run_in_executor(None, entered.wait, 10)
        run.cancel()
        loop.call_later(0.3, go.set)  # the claim ends after the stop reached the slot
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(cancel_during_the_claim())
    first, following = InboundDelivery.objects.order_by("id")
    assert (first.status, first.reply_status) == ("done", "sent")
    assert (following.status, following.lease_owner, following.attempts) == ("queued", "", 0)
    assert drain() == 1


def test_a_slot_that_claims_past_a_session_it_freed_wakes_an_idle_slot_for_it(client, apis):
    """A slot finishes A1 and claims its next delivery itself: X, whose dead worker's lease ran out (no
    webhook wakes anyone for it), older than A2. A2 became claimable with A1's finish and the other slot
    is idle: it plays A2 at once, while X's slow turn runs, not after it."""
    def send(wamid: str, text: str, wa_id: str) -> None:
        post_wa(client, p.whatsapp(p.wa_text(wamid, text, wa_id=wa_id), wa_id=wa_id))

    send("wamid.X", "[slow 3] x", "15550111")
    x = taskqueue.claim_next("worker:dead", 3.0)  # its lease runs out while A1 plays
    send("wamid.A1", "[slow 4] a1", "15550100")
    send("wamid.A2", "a2", "15550100")
    assert asyncio.run(Worker(slots=2, poll=60).run(drain=True)) == 3
    rows = ChatMessage.objects.filter(session_id__in=["15550100", "15550111"]).order_by("id")
    assert [(r.session_id, r.content) for r in rows if r.role == "user"] == [
        ("15550100", "[slow 4] a1"), ("15550100", "a2"), ("15550111", "[slow 3] x")]
    assert InboundDelivery.objects.get(pk=x.pk).lease_owner != "worker:dead"


@pytest.mark.parametrize("slots", [0, -1, 1.5, True])
def test_a_worker_refuses_fewer_than_one_slot(slots):
    with pytest.raises(ValueError, match="at least one slot"):
        Worker(slots=slots)


def test_a_worker_without_slots_takes_the_setting(settings):
    settings.CHATFLOW_WORKER_SLOTS = 3
    assert Worker().slots == 3
    assert Worker(slots=1).slots == 1


def test_a_turn_whose_commit_met_a_dropped_connection_is_played_again_without_a_fallback(client, apis, tmp_path,
                                                                                         monkeypatch):
    wa, _ = apis
    log = tmp_path / "engine.log"
    monkeypatch.setenv("CHATFLOW_TEST_ENGINE_LOG", str(log))
    dropped: list[str] = []

    def drop_once(sender, session_id, **kwargs):
        if not dropped:  # what a connection the server dropped a moment ago raises at its next statement
            dropped.append(session_id)
            conn = connections["default"]

            def unusable_once() -> bool:  # the check after the failure finds it dropped (SQLite's never is)
                del conn.is_usable
                return False

            conn.is_usable = unusable_once
            raise OperationalError("server closed the connection unexpectedly")

    session_committing.connect(drop_once)
    try:
        post_wa(client, p.whatsapp(p.wa_text("wamid.DROP", "are you there?")))
        assert drain() == 1
    finally:
        session_committing.disconnect(drop_once)
    assert dropped == ["15550100"]
    assert [b["text"]["body"] for b in wa.bodies()] == ["echo: are you there?"]
    assert texts("15550100") == [("user", "are you there?"), ("model", "echo: are you there?")]
    assert len(log.read_text(encoding="utf-8").splitlines()) == 2  # played again once
    d = InboundDelivery.objects.get()
    assert (d.status, d.reply_status) == ("done", "sent")


def test_a_turn_the_database_refused_is_not_played_again(client, apis, tmp_path, monkeypatch):
    wa, _ = apis
    log = tmp_path / "engine.log"
    monkeypatch.setenv("CHATFLOW_TEST_ENGINE_LOG", str(log))

    def locked(sender, session_id, **kwargs):  # the connection is fine: the database refused the statement
        raise OperationalError("database is locked")

    session_committing.connect(locked)
    try:
        post_wa(client, p.whatsapp(p.wa_text("wamid.LOCKED", "are you there?")))
        drain()
    finally:
        session_committing.disconnect(locked)
    assert len(log.read_text(encoding="utf-8").splitlines()) == 1  # the model was called once, not twice
    assert texts("15550100") == []
    d = InboundDelivery.objects.get()
    assert d.status == "failed" and "database is locked" in d.error
    assert [b["text"]["body"] for b in wa.bodies()] == [FALLBACK_REPLY]
