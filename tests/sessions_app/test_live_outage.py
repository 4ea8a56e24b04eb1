"""The channel layer's server goes away and comes back (a throwaway ``redis-server`` on a port of its own):
turns go on, the process logs one warning per outage (no traceback) and one line when it is over."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import signal
import uuid

import pytest
from channels.layers import channel_layers, get_channel_layer
from channels_redis.core import RedisChannelLayer

import chatflow_site.asgi  # noqa: F401  (imported here: its first import sets logging up again, dropping caplog's)
from chatflow_site.layers import redis_layer
from sessions_app.live import group_for_session, publisher
from sessions_app.models import ChatMessage
from sessions_app.runtime import site_runner
from tests.processes import free_port, redis_server
from tests.sessions_app.live_support import db

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary")]


@pytest.fixture
def layer_on_a_port_of_its_own(settings):
    port = free_port()
    settings.CHANNEL_LAYERS = {"default": redis_layer(f"redis://127.0.0.1:{port}/3")}  # the site's configuration
    channel_layers.backends.clear()
    yield port
    channel_layers.backends.clear()


def live_log(caplog) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == "sessions_app.live"]
    caplog.clear()
    return records


async def play(session_id: str, turns: int) -> None:
    for n in range(turns):
        await site_runner().run_async(session_id, f"Where is order {n}?")
    await publisher.flush()


async def test_an_outage_logs_one_warning_and_its_end(layer_on_a_port_of_its_own, caplog):
    port = layer_on_a_port_of_its_own
    caplog.set_level(logging.INFO, logger="sessions_app.live")
    session_id = f"outage:{uuid.uuid4().hex[:8]}"
    layer = get_channel_layer()
    try:
        await play(session_id, 10)  # nothing listens on the port yet
        (down,) = live_log(caplog)
        assert down.levelno == logging.WARNING and down.exc_info is None
        assert down.getMessage().startswith("Channel layer unreachable (ConnectionError: ")
        assert "live updates are dropped until it is back" in down.getMessage()
        assert await db(ChatMessage.objects.filter(session_id=session_id, role="user").count) == 10

        with redis_server(port):
            channel = await layer.new_channel()
            await layer.group_add(group_for_session(session_id), channel)
            await play(session_id, 1)
            (up,) = live_log(caplog)
            assert up.levelno == logging.INFO and up.exc_info is None
            dropped = re.fullmatch(r"Channel layer reachable again after [\d.]+ s: live updates resume "
                                   r"\((\d+) messages dropped\)", up.getMessage())
            assert dropped and int(dropped[1]) >= 10 * 2  # at least the user and model message of each turn
            assert (await layer.receive(channel))["event"]["kind"] == "turn_started"  # live again

        await play(session_id, 3)  # a second outage: a warning of its own
        assert [r.getMessage().split(" (")[0] for r in live_log(caplog)] == ["Channel layer unreachable"]
        with redis_server(port):
            await play(session_id, 1)
            assert [r.getMessage().split(" after")[0] for r in live_log(caplog)] == ["Channel layer reachable again"]
    finally:
        await layer.close_pools()


@pytest.mark.parametrize("path", ["/ws/sessions/", "/ws/chat/"])
async def test_a_websocket_while_the_layer_is_unreachable_closes_try_again_later_with_one_warning(
        layer_on_a_port_of_its_own, caplog, path):
    from sessions_app.live import CLOSE_LAYER_UNREACHABLE, outage
    from tests.sessions_app import personas
    from tests.sessions_app.live_support import connected, cookie_for

    caplog.set_level(logging.INFO)
    outage.sent()  # (an earlier test's outage is over)
    caplog.clear()
    cookie = await db(cookie_for, await db(personas.operator))
    for _attempt in range(3):  # the page's reconnects
        async with connected(path, cookie) as page:
            accepted, _ = await page.connect()
            assert accepted  # accepted first, so the browser sees why it is closed
            closed = await page.receive_output(timeout=10)
            assert closed == {"type": "websocket.close", "code": CLOSE_LAYER_UNREACHABLE}  # (1013: try again)
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1 and problems[0].name == "sessions_app.live" and problems[0].exc_info is None
    assert problems[0].getMessage().startswith("Channel layer unreachable (ConnectionError: ")



async def test_open_websockets_close_try_again_later_when_the_layer_stops_answering(
        layer_on_a_port_of_its_own, monkeypatch):
    """A server that stops answering (frozen, or the network to it gone) fails no call at once: every page
    listening through it is closed with 1013 all the same, within the sockets' watch, not left deaf."""
    from sessions_app import sockets
    from sessions_app.live import CLOSE_LAYER_UNREACHABLE, outage
    from tests.sessions_app import personas
    from tests.sessions_app.live_support import connected, cookie_for

    monkeypatch.setattr(sockets, "WATCH_SECONDS", 0.5)
    port = layer_on_a_port_of_its_own
    outage.sent()
    cookie = await db(cookie_for, await db(personas.operator))
    layer = get_channel_layer()
    try:
        with redis_server(port) as server:
            async with connected("/ws/sessions/", cookie) as one, connected("/ws/sessions/?mode=top", cookie) as two:
                assert (await one.connect())[0] and (await two.connect())[0]
                server.send_signal(signal.SIGSTOP)
                try:
                    for page in (one, two):  # (the layer's own read timeout is 30 s)
                        closed = await page.receive_output(timeout=15)
                        assert closed == {"type": "websocket.close", "code": CLOSE_LAYER_UNREACHABLE}
                finally:
                    server.send_signal(signal.SIGCONT)
    finally:
        await layer.close_pools()


class LateProbes(RedisChannelLayer):
    """The site's Redis layer in a process too busy to read its messages on time: each probe a socket sends
    itself is delivered ``late_by`` seconds after it reached Redis, or never (``None``)."""

    late_by: float | None = 0.0
    drop = 0  # how many probes are lost before any is delivered

    async def receive(self, channel):
        while True:
            message = await super().receive(channel)
            if message.get("type") != "live.probe":
                return message
            if LateProbes.drop:
                LateProbes.drop -= 1
                continue
            if LateProbes.late_by is not None:
                await asyncio.sleep(LateProbes.late_by)
                return message


@pytest.fixture
def late_probes(layer_on_a_port_of_its_own, settings, monkeypatch):
    from sessions_app import sockets

    monkeypatch.setattr(sockets, "WATCH_SECONDS", 0.5)
    settings.CHANNEL_LAYERS["default"]["BACKEND"] = f"{__name__}.LateProbes"
    channel_layers.backends.clear()
    with redis_server(layer_on_a_port_of_its_own):
        yield LateProbes
    LateProbes.late_by, LateProbes.drop = 0.0, 0


async def test_a_probe_that_comes_back_late_keeps_the_websocket_open(late_probes):
    """A probe delivered a watch or two late (a busy process) is late, not lost: the page stays open and
    nothing is counted as an outage (an outage would close every page of the process)."""
    from sessions_app.live import outage
    from sessions_app.sockets import PROBE_PATIENCE, WATCH_SECONDS
    from tests.sessions_app import personas
    from tests.sessions_app.live_support import connected, cookie_for

    late_probes.late_by = late_by = 0.8
    assert WATCH_SECONDS < late_by < (PROBE_PATIENCE - 1) * WATCH_SECONDS
    failures = outage.failures
    cookie = await db(cookie_for, await db(personas.operator))
    try:
        async with connected("/ws/sessions/", cookie) as page:
            assert (await page.connect())[0]
            assert await page.receive_nothing(timeout=8 * WATCH_SECONDS, interval=0.1)
            assert outage.failures == failures
    finally:
        await get_channel_layer().close_pools()


async def test_one_lost_probe_is_probed_again_and_keeps_the_websocket_open(late_probes):
    """One message lost while the layer works (the next probe comes back) is not an outage: the page stays open
    and no other page's live updates are dropped."""
    from sessions_app.live import outage
    from sessions_app.sockets import LOST_PROBES, PROBE_PATIENCE, WATCH_SECONDS
    from tests.sessions_app import personas
    from tests.sessions_app.live_support import connected, cookie_for

    late_probes.drop = LOST_PROBES - 1
    failures = outage.failures
    cookie = await db(cookie_for, await db(personas.operator))
    try:
        async with connected("/ws/sessions/", cookie) as page:
            assert (await page.connect())[0]
            assert await page.receive_nothing(timeout=(LOST_PROBES * PROBE_PATIENCE + 3) * WATCH_SECONDS,
                                              interval=0.1)
            assert late_probes.drop == 0 and outage.failures == failures
    finally:
        await get_channel_layer().close_pools()


async def test_a_probe_that_never_comes_back_closes_the_websocket_try_again_later(late_probes):
    """A layer that takes the probe and never delivers it leaves the page deaf: it is closed with 1013."""
    from sessions_app.live import CLOSE_LAYER_UNREACHABLE, outage
    from tests.sessions_app import personas
    from tests.sessions_app.live_support import connected, cookie_for

    late_probes.late_by = None
    outage.sent()
    cookie = await db(cookie_for, await db(personas.operator))
    try:
        async with connected("/ws/sessions/", cookie) as page:
            assert (await page.connect())[0]
            closed = await page.receive_output(timeout=15)
            assert closed == {"type": "websocket.close", "code": CLOSE_LAYER_UNREACHABLE}
    finally:
        await get_channel_layer().close_pools()
        outage.sent()


async def test_a_websocket_whose_login_cannot_be_read_closes_with_a_code_and_one_line(caplog):
    """The login's middleware reads the database at the handshake: while the database does not answer the
    socket is accepted and closed with a code the page reconnects after, and the server logs one line (no
    traceback), as a page request gets a 503."""
    from channels.testing import WebsocketCommunicator
    from django.db import OperationalError

    from chatflow_site.asgi import application
    from sessions_app.live import CLOSE_DATABASE_AWAY, LayerGuard

    guarded = application.application_mapping["websocket"].application
    assert isinstance(guarded, LayerGuard)  # around the whole stack: the login's middleware reads inside it

    async def login_middleware_without_database(scope, receive, send):
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')

    caplog.set_level(logging.INFO)
    page = WebsocketCommunicator(LayerGuard(login_middleware_without_database), "/ws/sessions/")
    accepted, _ = await page.connect()
    assert accepted
    assert await page.receive_output(timeout=10) == {"type": "websocket.close", "code": CLOSE_DATABASE_AWAY}
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1 and problems[0].exc_info is None
    assert "the database does not answer (OperationalError: connection to server" in problems[0].getMessage()
