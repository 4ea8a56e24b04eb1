"""The ASGI application test_pacing serves with a real daphne: ``/stream`` streams far more than any socket
buffer holds through ``PacedResponses``; any other path answers the stream's state as JSON (``produced``:
body chunks the stream has handed to ``send``; ``finished``; ``waiting``: the middleware's count)."""

from __future__ import annotations

import json

from chatflow_site.pacing import PacedResponses

CHUNK = 64 * 1024
CHUNKS = 1024  # 64 MiB in all
state = {"produced": 0, "finished": False}


async def _app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] != "/stream":
        body = json.dumps({**state, "waiting": application.waiting}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for i in range(CHUNKS):
        state["produced"] += 1
        await send({"type": "http.response.body", "body": b"x" * CHUNK, "more_body": i < CHUNKS - 1})
    state["finished"] = True


application = PacedResponses(_app)
