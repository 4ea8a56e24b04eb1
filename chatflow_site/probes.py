"""Probes for process managers and load balancers.

``/healthz/`` (liveness, in ``urls.py``) says the process answers and touches nothing. ``/readyz/``
(readiness) says whether this process can serve a page now: it runs ``SELECT 1`` on the database and,
when a Redis channel layer is configured (``REDIS_URL``), pings Redis. 200 ``{"status": "ready", "checks":
{...}}`` or 503 ``{"status": "unavailable", "checks": {...}}`` with ``Retry-After``; each check is ``"ok"``,
``"in-memory"`` (no channel layer server to reach) or why it failed. Unauthenticated, like the liveness
probe, so it says what failed and not the error's text (which may name hosts).
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from sessions_app.store import reopen_if_dropped
from sessions_app.unavailable import RETRY_AFTER_SECONDS

__all__ = ["readyz", "CHECK_SECONDS"]

#: Each check gives up after this many seconds (a load balancer's probe has a timeout of its own).
CHECK_SECONDS = 3.0


def _database() -> str:
    try:
        reopen_if_dropped()  # a connection the server dropped is opened again
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        reopen_if_dropped(failed=True)
        return "unreachable"
    return "ok"


async def _channel_layer() -> str:
    if not settings.REDIS_URL:
        return "in-memory"
    import redis.asyncio as redis

    client = redis.from_url(settings.REDIS_URL, socket_connect_timeout=CHECK_SECONDS, socket_timeout=CHECK_SECONDS)
    try:
        await asyncio.wait_for(client.ping(), CHECK_SECONDS)
    except (OSError, TimeoutError, redis.RedisError):
        return "unreachable"
    finally:
        await client.aclose()
    return "ok"


async def readyz(request: HttpRequest) -> HttpResponse:
    """Readiness probe (GET or HEAD): the database and the channel layer's server answer."""
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse({"error": "method_not_allowed", "detail": "Use GET or HEAD."}, status=405)
        response["Allow"] = "GET, HEAD"
        return response
    try:
        database = await asyncio.wait_for(sync_to_async(_database)(), CHECK_SECONDS)
    except TimeoutError:
        database = "no answer"
    checks = {"database": database, "channel_layer": await _channel_layer()}
    ready = all(value in ("ok", "in-memory") for value in checks.values())
    response = JsonResponse({"status": "ready" if ready else "unavailable", "checks": checks},
                            status=200 if ready else 503)
    response["Cache-Control"] = "no-store"
    if not ready:
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response
