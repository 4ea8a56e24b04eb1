"""An in-memory channel layer whose sends take a while, as a Redis layer's first send after a reconnect does."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer


class SlowInMemoryChannelLayer(InMemoryChannelLayer):
    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await asyncio.sleep(0.2)
        await super().group_send(group, message)
