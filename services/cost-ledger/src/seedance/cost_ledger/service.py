"""The cost-ledger service: the bus adapter around one deterministic ``LedgerReplica``.

Replicas are active-active and deterministic (see docs/cost-ledger.md, "Exactly once"):
- every replica reads the merged input stream ``SEEDANCE_LEDGER_IN`` (the slicer's placements,
  preemptions and releases, the collectors' samples and inventory: trusted facts only, sourced
  into one order by the server) from its own
  ``ledger-in-<replica>`` consumer, without acks, starting after its checkpoint's sequence;
- it steps the replica through each message in stream order and publishes the outputs with
  their deterministic ids as ``Nats-Msg-Id`` (the second replica's copies are dropped by the
  stream's duplicate window), waiting for the stream's acks before going on;
- every ``checkpoint_every_events`` events or ``checkpoint_every_s`` seconds it writes its
  checkpoint (core snapshot + sequence) to KV, forward-only by compare-and-set on one key shared
  by the replicas: they hold equal states at equal sequences, so the most advanced wins and a
  restarted replica resumes from it, re-publishing at most what followed (duplicates, dropped).
A SIGKILL anywhere loses nothing (what is after the checkpoint is re-read) and duplicates
nothing (same ids, same content). Inputs that can never be applied are dead-lettered with a
reason (with an id derived from the input, so two replicas' letters are one): a message that
never decodes (a naive ``at``), a fact on another tenant's or node's subject, a time ahead of
the message's stream timestamp by more than ``max_ahead_s``, and any error raised while
stepping one event (``LedgerReplica.step``); the replica goes on with the next message. Every
output is bounded by construction (``MAX_OUTPUT_BYTES``, 64 KiB, whatever the window and the
sampling rate); the service refuses to start on a server whose ``max_payload`` cannot carry
that bound.
Each input that produces outputs (or places a job) gets a span over its step that continues its
producer's trace, and what it produces carries W3C trace context beside ``Nats-Msg-Id``: a job's
cost entries carry its placement's,
so one job is one trace from the SDK's submit to its costs (``_JobTraces``).

Wiring only: reading, publishing, checkpoints and dead letters are
`seedance.core.durable.ReplicatedRuntime`'s; the step of a batch and what an acknowledged one
counts are `seedance.cost_ledger.stepper`'s; the state machine is `LedgerReplica`'s.
"""

from __future__ import annotations

from seedance.core import Clock, Lifecycle, ServiceRuntime, WallClock
from seedance.core.durable.replicated import Checkpointing, ReplicatedRuntime
from seedance.core.logs import get_logger
from seedance.cost_ledger.core.replica import (
    MAX_OUTPUT_BYTES,
    OUTPUT_HEADERS_BYTES,
    LedgerReplica,
)
from seedance.cost_ledger.metrics import LedgerMetrics
from seedance.cost_ledger.stepper import LedgerStep
from seedance.events.subjects import replica_consumer

__all__ = ["LedgerMetrics", "LedgerService"]

log = get_logger(__name__)

_BUCKET = "seedance-ledger"


class LedgerService(Lifecycle):
    """The parts, handed in ready-built (`build` builds them as deployed)."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        durable: ReplicatedRuntime,
        *,
        replica: LedgerReplica,
        name: str,
        metrics: LedgerMetrics,
    ) -> None:
        self._rt = runtime
        self.durable = durable
        self.replica = replica
        self.name = name
        self.metrics = metrics
        runtime.loop(durable.consume)

    @classmethod
    def build(
        cls,
        runtime: ServiceRuntime,
        replica: LedgerReplica,
        *,
        name: str,
        checkpoint_key: str = "default",
        batch: int = 1000,
        checkpoint_every_events: int = 20_000,
        checkpoint_every_s: float = 5.0,
        from_start: bool = True,
        clock: Clock | None = None,
    ) -> LedgerService:
        """The ledger replica `name` as `__main__` runs it. ``clock`` times only operations
        (checkpoint spacing, rebind deadlines), never what is computed."""
        clock = clock or WallClock()
        metrics = LedgerMetrics(runtime.registry)
        step = LedgerStep(replica, metrics, clock)
        durable = ReplicatedRuntime(
            runtime, clock, replica,
            consumer=lambda start_seq: replica_consumer("ledger-in", name, start_seq=start_seq),
            checkpointing=Checkpointing(
                bucket=_BUCKET, key=f"checkpoint.{checkpoint_key}", writer=name,
                every_events=checkpoint_every_events, every_s=checkpoint_every_s,
            ),
            step_batch=step.step_batch, on_acked=step.acked,
            on_dead_letter=lambda kind: metrics.dead_letters_total.labels(kind).inc(),
            on_checkpoint=metrics.checkpoint_seq.set,
            on_checkpoint_failed=metrics.checkpoint_failures_total.inc,
            on_rebind=lambda ok: metrics.rebinds_total.labels("ok" if ok else "failed").inc(),
            batch=batch, from_start=from_start, log_as="ledger",
        )  # fmt: skip
        return cls(runtime, durable, replica=replica, name=name, metrics=metrics)

    async def start(self) -> None:
        await self._rt.start()
        self._check_max_payload(self._rt.bus.nc.max_payload)
        await self.durable.start()
        log.info("ledger_started", replica=self.name, seq=self.replica.seq)

    def _check_max_payload(self, max_payload: int) -> None:
        """Refuse to start on a server whose ``max_payload`` cannot carry the largest output
        the ledger can make (``MAX_OUTPUT_BYTES``, plus its headers): it would fail at that
        output's publish, mid-stream, at every restart."""
        need = MAX_OUTPUT_BYTES + OUTPUT_HEADERS_BYTES
        if max_payload < need:
            raise RuntimeError(
                f"the server's max_payload = {max_payload} is under the ledger's output bound "
                f"MAX_OUTPUT_BYTES = {MAX_OUTPUT_BYTES} + {OUTPUT_HEADERS_BYTES} for headers: "
                "raise the server's max_payload (nats-server's default, 1 MiB, carries it)"
            )

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        await self._rt.stop()

    async def close(self) -> None:
        await self.durable.close()
        await self._rt.close()

    async def checkpoint(self) -> bool:
        """Write this replica's state unless the stored one is as advanced; True if written."""
        return await self.durable.checkpoint()
