"""The slicer's MIG plans for this node, read from their stream and handed to the applier.

Owns the node agent's reader of ``SEEDANCE_NODE_PLANS``: its own ``node-agent-plans-<node>``
(`node_permissions.node_plan_reader`: filtered on this node's plan subject, the one reader a
node's user may create there), bound at every start from the stream's first message, no acks.
A plan stored while the agent was down, or published on another server of a NATS cluster
before that server had heard of a subscription, is read all the same: the stream holds it,
and the reader asks for it. (A core subscription missed both: a plan is delivered only to
subscriptions the publishing server knows of, and the agent never read plans back.)

Plans are handed over in the stream's order, a batch at a time, and only those still to apply
(`core.mig.plans_to_apply`): the replay at a start (the stream's messages up to its last
sequence at the first bind, kept by a rebind before the replay is read) is one batch, so a
plan older than one the GPU already shows done is never applied again (where the node cannot
tell, mig-manager's, the replay is not applied at all).
A plan that raises, asked whether it is done or applied, fails alone: counted and logged, the
others applied, the agent running. A rebind that meets a stream gone or not answering yet is
tried again; a stream created again is read from its first. Each message is first checked to be
a stored plan of this node's reader (`core.plan_source`). It must not apply a plan itself (the
service's applier does) nor read another node's plans.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from seedance.core.bus import Bus
from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.logs import get_logger
from seedance.core.reader import PullReader, ReaderInterrupted, nothing_left
from seedance.core.retry import RetryPolicy
from seedance.events.codec import DecodeError, decode
from seedance.events.node_permissions import node_plan_reader
from seedance.events.slicing import MigLayoutPlan
from seedance.events.subjects import slicing
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.mig import plans_to_apply
from seedance.node_agent.core.plan_source import not_a_stored_plan

__all__ = ["PlanFeed"]

log = get_logger(__name__)

#: What a rebind may meet and get past by trying again: the stream not there (deleted, or a
#: restarted server's JetStream before it has loaded it), JetStream or the connection not
#: answering yet. Anything else (a refusal: `ConsumerRefused`) ends the agent, as at its start.
_PASSING = (
    nats.js.errors.NotFoundError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoRespondersError,
    TimeoutError,
)


class PlanFeed:
    """This node's plans, in stream order, to ``apply``; ``seq`` is the last stream sequence
    read. ``in_effect`` (None: the node cannot tell) says whether the node shows a plan done;
    ``skipped(outcome)`` counts a plan not applied (``not_published``, ``undecodable``,
    ``already_applied``, ``superseded``, ``not_replayed``; ``failed``: telling it done or
    applying it raised, logged as ``mig_plan_failed`` with the error: never the agent's end).

    ``start`` binds the reader (from ``seq`` on after a first bind; from the stream's first
    again where the stream was re-created), ``run`` reads: the messages the stream held at the
    bind (up to its last sequence then) as one batch, then each batch as it comes.
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
        clock: Clock = WALL_CLOCK,
        retry: RetryPolicy | None = None,
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
        self._clock = clock
        self._retry = retry or RetryPolicy()
        self._reader: PullReader | None = None
        #: Plans read and not handed over yet, with their stream sequence (the first bind's
        #: replay is held until the whole of it is read).
        self._held: list[tuple[MigLayoutPlan, int]] = []
        #: The consumer sequence of the last message read from the binding.
        self._delivered = 0
        #: The stream's last sequence just before the first bind: the replay is what the
        #: stream held up to it (a count would never be reached where plans expire meanwhile).
        #: Kept across rebinds (None again only for a stream created again): a rebind before
        #: the replay was read (its consumer gone while the plans waited for the kubelet)
        #: taking the stream's last sequence then counted later plans as read back.
        self._replay_to: int | None = None
        #: Whether the replay of the first bind is handed over (a rebind's is not a replay:
        #: it reads on from ``seq``).
        self._replayed = False
        #: The stream's creation time at the last bind: another one is a re-created stream,
        #: whose sequences start again (``seq`` means nothing there).
        self._created: datetime | None = None
        self._failed_binds = 0
        self.seq = 0

    async def start(self) -> None:
        # From the stream's first message (64 a node, an hour at most): what was published
        # while the agent was down. After an interruption, from the next one not read.
        info = await self._bus.js.stream_info(self._spec.stream)
        if self._reset(info.created, info.state.last_seq):
            log.warning(
                "node_agent_plans_stream_recreated", seq=self.seq, last_seq=info.state.last_seq
            )
            self._replayed, self._replay_to = False, None  # from its first, as a replay
        self._created = info.created
        if not self._replayed:  # none yet, or interrupted before it was whole: from the first
            self.seq, self._held = 0, []
            if self._replay_to is None:
                self._replay_to = info.state.last_seq
        spec = replace(self._spec, start_seq=self.seq + 1) if self.seq else self._spec
        await self._bus.ensure_consumer(spec)
        self._delivered = 0
        if self._reader is not None:
            await self._reader.close()
            self._reader = None
        reader = PullReader(self._bus.nc, spec.stream, spec.durable, batch=self._batch)
        await reader.start()
        self._reader = reader

    def _reset(self, created: datetime | None, last_seq: int) -> bool:
        """Whether the stream is another than at the last bind (deleted and created again)."""
        if self._created is None:
            return False
        return (created is not None and created != self._created) or last_seq < self.seq

    async def run(self) -> None:
        while True:
            await self.step()

    async def step(self, timeout_s: float = 1.0) -> None:
        """Read one batch; apply what of it (and of the replay, once whole) is still to apply."""
        if self._reader is None and not await self._rebind():
            return
        assert self._reader is not None
        try:
            msgs = await self._reader.next_batch(timeout_s=timeout_s)
        except ReaderInterrupted as exc:
            # The first interruption since a message was read binds again at once; another
            # before any was read waits the retry policy's delay (a pull refused for good
            # otherwise rebound in a loop: each bind succeeds, each read is refused).
            self._failed_binds += 1
            delay_s = self._retry.delay_s(self._failed_binds - 1) if self._failed_binds > 1 else 0
            log.warning(
                "node_agent_plans_rebind", reason=str(exc), seq=self.seq, after_s=round(delay_s, 3)
            )
            await self._reader.close()
            self._reader = None
            if delay_s:
                await self._clock.sleep(delay_s)
            await self._rebind()
            return
        if msgs:  # the binding reads: the next interruption is met at once again
            self._failed_binds = 0
        for msg in msgs:
            self._read(msg)
        if not self._replayed and not await self._replay_whole(idle=not msgs):
            return  # the replay is applied whole: a later plan of a GPU supersedes an earlier
        held, self._held = self._held, []
        if not self._replayed:  # the first bind's replay: what the stream held at the start
            self._replayed = True
            end = self._replay_to or 0
            await self._hand_over([p for p, seq in held if seq <= end], replay=True)
            held = [(p, seq) for p, seq in held if seq > end]
        await self._hand_over([p for p, _seq in held], replay=False)

    async def _replay_whole(self, *, idle: bool) -> bool:
        """Whether every plan of the replay is read: one at or after the stream's last
        sequence at the bind is, or (a read that brought nothing) the reader has every message
        its consumer sent and none is left for it (those after this node's last plan there
        were other nodes', or expired or were purged since)."""
        if self._replay_to is None or self.seq >= self._replay_to:
            return True
        return idle and await nothing_left(
            self._bus.js, self._spec.stream, self._spec.durable, self._delivered
        )

    async def _rebind(self) -> bool:
        """Bind again; whether it is bound. What may pass (`_PASSING`) is logged and tried
        again at the next step, after the retry policy's delay."""
        try:
            await self.start()
        except _PASSING as exc:
            self._failed_binds += 1
            delay_s = self._retry.delay_s(self._failed_binds)
            log.warning(
                "node_agent_plans_rebind_failed",
                error=f"{type(exc).__name__}: {exc}",
                seq=self.seq,
                retry_in_s=round(delay_s, 3),
            )
            await self._clock.sleep(delay_s)
            return False
        return True  # the backoff is reset by a message read, not by a bind that succeeds

    async def _hand_over(self, plans: list[MigLayoutPlan], *, replay: bool) -> None:
        if not plans:
            return
        judged, failed = await asyncio.to_thread(functools.partial(_judge, plans, self._in_effect))
        for plan, exc in failed:
            self._failed(plan, exc)
        ok = [p for p in plans if p.id in judged]
        done = None if self._in_effect is None else (lambda p: judged[p.id])
        choice = plans_to_apply(ok, done, replay=replay)
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
            try:
                await self._apply(plan)
            except Exception as exc:  # a plan's own failure, whatever raised it: the rest go on
                # Counted and logged with the error, never raised: raised, one plan (a GPU the
                # node lacks, NVML's or the API server's error) ended the agent, and every
                # start read it back and ended again while the stream kept it (an hour).
                self._failed(plan, exc)

    def _failed(self, plan: MigLayoutPlan, exc: BaseException) -> None:
        self._skipped("failed")
        log.error(
            "mig_plan_failed",
            plan=plan.id,
            gpu=plan.gpu_index,
            error=f"{type(exc).__name__}: {exc}",
        )

    def _read(self, msg: Msg) -> None:
        self.seq = msg.metadata.sequence.stream
        self._delivered = msg.metadata.sequence.consumer
        why = not_a_stored_plan(msg.subject, msg.reply, msg.data, self._subject, self._ack_prefix)
        if why is not None:
            self._skipped("not_published")
            log.warning("mig_plan_not_published", reason=why, seq=self.seq)
            return
        try:
            self._held.append((decode(msg.data, MigLayoutPlan), self.seq))
        except DecodeError as exc:
            self._skipped("undecodable")
            log.warning("mig_plan_undecodable", error=str(exc), seq=self.seq)

    async def close(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()


def _judge(
    plans: Sequence[MigLayoutPlan], in_effect: Callable[[MigLayoutPlan], bool] | None
) -> tuple[dict[str, bool], list[tuple[MigLayoutPlan, BaseException]]]:
    """Each plan's ``in_effect`` (False where the node cannot tell), by id, and the plans of a
    GPU where asking raised, with the error: all of that GPU's (which of them is in effect, and
    so which supersede which, is unknown); the other GPUs' go on."""
    judged: dict[str, bool] = {}
    broken: dict[int, BaseException] = {}
    for plan in plans:
        if plan.gpu_index in broken:
            continue
        try:
            judged[plan.id] = in_effect(plan) if in_effect is not None else False
        except Exception as exc:  # NVML's error, or a GPU the node lacks: its plans fail
            broken[plan.gpu_index] = exc
    failed = [(p, broken[p.gpu_index]) for p in plans if p.gpu_index in broken]
    for plan, _exc in failed:
        judged.pop(plan.id, None)
    return judged, failed
