"""Queue workers: claim deliveries, play their turns exactly once, send their replies at most once.

A worker runs ``slots`` loops on one event loop; each has its own thread for queue queries (and so
its own database connection). Per delivery:

1. claim it (``taskqueue``) with a visibility timeout, renewed by a heartbeat while it runs; a lost
   lease cancels the turn (rolled back, invariant 3);
2. play the turn on the site's Runner, which writes the delivery's *marker* into the session's
   metadata as the turn's ``turn_metadata``, so the marker commits in the same transaction as the
   turn's rows, or not at all; that transaction also records the turn's answer on the delivery and
   ``reply_status=sending`` (``webhooks_app.settle``), or is refused when the delivery was cancelled
   or taken over by another worker meanwhile. A delivery claimed again after a crash between claim and
   commit plays its turn; one whose marker is already in the session is not played again (its answer
   is read back from the session and recorded then);
3. send the reply, then record ``sent``/``failed`` and ``done`` together. The delivery stays running
   until then, so one sender's replies go out in order. A delivery claimed again with ``sending``
   recorded is finished without sending: a crash between the commit and the end of the send never
   sends twice (at most one reply; the console shows it unknown and can send it again). A worker that
   stops before it began a send gives the delivery back with its ``sending`` cleared, so it is sent.

A message the bot cannot read (an image, a voice message, a location…) calls no model: its turn stores
its placeholder line (``[image]``) and the fixed answer (:data:`UNSUPPORTED_REPLY`) with the marker, so
the conversation and the transcript show what the customer sent and what they were told. It is a turn of
the site's Runner with the turn policy's ``answered_gate`` (see below): while an operator has the session it
is held like any message (the placeholder stored and counted unread, nothing sent).

Engine failure: the turn is rolled back, one fallback reply is sent, and the delivery is marked failed
(the claim on its id is released in the same transaction); the console can retry it. When the turn policy
counts the failure as the one that makes the session wait for an operator (takeover's: after
``CHATFLOW_HUMAN_AFTER_FAILED_TURNS`` in a row), the holding message is sent instead of the fallback.

The turn policy (``webhooks_app.policy``, the worker's ``policy``) is what a delivery's turn asks of the app
that holds sessions for operators: ``takeover_app`` installs its own from its ``ready()``; without one no
session is held. Human takeover: while the session waits for or is owned by an operator, the site Runner's
turn gate holds the turn (the message is stored with the marker, no model call); the delivery is done with
``reply_status=held`` and nothing is sent. A turn stopped because an operator took the session over
("now") is played again once, in line behind the operator: it is then held, never answered with the
fallback. A turn an operator cancelled (Cancel turn on the health or session page) is not played again:
the delivery ends failed with who cancelled it and why (the store says so: ``DjangoSessionStore.cancel_of``),
nothing is sent, and the console can retry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from chatflow_agent.core.reports import TurnReport
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from sessions_app import runtime
from sessions_app.store import dropped_connections, reopen_if_dropped
from webhooks_app import embedded, heartbeat, replies, settle, taskqueue, tracing
from webhooks_app.arrival import arrival_metadata
from webhooks_app.costs import Costs
from webhooks_app.models import SENDING_PROVIDERS, InboundDelivery
from webhooks_app.outage import DatabaseOutage
from webhooks_app.policy import TurnPolicy, installed
from webhooks_app.providers import placeholder

__all__ = ["Worker", "FALLBACK_REPLY", "UNSUPPORTED_REPLY", "RESET_REPLY", "no_model_call"]

logger = logging.getLogger("webhooks_app.worker")

FALLBACK_REPLY = "Sorry, something went wrong on our side and I could not answer. Please try again in a moment."
UNSUPPORTED_REPLY = "Sorry, I can only read text messages for now. Could you type your message?"
RESET_REPLY = "Done: I have forgotten our conversation. How can I help?"
#: How often (seconds) a running turn looks whether its session's lease was taken away from another process.
STOP_CHECK_SECONDS = 1.0
_FIXED_KINDS = f"c.kind IN ('{InboundDelivery.Kind.UNSUPPORTED.value}', '{InboundDelivery.Kind.RESET.value}')"

Kind = InboundDelivery.Kind
Reply = InboundDelivery.Reply
#: The answers of the deliveries whose turn stores no answer of its own (a reset clears the history).
_FIXED_REPLIES = {Kind.RESET: RESET_REPLY}


def _turn_metadata(delivery: InboundDelivery) -> dict[str, Any]:
    """What the delivery's turn writes into its session with its commit: the delivery's metadata, its
    marker (so a delivery claimed again after a crash is played iff its turn did not commit) and, from a
    provider that sends, its marker as the session's arrival (``webhooks_app.arrival``: where an operator's
    reply goes). Not its ``channel``: a session keeps the channel it was created on (a message arriving
    through another channel must not, say, turn a WhatsApp customer's session into one the live chat may
    write to)."""
    fresh = {k: v for k, v in delivery.metadata.items() if k != "channel"}
    return {**fresh, taskqueue.MARKER_KEY: delivery.marker, **arrival_metadata(delivery)}


#: How a delivery's reply went, for ``taskqueue.complete``: (reply status, reply error).
_Completion = tuple[str, str]


def _complete_then_claim(delivery: InboundDelivery, owner: str, completion: _Completion | None,
                         visibility: float | None) -> InboundDelivery | None:
    """A slot's last write for ``delivery`` and its first for the next, in one hand-off to the slot's thread:
    ``complete`` with ``completion`` (when a reply was sent or tried), then the claim of the slot's next
    delivery (unless ``visibility`` is None: the worker is stopping)."""
    if completion is not None and visibility is not None:
        return taskqueue.complete_and_claim_next(delivery, owner, *completion, visibility)
    if completion is not None:
        taskqueue.complete(delivery, owner, *completion)
    return None if visibility is None else taskqueue.claim_next(owner, visibility)


def _checked_call(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a slot's thread, its connection opened again first if the server dropped it."""
    reopen_if_dropped()
    return fn(*args)


def no_model_call(policy: TurnPolicy | None = None) -> str:
    """The deliveries the held lane takes (SQL on the delivery's row ``c``): they need no model call — an
    unsupported type, a reset, and a message to a session ``policy`` (default: the installed one,
    ``webhooks_app.policy``) holds for an operator (stored and counted, no answer)."""
    held = (installed() if policy is None else policy).held_session_sql
    return f"{_FIXED_KINDS} OR {held}" if held else _FIXED_KINDS


class CancelledByOperator(Exception):
    """The delivery's turn was stopped by an operator's Cancel turn (its message: who and why)."""


class Worker:
    """``Worker(slots=CHATFLOW_WORKER_SLOTS, poll=0.5, visibility=CHATFLOW_LEASE_SECONDS, costs=None,
    policy=None)``; ``await run()``.

    ``slots``: deliveries played at once, at least 1 (``ValueError`` otherwise); None takes the setting.
    ``costs``: an installed ``webhooks_app.costs.Costs`` to time the stages of every delivery in.
    ``policy``: what a delivery's turn asks about held sessions and failed turns (``webhooks_app.policy``);
    None takes the one installed when the worker is built.
    """

    def __init__(self, slots: int | None = None, poll: float = 0.5, visibility: float | None = None,
                 costs: Costs | None = None, policy: TurnPolicy | None = None) -> None:
        self.slots = settings.CHATFLOW_WORKER_SLOTS if slots is None else slots
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"A worker needs at least one slot (a whole number), not {self.slots!r}")
        self.costs = costs
        self.policy = installed() if policy is None else policy
        self.poll = poll
        self.visibility = float(visibility or settings.CHATFLOW_LEASE_SECONDS)
        self.owner = f"worker:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.processed = 0
        self.outage = DatabaseOutage(f"Queue worker {self.owner}")  # its database, as its statements see it
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # One reply client (an aiohttp session, its own keep-alive connection) per slot.
        self._http: dict[ThreadPoolExecutor, Any] = {}
        self._sending: set[int] = set()  # deliveries whose reply send has started

    # ---- control ------------------------------------------------------------------------------
    def wake(self) -> None:
        """Thread-safe: a delivery was queued, look now instead of at the next poll."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def stop(self) -> None:
        """Thread-safe: finish the deliveries in hand, then return from ``run``."""
        self._stopping = True
        self.wake()

    async def run(self, *, drain: bool = False) -> int:
        """Process deliveries until ``stop()`` (or, with ``drain``, until none is queued); returns how many.

        One loop claims for the idle slots, one claim at a time, and hands each delivery to a slot; a
        wake-up (or a finished delivery, or the poll interval) makes it claim again until the queue has
        nothing claimable or every slot is busy. So a webhook costs one claim transaction, not one per
        idle slot: on SQLite every claim takes the write lock the webhook acknowledgements need. A slot
        that finishes a delivery claims its next one itself, in the same hand-off to its thread as the
        delivery's last write (:meth:`process`); it is idle only when that finds nothing.

        While every slot is busy, a lane of its own (one more thread) claims only deliveries that need no model
        call (:func:`no_model_call`), one at a time: a message to a session an operator holds is stored at once
        instead of waiting behind slow bot turns.
        """
        loop = self._loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        executors = [ThreadPoolExecutor(1, thread_name_prefix=f"chatflow-queue-{i}") for i in range(self.slots)]
        idle = list(executors)  # slots without a delivery; each slot has its own thread and connection
        lane = ThreadPoolExecutor(1, thread_name_prefix="chatflow-queue-held")  # deliveries with no model call
        lane_free = [lane]
        held_lane = no_model_call(self.policy)
        in_hand: set[asyncio.Future[InboundDelivery | None]] = set()

        def start(delivery: InboundDelivery, ex: ThreadPoolExecutor) -> None:
            task = asyncio.ensure_future(self.process(delivery, ex, claim_next=ex is not lane))
            in_hand.add(task)
            task.add_done_callback(lambda t, ex=ex: freed(t, ex))

        def freed(task: asyncio.Future[InboundDelivery | None], ex: ThreadPoolExecutor) -> None:
            in_hand.discard(task)
            following = None
            if not task.cancelled() and (err := task.exception()) is not None:
                # the delivery keeps its lease and is played again after it runs out
                if isinstance(err, DatabaseError):  # the database went away: one warning for the outage
                    self.outage.failed(err)
                else:
                    logger.error("A delivery failed in the worker: %s", err, exc_info=err)
            elif not task.cancelled():
                following = task.result()
                self.outage.answered()
            if following is not None:  # the slot claimed its next delivery itself
                start(following, ex)
                if idle:  # that claim may have passed over one the finish made claimable: look again
                    wake.set()
                return
            (lane_free if ex is lane else idle).append(ex)
            wake.set()  # the session's next delivery may be claimable now

        embedded.register(self)
        beating = heartbeat.start(self)  # the health page's worker list
        try:
            while not self._stopping:
                wake.clear()
                retry_in: float | None = None  # seconds: the database did not answer (its back-off)
                while idle and not self._stopping:
                    ex = idle[-1]
                    try:
                        with self._stage("claim"):
                            delivery = await loop.run_in_executor(
                                ex, taskqueue.claim_next, self.owner, self.visibility)
                    except DatabaseError as err:  # e.g. the server restarted: reconnect after a back-off
                        retry_in = self.outage.failed(err)
                        break
                    self.outage.answered()
                    if delivery is None:
                        break
                    idle.pop()
                    start(delivery, ex)
                if retry_in is None and not idle and lane_free and not self._stopping:
                    try:  # every slot is busy: a delivery that needs no model call need not wait for them
                        with self._stage("claim"):
                            held = await loop.run_in_executor(
                                lane, taskqueue.claim_next, self.owner, self.visibility, held_lane)
                    except DatabaseError as err:
                        retry_in = self.outage.failed(err)
                    else:
                        if held is not None:
                            lane_free.pop()
                            start(held, lane)
                if self._stopping:
                    break
                if retry_in is None and drain and not in_hand:
                    try:
                        if await loop.run_in_executor(idle[-1], taskqueue.pending) == 0:
                            break
                    except DatabaseError as err:
                        retry_in = self.outage.failed(err)
                with contextlib.suppress(TimeoutError):
                    pause = retry_in if retry_in is not None else None if drain and in_hand else self.poll
                    await asyncio.wait_for(wake.wait(), pause)
            while in_hand:  # stopping: finish the deliveries in hand (and one a slot claimed as it stopped)
                await asyncio.wait(set(in_hand))
        except asyncio.CancelledError:  # roll back what is in hand and requeue it (see process)
            self._stopping = True  # no slot claims a next delivery from now on
            while in_hand:  # including one a slot had claimed before this
                for task in list(in_hand):
                    task.cancel()
                await asyncio.wait(set(in_hand))
            raise
        finally:
            await heartbeat.stop(beating)
            embedded.unregister(self)
            for http in self._http.values():
                await http.close()
            for ex in [*executors, lane]:
                # RuntimeError: executors already shut down at interpreter exit
                with contextlib.suppress(RuntimeError, DatabaseError):
                    ex.submit(connections.close_all).result()
                ex.shutdown()
        return self.processed

    # ---- one delivery ---------------------------------------------------------------------------
    async def process(self, delivery: InboundDelivery, ex: ThreadPoolExecutor, *,
                      claim_next: bool = False) -> InboundDelivery | None:
        """Play a claimed delivery and send its reply (see the module docstring), under a heartbeat. With
        ``claim_next`` (a slot of :meth:`run`), unless the worker is stopping, claim the slot's next delivery in
        the same hand-off to its thread as the delivery's last write (``complete``), and return it; else None."""
        loop = asyncio.get_running_loop()

        def db(fn: Any, *args: Any) -> Any:
            return loop.run_in_executor(ex, _checked_call, fn, *args)

        traced = await tracing.enter(delivery, db)  # the delivery's trace, when tracing is on
        handling = asyncio.ensure_future(self._handle(delivery, db, ex))
        heartbeat = asyncio.ensure_future(self._heartbeat(delivery, db, handling))
        try:
            completion = await asyncio.shield(handling)
        except asyncio.CancelledError:
            if not handling.done():  # this worker is being cancelled: roll the turn back, requeue
                handling.cancel()
                await asyncio.gather(handling, return_exceptions=True)
                unsent = delivery.pk not in self._sending
                await asyncio.shield(db(taskqueue.release, delivery, self.owner, unsent))
                raise
            logger.warning("Delivery %s: lease lost, turn cancelled", delivery.pk)
            return None
        finally:
            self._sending.discard(delivery.pk)
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            tracing.leave(traced)
            if self.costs is not None:
                self.costs.deliveries += 1
        visibility = self.visibility if claim_next and not self._stopping else None
        if completion is None and visibility is None:
            return None
        with self._stage("claim" if completion is None else "finish"):
            claiming = db(_complete_then_claim, delivery, self.owner, completion, visibility)
            try:
                return await asyncio.shield(claiming)
            except asyncio.CancelledError:  # the worker is being cancelled: requeue what the slot claimed
                following = await claiming
                if following is not None:
                    await asyncio.shield(db(taskqueue.release, following, self.owner))
                raise

    def _stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.costs.stage(name) if self.costs is not None else contextlib.nullcontext()

    async def _handle(self, delivery: InboundDelivery, db: Any, slot: ThreadPoolExecutor) -> _Completion | None:
        """Play and answer ``delivery``; returns how its reply went (for ``complete``), None when nothing was sent."""
        replies_out = delivery.provider in SENDING_PROVIDERS
        reply = Reply.SENDING if replies_out else Reply.NONE
        if delivery.reply_status == Reply.SENDING:
            # Claimed again after its worker died while sending the reply: it may have gone out; never twice.
            return Reply.SENDING, "The worker stopped while sending the reply; it is not sent again."
        try:
            answer, settled = await self._play_reconnecting(delivery, db, replies_out)
        except CancelledByOperator as err:  # rolled back; the customer gets nothing, the console a Retry
            logger.info("Delivery %s: %s", delivery.pk, err)
            with self._stage("finish"):
                await db(taskqueue.fail, delivery, self.owner, str(err), "", Reply.NONE)
            return None
        except settle.DeliveryLost:  # rolled back: its lease passed to another worker, which plays it
            logger.info("Delivery %s: another worker took it over; its turn here was rolled back", delivery.pk)
            return None
        except Exception as err:  # noqa: BLE001 - an engine or store failure: the turn was rolled back
            if not await db(taskqueue.turn_committed, delivery):
                if isinstance(err, SessionDeletedError):
                    # Deleted during its turn, or being deleted: the delete cancels the delivery in its transaction
                    # (webhooks_app.settle), which may not have committed yet. Given back, nothing recorded or sent:
                    # the release changes nothing once it is cancelled, and a delete that did not go through leaves
                    # it to be played again. Never a failed turn: that would write to the deleted session.
                    await db(taskqueue.release, delivery, self.owner, True)
                    logger.info("Delivery %s: its session was deleted during its turn; not played", delivery.pk)
                    return None
                logger.warning("Delivery %s failed: %s: %s", delivery.pk, type(err).__name__, err)
                error = f"{type(err).__name__}: {err}"
                fallback = settings.CHATFLOW_HOLDING_MESSAGE if await db(
                    self.policy.note_failed_turn, delivery.session_id) else FALLBACK_REPLY
                with self._stage("finish"):
                    failed = await db(taskqueue.fail, delivery, self.owner, error, fallback, reply)
                return await self._send(delivery, fallback, slot) if failed and replies_out else None
            answer, settled = await db(taskqueue.last_answer, delivery.session_id), False
        text, reply = taskqueue.outcome(answer, replies_out)
        self.processed += 1
        if not settled:  # the turn's commit did not record it (a turn played before a crash, an unsupported type…)
            with self._stage("finish"):
                if not await db(settle.settle_unrecorded, delivery, self.owner, text, reply):
                    return None
        return await self._send(delivery, text, slot) if reply == Reply.SENDING else None

    async def _play_reconnecting(self, delivery: InboundDelivery, db: Any,
                                 replies_out: bool) -> tuple[str | None, bool]:
        """:meth:`_play`, and once more when its turn failed on a database connection the server dropped (just
        before a statement: ``sessions_app.store.reopen_if_dropped`` checks only after an idle gap or an
        error) and did not commit: the connections are checked by then, and the customer gets the answer
        instead of the fallback. Any other database error (a lock, a deadlock, a timeout) fails the turn as
        usual: playing it again would call the model and its tools twice. A database that does not answer fails
        the check of the commit here, and the delivery is played again after its lease runs out."""
        dropped = dropped_connections()
        try:
            return await self._play(delivery, db, replies_out)
        except (OperationalError, InterfaceError) as err:
            if dropped_connections() == dropped:
                raise  # the connection was fine: the database refused the statement
            if await db(taskqueue.turn_committed, delivery):
                raise  # its commit went through: the answer is read back from the session
            logger.warning("Delivery %s: its turn failed on a dropped database connection (%s: %s); playing it "
                           "again", delivery.pk, type(err).__name__, str(err).strip().split("\n")[0])
            return await self._play(delivery, db, replies_out)

    async def _play(self, delivery: InboundDelivery, db: Any, replies_out: bool) -> tuple[str | None, bool]:
        """(the answer to send, None when the turn was held for an operator; True when the turn's commit
        recorded it on the delivery: ``webhooks_app.settle``)."""
        fixed = _FIXED_REPLIES.get(delivery.kind)
        if taskqueue.played_before(delivery):  # its marker, read with the claim
            logger.info("Delivery %s: its turn committed before a crash; not played again", delivery.pk)
            if fixed is not None:
                return fixed, False
            held = await db(taskqueue.ends_with_customer, delivery.session_id)
            return (None if held else await db(taskqueue.last_answer, delivery.session_id)), False
        # Its commit records the answer on the delivery, or is refused (the session deleted, the delivery lost).
        play = settle.Playing(delivery, self.owner, replies_out, fixed, using=runtime.site_store().using)
        with self._stage("turn"):
            report = self._report(delivery)
            try:
                return await self._play_watched(delivery, report, db, play), play.settled
            except settle.DeliveryLost:
                raise
            except SessionBusyError:
                # Stopped: nothing was written. An operator's Cancel turn ends the delivery; a takeover
                # "now" or a lost lease plays it again, in line behind whoever holds the session now.
                await self._unless_cancelled(delivery, db, report)
                logger.info("Delivery %s: its turn was stopped; playing it again", delivery.pk)
            report = self._report(delivery)
            try:
                return await self._play_watched(delivery, report, db, play), play.settled
            except settle.DeliveryLost:
                raise
            except SessionBusyError:
                await self._unless_cancelled(delivery, db, report)  # the replay cancelled too
                raise

    @staticmethod
    async def _unless_cancelled(delivery: InboundDelivery, db: Any, report: TurnReport) -> None:
        """Raise ``CancelledByOperator`` when an operator's Cancel turn stopped the turn ``report`` played: the
        store says so from the lease the cancel took away (``DjangoSessionStore.cancel_of``)."""
        cancelled = await db(runtime.site_store().cancel_of, delivery.session_id, report.owner)
        if cancelled is not None:
            raise CancelledByOperator(cancelled)

    @staticmethod
    def _report(delivery: InboundDelivery) -> TurnReport:
        queued_ms = max(0.0, (time.time() - delivery.first_seen.timestamp()) * 1000)  # first seen → claimed
        return TurnReport(source="webhook", queue_wait_ms=queued_ms, trace_id=tracing.current_trace_id())

    async def _play_watched(self, delivery: InboundDelivery, report: TurnReport, db: Any,
                            play: settle.Playing) -> str | None:
        """:meth:`_play_turn`, stopped (``SessionBusyError``, rolled back) within about ``STOP_CHECK_SECONDS``
        once its session's lease is taken away from another process (an operator's takeover "now" or Cancel
        turn, which cannot reach this process): the store's own renewal finds out only a third of the lease
        later, and a hand-back meanwhile would let the bot play the stopped message after the operator's
        reply. A turn shorter than that costs a timer, no query."""
        watching: list[asyncio.Future[None]] = []
        timer = asyncio.get_running_loop().call_later(
            STOP_CHECK_SECONDS, lambda: watching.append(asyncio.ensure_future(self._watch_lease(delivery, report, db))))
        try:
            return await self._play_turn(delivery, report, play)
        finally:
            timer.cancel()
            for task in watching:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _watch_lease(delivery: InboundDelivery, report: TurnReport, db: Any) -> None:
        while True:  # polled: the lease is taken away in the database, by a process that cannot reach this one
            try:
                lost = bool(report.owner) and not await db(runtime.site_store().holds_lease, delivery.session_id,
                                                           report.owner)
            except Exception as err:  # noqa: BLE001 - a database hiccup: look again at the next check (one line)
                logger.warning("Delivery %s: looking at its session's lease failed (%s: %s); looking again in %s s",
                               delivery.pk, type(err).__name__, err, STOP_CHECK_SECONDS)
                lost = False
            if lost and runtime.site_store().stop_turn(delivery.session_id, owner=report.owner):
                return
            await asyncio.sleep(STOP_CHECK_SECONDS)

    async def _play_turn(self, delivery: InboundDelivery, report: TurnReport, play: settle.Playing) -> str | None:
        """One try of the delivery's turn, carrying ``play``'s settle as its commit hook (a new ``TurnHooks``
        each try: what the gate adds belongs to that try)."""
        runner = runtime.site_runner()
        if delivery.kind == Kind.RESET:
            async with runner.session_store.turn(delivery.session_id, runner.starting_agent, delivery.metadata,
                                                 hooks=play.hooks()) as s:
                s.clear_history()  # inside the turn: committed with the marker, under the session lock
                s.metadata.update(_turn_metadata(delivery))
            return RESET_REPLY
        text, gate = delivery.text, None
        if delivery.kind == Kind.UNSUPPORTED:
            # No model call: the placeholder and the fixed answer, or the placeholder alone, held for the
            # operator who has the session (the gate's rule for any message).
            text, gate = delivery.text or placeholder(""), self.policy.answered_gate(UNSUPPORTED_REPLY)
        response = await runner.run_async(delivery.session_id, text, delivery.metadata,
                                          turn_metadata=_turn_metadata(delivery), report=report, turn_gate=gate,
                                          hooks=play.hooks())
        return taskqueue.answer_of(response)

    async def _heartbeat(self, delivery: InboundDelivery, db: Any, playing: asyncio.Future[Any]) -> None:
        while True:
            await asyncio.sleep(self.visibility / 3)
            try:
                kept = await db(taskqueue.renew, delivery, self.owner, self.visibility)
            except DatabaseError as err:  # the database went away: try again at the next beat
                self.outage.failed(err)
                continue
            except Exception:  # noqa: BLE001 - try again at the next beat
                logger.exception("Delivery %s: renewing the lease failed", delivery.pk)
                continue
            self.outage.answered()
            if not kept:
                # Done by its own turn's commit (held, or no reply to send): nothing left to keep.
                if await db(taskqueue.status_of, delivery) != InboundDelivery.Status.DONE:
                    playing.cancel()
                return

    async def _send(self, delivery: InboundDelivery, text: str, slot: ThreadPoolExecutor) -> _Completion:
        """Send (``sending`` was committed before); returns the outcome for ``complete``."""
        http = self._http.get(slot)
        if http is None:
            http = self._http[slot] = replies.client()
        self._sending.add(delivery.pk)
        try:
            with self._stage("reply send"):
                await replies.send(http, delivery, text)
        except Exception as err:  # noqa: BLE001 - recorded on the delivery, shown in the ledger
            logger.warning("Delivery %s: reply failed: %s", delivery.pk, err)
            outcome, error = Reply.FAILED, f"{type(err).__name__}: {err}"
        else:
            outcome, error = Reply.SENT, ""
        return outcome, error
