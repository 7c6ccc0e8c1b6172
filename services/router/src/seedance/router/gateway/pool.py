"""The gateway's replica pool: which Triton replicas are registered, and in what phase.

Owns: registering, removing and draining replicas, their phases (WARMING, READY, EJECTED,
DRAINING) and the `ready` metric that mirrors them, warm-up of a new or recovered replica
before it takes traffic, the health probes that eject a replica which stops answering and
bring it back when it answers again, waiting for replicas to become ready, and the list of
replicas a request may be sent to.

Must not: choose among candidates (the `ReplicaSelector` does, through `OipGateway`), forward
requests or decide what is retryable (`server.py` and `outcomes.py` do), or serve gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import grpc
import structlog

from seedance.router.gateway.metrics import GatewayMetrics
from seedance.router.gateway.replicas import Replica, ReplicaPhase
from seedance.router.gateway.settings import GatewaySettings

__all__ = ["ReplicaPool"]

_log = structlog.get_logger(__name__)


class ReplicaPool:
    """The registered replicas and their health. `start_probes()` begins the probe loop;
    `stop()` cancels probes and warm-ups; `close()` closes every replica's channel."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        metrics: GatewayMetrics,
        monotonic_s: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._monotonic_s = monotonic_s
        self._replicas: dict[str, Replica] = {}
        self._warmups: dict[str, asyncio.Task[None]] = {}
        self._probe_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._ready_changed = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._replicas)

    def start_probes(self) -> None:
        self._probe_task = asyncio.create_task(self._probe_loop(), name="gateway-probes")

    async def stop(self) -> None:
        """Cancel the probe loop and every warm-up in progress (the channels stay open)."""
        self._stopping.set()
        tasks = [t for t in (self._probe_task, *self._warmups.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probe_task = None
        self._warmups.clear()

    async def close(self) -> None:
        """Close every replica's channel and forget them."""
        for replica in self._replicas.values():
            await replica.close()
        self._replicas.clear()

    # -- membership ------------------------------------------------------------------------

    async def add(
        self, name: str, address: str, *, models: frozenset[str] | None = None, owner: str = ""
    ) -> None:
        """Register a replica; it takes traffic once it answers ready and is warmed up.

        `models`: the models it may be sent (None: every model); only those are warmed up.
        `owner`: whose models those are (a tenant's; "": the shared pool's).
        """
        if name in self._replicas:
            raise ValueError(f"replica {name!r} already registered")
        replica = Replica(name=name, address=address, models=models, owner=owner)
        self._replicas[name] = replica
        self._metrics.ready(replica=name, ready=False)
        self._begin_warmup(replica)

    async def remove(self, name: str) -> None:
        """Stop sending new requests to a replica and close its channel."""
        replica = self._replicas.pop(name)
        await self._cancel_warmup(name)
        self._metrics.ready(replica=name, ready=False)
        await replica.close()

    async def drain(self, name: str, *, timeout_s: float) -> bool:
        """Stop sending new requests to a replica, let its in-flight ones finish (at most
        `timeout_s`), then remove it. True if it emptied in time; after the timeout the rest
        are cut off by the channel's close, as `remove` does."""
        replica = self._replicas[name]
        await self._cancel_warmup(name)
        await self.set_phase(replica, ReplicaPhase.DRAINING)
        emptied = True
        try:
            async with asyncio.timeout(timeout_s):
                await replica.wait_idle()
        except TimeoutError:
            emptied = False
            _log.warning("replica_drain_timeout", replica=name, outstanding=replica.outstanding)
        if self._replicas.get(name) is replica:
            await self.remove(name)
        return emptied

    async def _cancel_warmup(self, name: str) -> None:
        task = self._warmups.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- views -----------------------------------------------------------------------------

    def models(self) -> dict[str, tuple[str, frozenset[str] | None]]:
        """Each registered replica's address and the models it may be sent (None: all)."""
        return {name: (r.address, r.models) for name, r in self._replicas.items()}

    def owners(self) -> dict[str, str]:
        """Each registered replica's owner (a tenant; "": the shared pool)."""
        return {name: r.owner for name, r in self._replicas.items()}

    def phases(self) -> dict[str, ReplicaPhase]:
        return {name: r.phase for name, r in self._replicas.items()}

    def outstanding(self) -> dict[str, int]:
        return {name: r.outstanding for name, r in self._replicas.items()}

    def candidates(self, tried: set[str], model: str | None, owner: str = "") -> list[Replica]:
        """READY replicas not yet tried that may be sent `model` of `owner` (a tenant; "": the
        shared pool's) (model None: any replica)."""
        return [
            r
            for r in self._replicas.values()
            if r.phase is ReplicaPhase.READY
            and r.name not in tried
            and (model is None or r.serves(model, owner))
        ]

    async def wait_ready(self, names: Sequence[str] | None = None, *, timeout_s: float) -> None:
        """Wait until the named replicas (default: all registered) take traffic.

        Raises TimeoutError naming the replicas still not ready.
        """
        wanted = list(names) if names is not None else list(self._replicas)

        def all_ready() -> bool:
            return all(
                n in self._replicas and self._replicas[n].phase is ReplicaPhase.READY
                for n in wanted
            )

        try:
            async with asyncio.timeout(timeout_s), self._ready_changed:
                await self._ready_changed.wait_for(all_ready)
        except TimeoutError:
            phases = {n: self._replicas[n].phase.value for n in wanted if n in self._replicas}
            raise TimeoutError(f"replicas not ready after {timeout_s} s: {phases}") from None

    # -- health ----------------------------------------------------------------------------

    async def set_phase(self, replica: Replica, phase: ReplicaPhase) -> None:
        if replica.phase is not phase:
            _log.info("replica_phase", replica=replica.name, phase=phase.value)
        replica.phase = phase
        self._metrics.ready(replica=replica.name, ready=phase is ReplicaPhase.READY)
        async with self._ready_changed:
            self._ready_changed.notify_all()

    def _begin_warmup(self, replica: Replica) -> None:
        replica.phase = ReplicaPhase.WARMING
        self._warmups[replica.name] = asyncio.create_task(
            self._warm(replica), name=f"warmup-{replica.name}"
        )

    async def _warm(self, replica: Replica) -> None:
        try:
            if not await replica.probe_ready(timeout_s=self._settings.probe_timeout_s):
                await self.set_phase(replica, ReplicaPhase.EJECTED)
                return
            models = [m.name for m in self._settings.models if m.warm_up and replica.serves(m.name)]
            reports = await replica.warm_up(
                models,
                self._settings.warmup,
                monotonic_s=self._monotonic_s,
                on_request=lambda: self._metrics.warmup_request(replica=replica.name),
            )
        except grpc.aio.AioRpcError as error:
            _log.warning("replica_warmup_failed", replica=replica.name, code=error.code().name)
            await self.set_phase(replica, ReplicaPhase.EJECTED)
            return
        finally:
            self._warmups.pop(replica.name, None)
        _log.info(
            "replica_warmed_up",
            replica=replica.name,
            requests={r.model: len(r.latencies_s) for r in reports},
        )
        await self.set_phase(replica, ReplicaPhase.READY)

    async def _probe_loop(self) -> None:
        """Eject READY replicas that stop answering; warm up EJECTED ones that come back."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.probe_interval_s):
                    await self._stopping.wait()
            for replica in list(self._replicas.values()):
                # Removed (its channel closed) while this round waited on another's probe: a
                # drain that FOLLOW_PLAN or the replica watch ran meanwhile.
                if self._replicas.get(replica.name) is not replica:
                    continue
                if replica.phase is ReplicaPhase.WARMING:
                    continue
                ready = await replica.probe_ready(timeout_s=self._settings.probe_timeout_s)
                if self._replicas.get(replica.name) is not replica:
                    continue  # removed during its own probe
                if replica.phase is ReplicaPhase.READY and not ready:
                    await self.set_phase(replica, ReplicaPhase.EJECTED)
                elif replica.phase is ReplicaPhase.EJECTED and ready:
                    self._begin_warmup(replica)
