"""The Redis channel layer (real server on 127.0.0.1:6379): a turn played in another OS process reaches
a websocket consumer connected to this one."""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers, get_channel_layer
from django.db import connection

from chatflow_site import layers
from sessions_app.models import ChatMessage
from tests.processes import REPO, TEST_REDIS_URL, redis_up, site_env
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.live_support import (  # noqa: F401  (fixture)
    close_consumer_connections,
    connected,
    cookie_for,
    frames_until,
    message_ids,
    resume,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.usefixtures("close_consumer_connections")]

REDIS_URL = TEST_REDIS_URL


def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def redis_layer(settings):
    if not redis_up():
        pytest.skip("no Redis server on 127.0.0.1:6379")
    settings.CHANNEL_LAYERS = {"default": layers.redis_layer(REDIS_URL)}  # the site's, as in the child
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def viewer_cookie():
    return cookie_for(personas.viewer())


async def test_an_event_published_by_another_process_reaches_the_consumer(redis_layer, viewer_cookie):
    session_id = f"redis:live:{uuid.uuid4().hex[:8]}"  # its own group: other runs may share this Redis
    await database_sync_to_async(cv.store)(session_id, [cv.user("hi"), cv.model("hello")])
    seen = await database_sync_to_async(
        lambda: ChatMessage.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True)[0])()
    env = site_env(DATABASE_URL=database_url(), REDIS_URL=REDIS_URL)
    try:
        async with connected(f"/ws/sessions/{session_id}/", viewer_cookie) as page:
            assert (await page.connect())[0]
            assert message_ids("".join(await resume(page, seen))) == []
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.sessions_app._live_publish", session_id, "Where is order 42?",
                cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(child.communicate(), timeout=60)
            assert child.returncode == 0 and out.strip() == b"published", err.decode()
            assert b"in-memory channel layer" not in err
            text = "\n".join(await frames_until(page, 'id="live-cursor"', timeout=10))
            assert text.index("turn running") < text.index("Where is order 42?") < text.index("Turn 2")
            rows = ChatMessage.objects.filter(session_id=session_id, id__gt=seen).values_list("id", flat=True)
            new = await database_sync_to_async(lambda: list(rows))()
            assert message_ids(text) == new and len(new) >= 2
    finally:
        await get_channel_layer().close_pools()
