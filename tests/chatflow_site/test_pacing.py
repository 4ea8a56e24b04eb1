"""A streamed response goes out no faster than its client reads it under daphne: while the connection's
transport is full (Twisted pauses the request's producer) the response waits, instead of writing the rest of
the stream into the server's memory."""

from __future__ import annotations

import asyncio
import functools

from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel, Request

from chatflow_site.pacing import PacedResponses

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
