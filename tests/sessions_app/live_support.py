"""Helpers for the live tests: websocket communicators on the real ASGI application (origin check, auth
from the session cookie), a Runner on the site's store that publishes like the site's, frame readers."""

from __future__ import annotations

import asyncio
import re
import uuid
from contextlib import asynccontextmanager
from typing import Any

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.layers import channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client

from chatflow_agent import Runner
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_site.layers import redis_layer
from sessions_app import registry
from sessions_app.live import publisher
from tests.processes import LAYER_REDIS_URL, redis_up

ORIGIN = (b"origin", b"http://localhost")


@pytest_asyncio.fixture(params=["memory", "redis"])
async def channel_layer(request, settings):
    """The test runs on the in-memory layer, then on the site's Redis layer configuration (keys under a
    prefix of its own: other runs may share the database); yields ``"memory"`` or ``"redis"``."""
    if request.param == "memory":
        layer: dict[str, Any] = {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    else:
        if not redis_up():
            pytest.skip("no Redis server on 127.0.0.1:6379")
        layer = redis_layer(LAYER_REDIS_URL)
        layer["CONFIG"]["prefix"] = f"chatflow-test-{uuid.uuid4().hex[:12]}"
    settings.CHANNEL_LAYERS = {"default": layer}
    channel_layers.backends.clear()
    yield request.param
    await publisher.flush()  # a live update still being sent would open a connection after close_pools
    if request.param == "redis":
        await get_channel_layer().close_pools()
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """A new channel layer per test (an in-memory layer's queues belong to one event loop). Autouse in
    every module that imports it."""
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def cookie_for(user: Any) -> bytes | None:
    """The session cookie of a logged-in ``user`` (sync: call from a sync fixture or through a thread)."""
    if user is None:
        return None
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


@asynccontextmanager
async def connected(path: str, cookie: bytes | None):
    """A communicator on ``chatflow_site.asgi.application``; always disconnected afterwards."""
    from chatflow_site.asgi import application

    headers = [ORIGIN, (b"host", b"localhost")] + ([(b"cookie", cookie)] if cookie else [])
    communicator = WebsocketCommunicator(application, path, headers=headers)
    try:
        yield communicator
    finally:
        if not communicator.future.done():  # a timed-out receive already cancelled the application
            await communicator.disconnect()


def site_runner_with(*steps: Any, delay: float = 0.0) -> Runner:
    """A Runner like the site's (registry agents, the site's store, publishing run events) on a script."""
    from sessions_app.runtime import site_store

    runner = Runner(registry.starting_agent(), session_store=site_store(),
                    engine=ScriptedEngine(*steps, delay=delay, stream=True))
    runner.subscribe(publisher)
    return runner


async def frames_until(communicator: WebsocketCommunicator, marker: str, timeout: float = 10) -> list[str]:  # noqa: ASYNC109
    """Text frames received until one contains ``marker`` (inclusive)."""
    out: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        frame = await communicator.receive_from(timeout=max(0.05, deadline - loop.time()))
        out.append(frame)
        if marker in frame:
            return out


async def drain(communicator: WebsocketCommunicator, quiet: float = 0.3, first: float = 5.0) -> list[str]:
    """Every frame until none arrives for ``quiet`` seconds, waiting up to ``first`` seconds for the first one
    (a loaded machine's channel layer may take longer than ``quiet`` to deliver what the test just caused)."""
    out: list[str] = []
    while True:
        try:
            out.append(await communicator.receive_from(timeout=quiet if out else first))
        except TimeoutError:
            return out


def message_ids(html: str) -> list[int]:
    """The stored message ids of the turns in ``html`` (each turn lists its rows' ids)."""
    return [int(x) for ids in re.findall(r'data-message-ids="([\d ]*)"', html) for x in ids.split()]


def unique_message_ids(html: str) -> list[int]:
    return sorted(set(message_ids(html)))


async def resume(communicator: WebsocketCommunicator, after: int, **extra: Any) -> list[str]:
    await communicator.send_json_to({"type": "resume", "after": after, **extra})
    return await frames_until(communicator, 'id="live-status"')


async def db(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await database_sync_to_async(fn)(*args, **kwargs)


@pytest_asyncio.fixture(autouse=False)
async def close_consumer_connections():
    """Close the database connection of the thread consumers run their ORM calls in (PostgreSQL
    refuses to drop the test database while it is open)."""
    yield
    await database_sync_to_async(connections.close_all)()
