"""Queue workers: claim deliveries, play their turns exactly once, send their replies at most once.

A worker runs ``slots`` loops on one event loop; each has its own thread for queue queries (and so
its own database connection). Per delivery:

1. claim it (``taskqueue``) with a visibility timeout, renewed by a heartbeat while it runs; a lost
   lease cancels the turn (rolled back, invariant 3);
2. play the turn on the site's Runner, which writes the delivery's *marker* into the session's
   metadata as the turn's ``turn_metadata``, so the marker commits in the same transaction as the
   turn's rows, or not at all. A delivery claimed again after a crash (SIGKILL between claim and
   the ``done`` write) whose marker is already in the session is not played again: its answer is
   read back from the session;
3. write the answer and ``reply_status=sending``, THEN send the reply, then record ``sent``/``failed``
   and ``done`` together. The delivery stays running until then, so one sender's replies go out in
   order. A delivery claimed again with ``sending`` recorded is finished without sending: a crash
   between that write and the end of the send never sends twice (at most one reply).

Engine failure: the turn is rolled back, one fallback reply is sent, and the delivery is marked failed
(the claim on its id is released in the same transaction); the console can retry it. After
``CHATFLOW_HUMAN_AFTER_FAILED_TURNS`` failures in a row the session waits for an operator and the
holding message is sent instead of the fallback.

Human takeover: while the session waits for or is owned by an operator, the site Runner's turn gate
holds the turn (the message is stored with the marker, no model call); the delivery is done with
``reply_status=held`` and nothing is sent. A turn stopped because an operator took the session over
("now") is played again once, in line behind the operator: it is then held, never answered with the
fallback. A turn an operator cancelled (Cancel turn on the health or session page) is not played again:
the delivery ends failed with who cancelled it and why, nothing is sent, and the console can retry it.
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
from django.db import connections

from agents_app import runtime
from chatflow_agent.core.reports import TurnReport
from chatflow_agent.exceptions import SessionBusyError
from health_app import heartbeat, tracing
from takeover_app import service as takeover
from webhooks_app import replies, settle, taskqueue
from webhooks_app.costs import Costs
from webhooks_app.models import InboundDelivery

__all__ = ["Worker", "FALLBACK_REPLY", "UNSUPPORTED_REPLY", "RESET_REPLY"]

logger = logging.getLogger("webhooks_app.worker")

FALLBACK_REPLY = "Sorry, something went wrong on our side and I could not answer. Please try again in a moment."
UNSUPPORTED_REPLY = "Sorry, I can only read text messages for now. Could you type your message?"
RESET_REPLY = "Done: I have forgotten our conversation. How can I help?"

Kind = InboundDelivery.Kind
Reply = InboundDelivery.Reply


def _turn_metadata(delivery: InboundDelivery) -> dict[str, Any]:
    """What the delivery's turn writes into its session with its commit: the delivery's metadata and its
    marker (so a delivery claimed again after a crash is played iff its turn did not commit). Not its
    ``channel``: a session keeps the channel it was created on (a message arriving through another
    channel must not, say, turn a WhatsApp customer's session into one the live chat may write to)."""
    fresh = {k: v for k, v in delivery.metadata.items() if k != "channel"}
    return {**fresh, taskqueue.MARKER_KEY: delivery.marker}


class CancelledByOperator(Exception):
    """The delivery's turn was stopped by an operator's Cancel turn (its message: who and why)."""


class Worker:
    """``Worker(slots=4, poll=0.5, visibility=CHATFLOW_LEASE_SECONDS, costs=None)``; ``await run()``.

    ``costs``: an installed ``webhooks_app.costs.Costs`` to time the stages of every delivery in.
    """

    def __init__(self, slots: int = 4, poll: float = 0.5, visibility: float | None = None,
                 costs: Costs | None = None) -> None:
        self.slots = slots
        self.costs = costs
        self.poll = poll
        self.visibility = float(visibility or settings.CHATFLOW_LEASE_SECONDS)
        self.owner = f"worker:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.processed = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # One reply client per slot: httpx checks every idle pooled connection before each request
        # (a getpeername and a poll each), so one shared pool of ``slots`` connections cost ``slots`` checks.
        self._http: dict[ThreadPoolExecutor, Any] = {}

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
        idle slot: on SQLite every claim takes the write lock the webhook acknowledgements need.
        """
        from webhooks_app import embedded

        loop = self._loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        executors = [ThreadPoolExecutor(1, thread_name_prefix=f"chatflow-queue-{i}") for i in range(self.slots)]
        idle = list(executors)  # slots without a delivery; each slot has its own thread and connection
        in_hand: set[asyncio.Future[None]] = set()

        def freed(task: asyncio.Future[None], ex: ThreadPoolExecutor) -> None:
            in_hand.discard(task)
            if not task.cancelled() and (err := task.exception()) is not None:
                # e.g. the database went away: the delivery keeps its lease and is played again after it
                logger.error("A delivery failed in the worker: %s", err, exc_info=err)
            idle.append(ex)
            wake.set()  # the session's next delivery may be claimable now

        embedded.register(self)
        beating = heartbeat.start(self)  # the health page's worker list
        try:
            while not self._stopping:
                wake.clear()
                while idle and not self._stopping:
                    ex = idle[-1]
                    with self._stage("claim"):
                        delivery = await loop.run_in_executor(ex, taskqueue.claim_next, self.owner, self.visibility)
                    if delivery is None:
                        break
                    idle.pop()
                    task = asyncio.ensure_future(self.process(delivery, ex))
                    in_hand.add(task)
                    task.add_done_callback(lambda t, ex=ex: freed(t, ex))
                if self._stopping:
                    break
                if drain and not in_hand and await loop.run_in_executor(idle[-1], taskqueue.pending) == 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), None if drain and in_hand else self.poll)
            if in_hand:  # stopping: finish the deliveries in hand
                await asyncio.wait(in_hand)
        except asyncio.CancelledError:  # roll back what is in hand and requeue it (see process)
            for task in in_hand:
                task.cancel()
            if in_hand:
                await asyncio.wait(in_hand)
            raise
        finally:
            await heartbeat.stop(beating)
            embedded.unregister(self)
            for http in self._http.values():
                await http.aclose()
            for ex in executors:
                with contextlib.suppress(RuntimeError):  # executors already shut down at interpreter exit
                    ex.submit(connections.close_all).result()
                ex.shutdown()
        return self.processed

    # ---- one delivery ---------------------------------------------------------------------------
    async def process(self, delivery: InboundDelivery, ex: ThreadPoolExecutor) -> None:
        """Play a claimed delivery and send its reply (see the module docstring), under a heartbeat."""
        loop = asyncio.get_running_loop()

        def db(fn: Any, *args: Any) -> Any:
            return loop.run_in_executor(ex, fn, *args)

        traced = await tracing.enter(delivery, db)  # the delivery's trace, when tracing is on
        handling = asyncio.ensure_future(self._handle(delivery, db, ex))
        heartbeat = asyncio.ensure_future(self._heartbeat(delivery, db, handling))
        try:
            await asyncio.shield(handling)
        except asyncio.CancelledError:
            if not handling.done():  # this worker is being cancelled: roll the turn back, requeue
                handling.cancel()
                await asyncio.gather(handling, return_exceptions=True)
                await asyncio.shield(db(taskqueue.release, delivery, self.owner))
                raise
            logger.warning("Delivery %s: lease lost, turn cancelled", delivery.pk)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            tracing.leave(traced)
            if self.costs is not None:
                self.costs.deliveries += 1

    def _stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.costs.stage(name) if self.costs is not None else contextlib.nullcontext()

    async def _handle(self, delivery: InboundDelivery, db: Any, slot: ThreadPoolExecutor) -> None:
        replies_out = delivery.provider in (InboundDelivery.Provider.WHATSAPP, InboundDelivery.Provider.TELEGRAM)
        reply = Reply.SENDING if replies_out else Reply.NONE
        if delivery.reply_status == Reply.SENDING:
            # Claimed again after its worker died while sending the reply: it may have gone out; never twice.
            with self._stage("finish"):
                await db(taskqueue.complete, delivery, self.owner, Reply.SENDING,
                         "The worker stopped while sending the reply; it is not sent again.")
            return
        try:
            answer = await self._play(delivery, db)
        except CancelledByOperator as err:  # rolled back; the customer gets nothing, the console a Retry
            logger.info("Delivery %s: %s", delivery.pk, err)
            with self._stage("finish"):
                await db(taskqueue.fail, delivery, self.owner, str(err), "", Reply.NONE)
            return
        except Exception as err:  # noqa: BLE001 - an engine or store failure: the turn was rolled back
            if not await db(taskqueue.turn_committed, delivery):
                logger.warning("Delivery %s failed: %s: %s", delivery.pk, type(err).__name__, err)
                error = f"{type(err).__name__}: {err}"
                fallback = settings.CHATFLOW_HOLDING_MESSAGE if await db(
                    takeover.note_failed_turn, delivery.session_id) else FALLBACK_REPLY
                with self._stage("finish"):
                    failed = await db(taskqueue.fail, delivery, self.owner, error, fallback, reply)
                if failed and replies_out:
                    await self._send(delivery, fallback, db, slot)
                return
            answer = await db(taskqueue.last_answer, delivery.session_id)
        if answer is None:  # held for the operator: stored, nothing to send
            answer, reply = "", Reply.HELD
        self.processed += 1
        with self._stage("finish"):
            finished = await db(taskqueue.finish, delivery, self.owner, answer, reply)
        if finished and reply == Reply.SENDING:
            await self._send(delivery, answer, db, slot)

    async def _play(self, delivery: InboundDelivery, db: Any) -> str | None:
        """The answer to send; None when the turn was held for an operator (nothing to send)."""
        if delivery.kind == Kind.UNSUPPORTED:
            return UNSUPPORTED_REPLY
        if taskqueue.played_before(delivery):  # its marker, read with the claim
            logger.info("Delivery %s: its turn committed before a crash; not played again", delivery.pk)
            if delivery.kind == Kind.RESET:
                return RESET_REPLY
            return None if await db(takeover.ends_with_customer, delivery.session_id) else await db(
                taskqueue.last_answer, delivery.session_id)
        with settle.playing(delivery), self._stage("turn"):  # its commit is refused if the session is deleted
            report = self._report(delivery)
            try:
                return await self._play_turn(delivery, report)
            except SessionBusyError:
                # Stopped: nothing was written. An operator's Cancel turn ends the delivery; a takeover
                # "now" or a lost lease plays it again, in line behind whoever holds the session now.
                await self._unless_cancelled(delivery, db, report)
                logger.info("Delivery %s: its turn was stopped; playing it again", delivery.pk)
            report = self._report(delivery)
            try:
                return await self._play_turn(delivery, report)
            except SessionBusyError:
                await self._unless_cancelled(delivery, db, report)  # the replay cancelled too
                raise

    @staticmethod
    async def _unless_cancelled(delivery: InboundDelivery, db: Any, report: TurnReport) -> None:
        """Raise ``CancelledByOperator`` when an operator's Cancel turn stopped the turn ``report`` played."""
        cancelled = await db(takeover.cancelled_by_operator, delivery.session_id, report.owner)
        if cancelled is not None:
            raise CancelledByOperator(cancelled)

    @staticmethod
    def _report(delivery: InboundDelivery) -> TurnReport:
        queued_ms = max(0.0, (time.time() - delivery.first_seen.timestamp()) * 1000)  # first seen → claimed
        return TurnReport(source="webhook", queue_wait_ms=queued_ms, trace_id=tracing.current_trace_id())

    async def _play_turn(self, delivery: InboundDelivery, report: TurnReport) -> str | None:
        runner = runtime.site_runner()
        if delivery.kind == Kind.RESET:
            async with runner.session_store.turn(delivery.session_id, runner.starting_agent, delivery.metadata) as s:
                s.clear_history()  # inside the turn: committed with the marker, under the session lock
                s.metadata.update(_turn_metadata(delivery))
            return RESET_REPLY
        response = await runner.run_async(delivery.session_id, delivery.text, delivery.metadata,
                                          turn_metadata=_turn_metadata(delivery), report=report)
        return None if response.held and not response.content else response.content

    async def _heartbeat(self, delivery: InboundDelivery, db: Any, playing: asyncio.Future[Any]) -> None:
        while True:
            await asyncio.sleep(self.visibility / 3)
            try:
                kept = await db(taskqueue.renew, delivery, self.owner, self.visibility)
            except Exception:  # noqa: BLE001 - a database hiccup: try again at the next beat
                logger.exception("Delivery %s: renewing the lease failed", delivery.pk)
                continue
            if not kept:
                playing.cancel()
                return

    async def _send(self, delivery: InboundDelivery, text: str, db: Any, slot: ThreadPoolExecutor) -> None:
        """Send, then record sent/failed and finish the delivery (``sending`` was committed before)."""
        http = self._http.get(slot)
        if http is None:
            http = self._http[slot] = replies.client()
        try:
            with self._stage("reply send"):
                await replies.send(http, delivery, text)
        except Exception as err:  # noqa: BLE001 - recorded on the delivery, shown in the ledger
            logger.warning("Delivery %s: reply failed: %s", delivery.pk, err)
            outcome, error = Reply.FAILED, f"{type(err).__name__}: {err}"
        else:
            outcome, error = Reply.SENT, ""
        with self._stage("finish"):
            await db(taskqueue.complete, delivery, self.owner, outcome, error)
