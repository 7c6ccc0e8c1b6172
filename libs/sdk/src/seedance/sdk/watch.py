"""One push consumer's deliveries, read in order (the client's ``_watch`` creates it).

Owns answering the consumer's heartbeats and flow control while events are read. Must not
decode: the caller knows which event family it reads.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Watch"]


class Watch:
    def __init__(self, nc: Any, queue: asyncio.Queue[Any], js: Any, stream: str, name: str) -> None:
        self._nc = nc
        self._queue = queue
        self._js = js
        self._stream = stream
        self._name = name

    async def is_empty(self) -> bool:
        """True when the stream holds nothing for this watch (delivered or still pending)."""
        info = await self._js.consumer_info(self._stream, self._name)
        return int(info.num_pending) == 0 and int(info.delivered.consumer_seq or 0) == 0

    async def next_msg(self) -> Any:
        """The next event's message (answering heartbeats and flow control on the way)."""
        while True:
            msg = await self._queue.get()
            if msg.data:
                return msg
            if msg.reply:
                await self._nc.publish(msg.reply, b"")

    async def next_data(self) -> bytes:
        return bytes((await self.next_msg()).data)
