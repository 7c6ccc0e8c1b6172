"""The slicer's placements on this node, read from the bus into the pure ``PlacementBook``.

Owns the node agent's reader of the slicer's trusted decisions: at every start it replays
``SEEDANCE_NODE_DECISIONS`` (placements, preemptions, releases and share changes: the node
agents' own mirror of the ledger's merged input, at its sequences; no tenant or other service
reads it) from its first message with its own ``node-agent-in-<node>`` consumer, so the book
is whole again after a restart. Its replay ends once it has the origin's decisions, not only
the mirror's: every bind first waits until the mirror has no lag (`seedance.core.mirror`), so a
mirror created (again) while the input holds history is not read as the whole of it. It must
not trust anything a tenant wrote: pod annotations are checked against this book, never the
other way round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.aio.msg import Msg

from seedance.core.bus import Bus
from seedance.core.logs import get_logger
from seedance.core.mirror import await_mirror
from seedance.core.reader import PullReader, ReaderInterrupted, nothing_left
from seedance.events.codec import DecodeError, decode
from seedance.events.node_permissions import node_reader_replica
from seedance.events.slicing import JobReleased, Placement, Preempted, ShareChanged
from seedance.events.subjects import ledger, replica_consumer
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.placement import PlacementBook

__all__ = ["PlacementFeed"]

log = get_logger(__name__)

_Decision = Placement | Preempted | JobReleased | ShareChanged


class PlacementFeed:
    """Keeps ``book`` current from the bus; ``seq`` is the last stream sequence applied.

    ``start`` binds the reader once the mirror has copied its origin (it waits meanwhile),
    ``catch_up`` applies the replay (what the stream held at the bind), ``run`` applies the
    rest as it comes, rebinding (after the same wait) from ``seq`` when interrupted.
    """

    def __init__(self, bus: Bus, node: str, *, batch: int = 500) -> None:
        self.book = PlacementBook(node)
        #: Called with the (tenant, job) whose placement on this node ended (its grants are
        #: released).
        self.on_end: Callable[[str, str], None] | None = None
        self.seq = 0
        self._bus = bus
        # its own reader, the one name a node's user may take (node_permissions)
        self._replica = node_reader_replica(kube_node_token(node))
        self._batch = batch
        self._reader: PullReader | None = None
        # The replay: messages the consumer held for this reader when it was bound, and how
        # many of this binding's deliveries are applied (its consumer sequence).
        self._backlog = 0
        self._delivered = 0
        self._durable = ""
        #: Set (and replaced) at every decision applied: ``news`` waits on it.
        self._news = asyncio.Event()
        #: Why the mirror had not copied the origin at the last look before a bind (None: it
        #: had, or no look yet).
        self.mirror_behind: str | None = None

    async def start(self) -> None:
        # The mirror first: the consumer's pending count below is what the mirror holds, which
        # is what the origin holds only once the mirror has copied it. A reader bound earlier
        # ended its replay short and refused an Allocate for a placement not copied yet.
        await await_mirror(self._bus, ledger.NODE_STREAM, on_behind=self._mirror_seen)
        spec = replica_consumer("node-agent-in", self._replica, start_seq=self.seq + 1)
        self._durable = spec.durable
        await self._bus.ensure_consumer(spec)
        # Read before the first pull: a fresh no-ack consumer's pending count is exactly the
        # filtered messages from start_seq on (whatever is published after only adds to them).
        info = await self._bus.js.consumer_info(spec.stream, spec.durable)
        self._backlog, self._delivered = info.num_pending or 0, 0
        if self._reader is not None:
            await self._reader.close()
        self._reader = PullReader(self._bus.nc, spec.stream, spec.durable, batch=self._batch)
        await self._reader.start()

    def _mirror_seen(self, reason: str | None) -> None:
        self.mirror_behind = reason

    @property
    def caught_up(self) -> bool:
        """Every message the stream held for this reader at its (last) bind is applied, and it
        held the origin's: the mirror had no lag at the bind."""
        return self._delivered >= self._backlog

    async def catch_up(self) -> None:
        """Apply the replay; return once ``caught_up`` (a rebind meanwhile re-counts it)."""
        backlog = self._backlog
        while not self.caught_up:
            await self._step()
        log.info("node_agent_feed_caught_up", replayed=backlog, seq=self.seq, book=len(self.book))

    async def run(self) -> None:
        while True:
            await self._step()

    async def _step(self) -> None:
        assert self._reader is not None
        try:
            msgs = await self._reader.next_batch(timeout_s=1.0)
        except ReaderInterrupted as exc:
            log.warning("node_agent_feed_rebind", reason=str(exc), seq=self.seq)
            await self.start()
            return
        for msg in msgs:
            self._apply(msg)
        # Decisions that expired (a week) or were purged between the bind and their read are
        # never delivered: the count is not reached, and the replay ends when none is left.
        if not msgs and not self.caught_up and await self._nothing_left():
            log.info("node_agent_feed_replay_short", counted=self._backlog, read=self._delivered)
            self._backlog = self._delivered

    async def _nothing_left(self) -> bool:
        return await nothing_left(self._bus.js, ledger.NODE_STREAM, self._durable, self._delivered)

    def _apply(self, msg: Msg) -> None:
        self.seq = seq = msg.metadata.sequence.stream
        self._delivered = msg.metadata.sequence.consumer
        try:
            ev = decode(msg.data, _Decision)
        except DecodeError as exc:
            # The stream holds trusted facts only; one that does not decode is a newer event
            # version this agent does not know: it cannot be a placement for it to honour.
            log.warning("node_agent_decision_undecodable", seq=seq, error=str(exc))
            return
        ended = self.book.apply(ev)
        if isinstance(ev, ShareChanged):
            self._share_changed(ev)
        if ended is not None and self.on_end is not None:
            self.on_end(*ended)
        news, self._news = self._news, asyncio.Event()
        news.set()

    def _share_changed(self, ev: ShareChanged) -> None:
        """Log what a share change does on this node. A container's MPS limit is the
        ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` its Allocate answer set, read by CUDA when the
        client connects, and the kubelet keeps that answer for the pod's life: a running pod
        keeps its limit. The new share is what this node grants from now on (an Allocate for
        the job: its next pod), and what the ledger bills (docs/node-agent.md)."""
        share = self.book.share_of(ev.tenant, ev.job_id)
        log.info(
            "node_agent_share_changed",
            tenant=ev.tenant,
            job_id=ev.job_id,
            gpu=ev.gpu_index,
            from_milli=ev.from_milli,
            to_milli=ev.to_milli,
            mem_limit_mib=self.book.mem_limit_of(ev.tenant, ev.job_id),
            reason=ev.reason.value,
            applied=share == ev.to_milli,
            applies_at="next_allocate",
        )

    async def news(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the next decision to be applied; whether one was."""
        try:
            await asyncio.wait_for(self._news.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()
