"""The Redis channel layer's configuration (``settings.CHANNEL_LAYERS`` when ``REDIS_URL`` is set).

channels-redis waits for a message with a blocking pop that lasts ``RedisChannelLayer.brpop_timeout``
seconds on the server. A redis-py socket timeout at or below that ends every such wait with a
``TimeoutError``, and every consumer with it (websockets close with 1011), so the connection's
timeouts are set here rather than left to redis-py's defaults, which have changed between majors.
Options in the URL's query (``?socket_timeout=…``) still win over these.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REDIS_CONNECTION", "redis_layer"]

#: redis-py connection options, in seconds: a read waits well past the blocking pop; a connect to an
#: unreachable server fails fast (a send then drops its message instead of holding up the others).
REDIS_CONNECTION: dict[str, Any] = {"socket_timeout": 30.0, "socket_connect_timeout": 5.0}


def redis_layer(url: str) -> dict[str, Any]:
    """``{"BACKEND": …, "CONFIG": {"hosts": [{"address": url, **REDIS_CONNECTION}]}}`` for ``url``
    (``redis://``, ``rediss://`` or ``unix://``)."""
    return {"BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": url, **REDIS_CONNECTION}]}}
