"""The gateway's view of its Triton replicas: channels, outstanding counts, health, warm-up.

Owns: one `Replica` per upstream server (a gRPC channel and the `inference.GRPCInferenceService`
stub from `tritonclient.grpc`, its outstanding-request counts, latency average and lifecycle
state) and the warm-up procedure a new or recovered replica goes through before it takes
traffic.

Must not: choose between replicas (that is a `ReplicaSelector`) or decide what is retryable
(`outcomes.py`). Warm-up requests go through the same channel that will carry traffic, so the
connection set-up is part of what warm-up pays for.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import numpy as np
import structlog
from tritonclient.grpc import service_pb2, service_pb2_grpc

from seedance.router.gateway.ports import Candidate
from seedance.router.gateway.tensors import DATATYPE_TO_NUMPY
from seedance.router.gateway.warmup import WarmupPolicy, latency_settled

__all__ = ["CHANNEL_OPTIONS", "Replica", "ReplicaPhase", "WarmupReport", "warmup_request"]

_log = structlog.get_logger(__name__)

# Same as tritonclient's defaults: tensors can be large, and keepalive notices a dead peer.
CHANNEL_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # Reconnect quickly after a replica restarts; the default backoff grows to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)

# Weight of the newest sample in the latency average: about the last 10 requests matter.
_EWMA_ALPHA = 0.2


class ReplicaPhase(enum.Enum):
    WARMING = "warming"  # reachable, being warmed up, takes no traffic yet
    READY = "ready"  # takes traffic
    EJECTED = "ejected"  # failed (UNAVAILABLE or a failed probe); probed until it comes back
    DRAINING = "draining"  # being removed: no new traffic, its in-flight requests finish


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupReport:
    replica: str
    model: str
    latencies_s: tuple[float, ...]
    settled: bool


def warmup_request(metadata: service_pb2.ModelMetadataResponse) -> service_pb2.ModelInferRequest:
    """A smallest valid request for a model: every input zero-filled, each -1 dimension 1."""
    request = service_pb2.ModelInferRequest(model_name=metadata.name)
    for tensor in metadata.inputs:
        shape = [1 if d < 0 else int(d) for d in tensor.shape]
        count = int(np.prod(shape)) if shape else 1
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype)
        entry.shape.extend(shape)
        if tensor.datatype == "BYTES":
            # Each BYTES element in raw form is a 4-byte little-endian length, then the bytes.
            request.raw_input_contents.append(b"\x00\x00\x00\x00" * count)
        else:
            dtype = DATATYPE_TO_NUMPY.get(tensor.datatype)
            if dtype is None:
                raise ValueError(
                    f"model {metadata.name!r} input {tensor.name!r}: cannot build a warm-up "
                    f"tensor of datatype {tensor.datatype!r}"
                )
            request.raw_input_contents.append(bytes(count * dtype.itemsize))
    return request


class Replica:
    """One upstream Triton server as the gateway tracks it."""

    def __init__(
        self, *, name: str, address: str, models: frozenset[str] | None = None, owner: str = ""
    ) -> None:
        self.name = name
        self.address = address
        # The models it may be sent (None: all); a registered replica serves what it registered.
        self.models = models
        # Whose models it serves: a tenant's (its registration's owner) or "", the shared pool's.
        self.owner = owner
        self.phase = ReplicaPhase.WARMING
        self.outstanding = 0
        # Set whenever nothing is in flight: what a drain waits on.
        self._idle = asyncio.Event()
        self._idle.set()
        self._outstanding_by_model: Counter[str] = Counter()
        self.latency_ewma_s: float | None = None
        self._channel = grpc.aio.insecure_channel(address, options=list(CHANNEL_OPTIONS))
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def serves(self, model: str, owner: str | None = None) -> bool:
        """Whether it may be sent ``model`` (of ``owner``: None for any owner, as warm-up asks)."""
        if owner is not None and owner != self.owner:
            return False
        return self.models is None or model in self.models

    def state(self, model: str) -> Candidate:
        return Candidate(
            name=self.name,
            address=self.address,
            outstanding=self.outstanding,
            outstanding_for_model=self._outstanding_by_model[model],
            latency_ewma_s=self.latency_ewma_s,
        )

    def begin(self, model: str) -> None:
        self.outstanding += 1
        self._idle.clear()
        self._outstanding_by_model[model] += 1

    def end(self, model: str, *, latency_s: float | None) -> None:
        self.outstanding -= 1
        if self.outstanding <= 0:
            self._idle.set()
        self._outstanding_by_model[model] -= 1
        if self._outstanding_by_model[model] <= 0:
            del self._outstanding_by_model[model]
        if latency_s is not None:
            previous = self.latency_ewma_s
            self.latency_ewma_s = (
                latency_s if previous is None else previous + _EWMA_ALPHA * (latency_s - previous)
            )

    async def wait_idle(self) -> None:
        """Return once no request is in flight on this replica."""
        await self._idle.wait()

    async def probe_ready(self, *, timeout_s: float) -> bool:
        """ServerReady on the replica; False on any transport failure."""
        try:
            response = await self.stub.ServerReady(
                service_pb2.ServerReadyRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(response.ready)

    async def warm_up(
        self,
        models: Sequence[str],
        policy: WarmupPolicy,
        *,
        monotonic_s: Callable[[], float],
        on_request: Callable[[], None],
    ) -> list[WarmupReport]:
        """Send each model's warm-up request until its latency settles (see `warmup.py`).

        Raises `grpc.aio.AioRpcError` if the replica fails during warm-up; the caller keeps it
        out of traffic.
        """
        reports = []
        for model in models:
            metadata = await self.stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(name=model), timeout=policy.request_timeout_s
            )
            request = warmup_request(metadata)
            latencies_s: list[float] = []
            while not latency_settled(latencies_s, policy):
                start_s = monotonic_s()
                await self.stub.ModelInfer(request, timeout=policy.request_timeout_s)
                latencies_s.append(monotonic_s() - start_s)
                on_request()
            settled = len(latencies_s) < policy.max_requests
            if not settled:
                _log.warning(
                    "replica_warmup_unsettled",
                    replica=self.name,
                    model=model,
                    requests=len(latencies_s),
                )
            reports.append(
                WarmupReport(
                    replica=self.name, model=model, latencies_s=tuple(latencies_s), settled=settled
                )
            )
        return reports

    async def close(self) -> None:
        await self._channel.close(grace=None)
