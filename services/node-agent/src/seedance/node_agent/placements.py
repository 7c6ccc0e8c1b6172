"""The slicer's placements on this node, read from the bus into the pure ``PlacementBook``.

Owns the node agent's reader of the slicer's trusted decisions: at every start it replays the
ledger's merged input (placements, preemptions, releases; tenants cannot read that stream)
from its first message with its own ``node-agent-in-<node>`` consumer, so the book is whole
again after a restart. It must not trust anything a tenant wrote: pod annotations are checked
against this book, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable

from seedance.core.bus import Bus
from seedance.core.logs import get_logger
from seedance.core.reader import PullReader, ReaderInterrupted
from seedance.events.codec import DecodeError, decode
from seedance.events.slicing import JobReleased, Placement, Preempted
from seedance.events.subjects import replica_consumer
from seedance.node_agent.core.placement import PlacementBook, node_token

__all__ = ["PlacementFeed"]

log = get_logger(__name__)

_Decision = Placement | Preempted | JobReleased


class PlacementFeed:
    """Keeps ``book`` current from the bus; ``seq`` is the last stream sequence applied."""

    def __init__(self, bus: Bus, node: str, *, batch: int = 500) -> None:
        self.book = PlacementBook(node)
        #: Called with a job id whose placement on this node ended (its grants are released).
        self.on_end: Callable[[str], None] | None = None
        self.seq = 0
        self._bus = bus
        self._replica = node_token(node).replace(":", "-")
        self._batch = batch
        self._reader: PullReader | None = None

    async def start(self) -> None:
        spec = replica_consumer("node-agent-in", self._replica, start_seq=self.seq + 1)
        await self._bus.ensure_consumer(spec)
        if self._reader is not None:
            await self._reader.close()
        self._reader = PullReader(self._bus.nc, spec.stream, spec.durable, batch=self._batch)
        await self._reader.start()

    async def run(self) -> None:
        while True:
            assert self._reader is not None
            try:
                msgs = await self._reader.next_batch(timeout_s=1.0)
            except ReaderInterrupted as exc:
                log.warning("node_agent_feed_rebind", reason=str(exc), seq=self.seq)
                await self.start()
                continue
            for msg in msgs:
                self._apply(msg.data, msg.metadata.sequence.stream)

    def _apply(self, data: bytes, seq: int) -> None:
        self.seq = seq
        try:
            ev = decode(data, _Decision)
        except DecodeError as exc:
            # The stream holds trusted facts only; one that does not decode is a newer event
            # version this agent does not know: it cannot be a placement for it to honour.
            log.warning("node_agent_decision_undecodable", seq=seq, error=str(exc))
            return
        ended = self.book.apply(ev)
        if ended is not None and self.on_end is not None:
            self.on_end(ended)

    async def close(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()
