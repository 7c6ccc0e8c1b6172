"""The slicer's MIG plans for this node, read from their stream and handed to the applier.

Owns the node agent's reader of ``SEEDANCE_NODE_PLANS``: its own ``node-agent-plans-<node>``
(`node_permissions.node_plan_reader`: filtered on this node's plan subject, the one reader a
node's user may create there), bound at every start from the stream's first message, no acks.
A plan stored while the agent was down, or published on another server of a NATS cluster
before that server had heard of a subscription, is read all the same: the stream holds it,
and the reader asks for it. (A core subscription missed both: a plan is delivered only to
subscriptions the publishing server knows of, and the agent never read plans back.)

Plans are handed over in the stream's order, a batch at a time, and only those still to apply
(`core.mig.plans_to_apply`): the replay at a start is one batch, so a plan older than one the
GPU already shows done is never applied again (where the node cannot tell, mig-manager's, the
replay is not applied at all). Each message is first checked to be a stored plan of this
node's reader (`core.plan_source`). It must not apply a plan itself (the service's applier does)
nor read another node's plans.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import replace

from nats.aio.msg import Msg

from seedance.core.bus import Bus
from seedance.core.logs import get_logger
from seedance.core.reader import PullReader, ReaderInterrupted
from seedance.events.codec import DecodeError, decode
from seedance.events.node_permissions import node_plan_reader
from seedance.events.slicing import MigLayoutPlan
from seedance.events.subjects import slicing
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.mig import plans_to_apply
from seedance.node_agent.core.plan_source import not_a_stored_plan

__all__ = ["PlanFeed"]

log = get_logger(__name__)


class PlanFeed:
    """This node's plans, in stream order, to ``apply``; ``seq`` is the last stream sequence
    read. ``in_effect`` (None: the node cannot tell) says whether the node shows a plan done;
    ``skipped(outcome)`` counts a message not applied (``not_published``, ``undecodable``,
    ``already_applied``, ``superseded``, ``not_replayed``).

    ``start`` binds the reader (from ``seq`` on after a first bind), ``run`` reads: the
    messages the stream held at the bind as one batch, then each batch as it comes.
    """

    def __init__(
        self,
        bus: Bus,
        node: str,
        *,
        apply: Callable[[MigLayoutPlan], Awaitable[None]],
        in_effect: Callable[[MigLayoutPlan], bool] | None,
        skipped: Callable[[str], None],
        batch: int = 64,
    ) -> None:
        token = kube_node_token(node)
        self._spec = node_plan_reader(token)
        self._subject = slicing.mig_plan(token)
        self._ack_prefix = f"$JS.ACK.{self._spec.stream}.{self._spec.durable}."
        self._bus = bus
        self._apply = apply
        self._in_effect = in_effect
        self._skipped = skipped
        self._batch = batch
        self._reader: PullReader | None = None
        self._backlog = 0
        #: Plans read and not handed over yet, with their consumer sequence (the first bind's
        #: replay is held until the whole of it is read).
        self._held: list[tuple[MigLayoutPlan, int]] = []
        self._delivered = 0
        #: Whether the replay of the first bind is handed over (a rebind's is not a replay:
        #: it reads on from ``seq``).
        self._replayed = False
        self.seq = 0

    async def start(self) -> None:
        # From the stream's first message (64 a node, an hour at most): what was published
        # while the agent was down. After an interruption, from the next one not read.
        if not self._replayed:  # interrupted before the replay was whole: read it again
            self.seq, self._held = 0, []
        spec = replace(self._spec, start_seq=self.seq + 1) if self.seq else self._spec
        await self._bus.ensure_consumer(spec)
        # A fresh no-ack consumer's pending count is exactly what it holds from its start.
        info = await self._bus.js.consumer_info(spec.stream, spec.durable)
        self._backlog, self._delivered = info.num_pending or 0, 0
        if self._reader is not None:
            await self._reader.close()
        self._reader = PullReader(self._bus.nc, spec.stream, spec.durable, batch=self._batch)
        await self._reader.start()

    async def run(self) -> None:
        while True:
            await self.step()

    async def step(self, timeout_s: float = 1.0) -> None:
        """Read one batch; apply what of it (and of the replay, once whole) is still to apply."""
        assert self._reader is not None
        try:
            msgs = await self._reader.next_batch(timeout_s=timeout_s)
        except ReaderInterrupted as exc:
            log.warning("node_agent_plans_rebind", reason=str(exc), seq=self.seq)
            await self.start()
            return
        for msg in msgs:
            self._read(msg)
        if self._delivered < self._backlog:
            return  # the replay is applied whole: a later plan of a GPU supersedes an earlier
        held, self._held = self._held, []
        if not self._replayed:  # the first bind's backlog: what the stream held at the start
            self._replayed = True
            await self._hand_over([p for p, seq in held if seq <= self._backlog], replay=True)
            held = [(p, seq) for p, seq in held if seq > self._backlog]
        await self._hand_over([p for p, _seq in held], replay=False)

    async def _hand_over(self, plans: list[MigLayoutPlan], *, replay: bool) -> None:
        if not plans:
            return
        choice = await asyncio.to_thread(
            functools.partial(plans_to_apply, plans, self._in_effect, replay=replay)
        )
        for plan in choice.in_effect:
            self._skipped("already_applied")
            log.info("mig_plan_in_effect", plan=plan.id, gpu=plan.gpu_index)
        for plan in choice.superseded:
            self._skipped("superseded")
            log.info("mig_plan_superseded", plan=plan.id, gpu=plan.gpu_index)
        for plan in choice.not_replayed:
            self._skipped("not_replayed")
            log.warning("mig_plan_not_replayed", plan=plan.id, gpu=plan.gpu_index)
        for plan in choice.apply:
            await self._apply(plan)

    def _read(self, msg: Msg) -> None:
        self.seq = msg.metadata.sequence.stream
        self._delivered = msg.metadata.sequence.consumer
        why = not_a_stored_plan(msg.subject, msg.reply, msg.data, self._subject, self._ack_prefix)
        if why is not None:
            self._skipped("not_published")
            log.warning("mig_plan_not_published", reason=why, seq=self.seq)
            return
        try:
            self._held.append((decode(msg.data, MigLayoutPlan), self._delivered))
        except DecodeError as exc:
            self._skipped("undecodable")
            log.warning("mig_plan_undecodable", error=str(exc), seq=self.seq)

    async def close(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()
