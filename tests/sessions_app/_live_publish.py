"""Child process for the Redis live test: ``python -m tests.sessions_app._live_publish SESSION TEXT``.

Plays one turn through the site's Runner (DATABASE_URL and REDIS_URL come from the environment), so
its run events are published by this process — not by the one that serves the websocket.
"""

from __future__ import annotations

import asyncio
import os
import sys


async def main(session_id: str, text: str) -> None:
    from channels.layers import get_channel_layer

    from sessions_app.live import publisher
    from sessions_app.runtime import site_runner

    await site_runner().run_async(session_id, text)
    await publisher.flush()
    layer = get_channel_layer()
    if hasattr(layer, "close_pools"):
        await layer.close_pools()


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatflow_site.settings")
    import django

    django.setup()
    asyncio.run(main(sys.argv[1], sys.argv[2]))
    print("published")
