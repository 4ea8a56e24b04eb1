"""A streamed response goes out no faster than its client reads it under daphne: while the connection's
transport is full (Twisted pauses the request's producer) the response waits, instead of writing the rest of
the stream into the server's memory."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import subprocess
import sys

import pytest
from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel, Request

from chatflow_site.pacing import PacedResponses
from tests.chatflow_site import _paced_app
from tests.processes import REPO, free_port, site_env, stop, wait_for_http
from tests.webhooks_app.servers import wait_until

CHUNKS = 10


def daphne_like() -> tuple[HTTPChannel, Request, list[dict], object]:
    """A Twisted request on a connection, and a ``send`` bound to it the way daphne binds its reply handler."""
    channel = HTTPChannel()
    channel.makeConnection(StringTransport())
    request = Request(channel)
    sent: list[dict] = []

    async def handle_reply(protocol: Request, message: dict) -> None:
        sent.append(message)

    return channel, request, sent, functools.partial(handle_reply, request)


async def streaming_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for i in range(CHUNKS):
        await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": i < CHUNKS - 1})


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def bodies(sent: list[dict]) -> int:
    return sum(m["type"] == "http.response.body" for m in sent)


def test_a_response_waits_while_the_client_does_not_read_and_goes_on_when_it_does():
    async def scenario() -> None:
        channel, request, sent, send = daphne_like()
        running = asyncio.ensure_future(PacedResponses(streaming_app)({"type": "http"}, None, send))
        await settle()
        assert bodies(sent) == CHUNKS  # a client that keeps up gets the whole stream
        await running
        assert request.producer is None  # given back before the last body: the connection may serve another

        channel, request, sent, send = daphne_like()
        running = asyncio.ensure_future(PacedResponses(paused_after_two(channel))({"type": "http"}, None, send))
        await settle()
        assert bodies(sent) == 3 and not running.done()  # the one in flight when it filled, then nothing
        channel.resumeProducing()  # the client read the buffer down
        await settle()
        await running
        assert bodies(sent) == CHUNKS and request.producer is None

    asyncio.run(scenario())


def paused_after_two(channel: HTTPChannel):
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(CHUNKS):
            if i == 2:
                channel.pauseProducing()  # the transport filled up (the client reads nothing)
            await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": i < CHUNKS - 1})
    return app


def test_a_client_that_goes_away_ends_the_wait():
    async def scenario() -> None:
        channel, request, sent, send = daphne_like()
        running = asyncio.ensure_future(PacedResponses(paused_after_two(channel))({"type": "http"}, None, send))
        await settle()
        assert not running.done()
        channel.stopProducing()  # the connection is being closed
        await running
        assert request.producer is None

    asyncio.run(scenario())


def test_another_server_gets_the_application_untouched():
    seen: list = []

    async def app(scope, receive, send) -> None:
        seen.append(send)

    async def send(message: dict) -> None:  # a plain coroutine (uvicorn's waits for its transport itself)
        pass

    asyncio.run(PacedResponses(app)({"type": "http"}, None, send))
    assert seen == [send]


def test_under_daphne_a_send_it_binds_differently_is_logged_once(caplog):
    async def app(scope, receive, send) -> None:
        pass

    async def send(message: dict) -> None:
        pass

    send.__module__ = "daphne.server"  # daphne's, bound some other way than to its request
    paced = PacedResponses(app)
    with caplog.at_level(logging.WARNING, logger="chatflow_site.pacing"):
        for _ in range(3):
            asyncio.run(paced({"type": "http"}, None, send))
    assert [r.getMessage() for r in caplog.records].count(
        "Serving under daphne, but its send is not bound to a request as expected: streamed responses are not "
        "paced to their clients (slow readers hold them in memory)") == 1


@pytest.fixture
def daphne_server(tmp_path):
    port = free_port()
    with (tmp_path / "daphne.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "tests.chatflow_site._paced_app:application"],
            cwd=REPO, env=site_env(), stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/state", timeout=30, proc=proc)
        yield port, base
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_real_daphne_stops_producing_a_stream_its_client_does_not_read(daphne_server):
    port, base = daphne_server

    def state() -> dict:
        return json.loads(wait_for_http(f"{base}/state", timeout=10))

    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    try:
        client.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
        client.recv(1024)  # and then nothing more
        # Either the stream is paced (a response waits for its client) or it runs to its end into memory.
        wait_until(lambda: state()["waiting"] or state()["finished"], 60, "the stream to wait or to finish")
        now = state()
        assert now["waiting"] == 1 and not now["finished"], now
        assert now["produced"] < _paced_app.CHUNKS
    finally:
        client.close()
    wait_until(lambda: not state()["waiting"], 30, "the wait to end when the client goes away")
