"""A seeded fleet in virtual time for the chaos runs, the benchmarks and the integration tests.

Nodes (T4, V100M32, A100) join with their inventory and every node reports a sample batch
(activity and a cumulative energy counter) every ``tick_s`` of virtual time. Two kinds of jobs
run on it:

- ``workload``: the ledger's inputs. Jobs are placed whole, shared or on a MIG instance and are
  released (the slicer's ``JobReleased`` on ``seedance.slicing.<t>.released``: the ledger bills
  trusted facts only, never a tenant's own job event);
- ``tenant_workload``: the slicer's inputs. The tenants' jobs arrive and finish as a trusted
  replayer observed them (``seedance.observed.<t>.submitted`` / ``finished``, the only job
  subjects whose ``at`` is honoured), and the slicer decides where they run.

The virtual time starts at ``START``, in the past: no input is ahead of the server's clock (the
ledger dead-letters one that leads its stream timestamp by more than ``max_ahead_s``). Events
come out in virtual-time order, with the subject each is published on. Deterministic for a seed;
no wall clock.

Also the waits a driver of the ledger needs (the merged input stream read in order, the
replicas' shared checkpoint caught up). It builds wire events only and must not import a
service: the audit against the ledger's core lives in ``seedance.bench.ledger_audit``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from seedance.events import Event, derived_event_id
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.slicing import EndOutcome, GpuAssignment, JobReleased, Placement, PlacementKind
from seedance.events.subjects import observed, slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory

__all__ = [
    "START",
    "Workload",
    "checkpoint_seq",
    "read_stream",
    "tenant_workload",
    "wait_checkpointed",
    "workload",
]

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
_MODELS = (("T4", 4, 16_384), ("V100M32", 4, 32_768), ("A100", 4, 40_960))
_TENANTS = ("acme", "globex", "initech")
#: (model, GPUs, GPU memory in MiB) of each node, in turn.
NodeModels = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Workload:
    events: list[tuple[str, Event]]
    tenants: tuple[str, ...]
    end: datetime


def _id(seed: int, *parts: object) -> str:
    # A UUIDv7-shaped id determined by the seed and the parts (time bits 0: replays re-use ids).
    return derived_event_id(f"{seed}:" + ":".join(map(str, parts)), "workload")


def _shape(
    rng: random.Random, model: str, free: list[int]
) -> tuple[PlacementKind, list[GpuAssignment]]:
    """A MIG instance (A100s only), a shared slice, or whole GPUs on the ``free`` ones."""
    shape = rng.random()
    if model == "A100" and shape < 0.3:
        return PlacementKind.MIG, [GpuAssignment(index=free[0], mig_profile="3g.40gb")]
    if shape < 0.5:
        return PlacementKind.SHARED, [GpuAssignment(index=free[0], milli=500)]
    n = min(len(free), rng.choice((1, 2, 4)))
    return PlacementKind.WHOLE, [GpuAssignment(index=g) for g in free[:n]]


def _sample(
    rng: random.Random,
    busy: dict[tuple[str, int], float],
    energy: dict[tuple[str, int], float],
    node: str,
    g: int,
    tick_s: int,
) -> GpuSample:
    """GPU ``g``'s sample for one tick: the activity of what runs there, the energy it adds."""
    act = busy.get((node, g), 0.0) * rng.uniform(0.8, 1.0)
    energy[(node, g)] += (60 + 240 * act) * tick_s
    return GpuSample(
        index=g,
        sm_active=round(act, 4) if g % 2 == 0 else None,
        util_gpu_pct=round(min(100.0, act * 110), 1),
        energy_j=round(energy[(node, g)], 1),
    )


def _inventory(
    seed: int,
    node: str,
    model: str,
    count: int,
    mem: int,
    *,
    cpu_milli: int = 64_000,
    memory_mib: int = 512_000,
) -> NodeInventory:
    return NodeInventory(
        id=_id(seed, "inv", node),
        at=START,
        node=node,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=[GpuInfo(index=g, model=model, mem_total_mib=mem) for g in range(count)],
    )


def workload(
    events: int = 12_000, *, nodes: int = 30, tick_s: int = 60, seed: int = 7, prefix: str = "n"
) -> Workload:
    """At least ``events`` events: mostly sample batches, one placement and one release per job."""
    rng = random.Random(seed)
    spec = [(f"{prefix}{i:03d}", *_MODELS[i % len(_MODELS)]) for i in range(nodes)]
    out: list[tuple[datetime, int, str, Event]] = []
    order = 0

    def add(at: datetime, subject: str, ev: Event) -> None:
        nonlocal order
        out.append((at, order, subject, ev))
        order += 1

    for node, model, count, mem in spec:
        add(START, telemetry.inventory(node), _inventory(seed, node, model, count, mem))
    # Each tick: every node samples; jobs arrive and are released so that ~1/6 of events are
    # job facts.
    ticks = max(1, round(events * 0.93 / nodes))
    busy: dict[tuple[str, int], float] = {}  # (node, gpu) -> activity of what runs there
    running: list[tuple[datetime, str, str, list[tuple[str, int]]]] = []
    energy = {(n, g): 0.0 for n, _, c, _ in spec for g in range(c)}
    job_n = 0
    for t in range(ticks):
        at = START + timedelta(seconds=t * tick_s)
        # releases first
        for _end, tenant, job, held in [r for r in running if r[0] <= at]:
            released = JobReleased(
                id=_id(seed, "end", job),
                at=at,
                job_id=job,
                tenant=tenant,
                outcome=EndOutcome.FINISHED,
            )
            add(at, slicing.subject(tenant, "released"), released)
            for key in held:
                busy.pop(key, None)
        running = [r for r in running if r[0] > at]
        for _ in range(rng.choice((0, 1, 1, 2, 3, 5)) if t else 0):
            node, model, count, _mem = spec[rng.randrange(nodes)]
            free = [g for g in range(count) if (node, g) not in busy]
            if not free:
                continue
            tenant = rng.choice(_TENANTS)
            job = f"job-{job_n}"
            job_n += 1
            kind, gpus = _shape(rng, model, free)
            add(
                at,
                slicing.subject(tenant, "placement"),
                Placement(
                    id=_id(seed, "place", job), at=at, job_id=job, tenant=tenant, node=node,
                    gpu_model=model, kind=kind, gpus=gpus,
                ),
            )  # fmt: skip
            for assigned in gpus:
                busy[(node, assigned.index)] = rng.uniform(0.2, 0.95)
            duration = timedelta(seconds=tick_s * rng.randint(3, 90))
            running.append((at + duration, tenant, job, [(node, a.index) for a in gpus]))
        for node, _model, count, _mem in spec:
            samples = [_sample(rng, busy, energy, node, g, tick_s) for g in range(count)]
            batch = GpuSampleBatch(id=_id(seed, "s", node, t), at=at, node=node, gpus=samples)
            add(at, telemetry.sample(node), batch)
    out.sort(key=lambda x: (x[0], x[1]))
    end = START + timedelta(seconds=ticks * tick_s)
    return Workload([(s, e) for _, _, s, e in out], _TENANTS, end)


def _tenant_request(rng: random.Random) -> ResourceRequest:
    """A shared slice, one or two A100s, or any one GPU."""
    shape = rng.random()
    if shape < 0.4:
        return ResourceRequest(gpus=1, gpu_milli=500)
    if shape < 0.7:
        return ResourceRequest(gpus=rng.choice((1, 1, 2)), gpu_models=["A100"])
    return ResourceRequest(gpus=1)


def _tenant_jobs(
    rng: random.Random, jobs: int, *, seed: int, tick_s: int, tenants: tuple[str, ...]
) -> list[tuple[datetime, int, str, Event]]:
    """Job ``j`` arrives about every second tick and lasts 3 to 40 ticks (order ``2j``/``2j+1``
    after the samples of the same instant)."""
    out: list[tuple[datetime, int, str, Event]] = []
    for j in range(jobs):
        tenant, job = tenants[j % len(tenants)], f"job-{j}"
        arrive = START + timedelta(seconds=tick_s * (1 + j * 2 + rng.randrange(2)))
        lasts = timedelta(seconds=tick_s * rng.randint(3, 40))
        submitted = JobSubmitted(
            id=_id(seed, "sub", job), at=arrive, job_id=job, tenant=tenant,
            request=_tenant_request(rng), expected_duration_s=lasts.total_seconds(),
        )  # fmt: skip
        end = arrive + lasts
        finished = JobFinished(id=_id(seed, "fin", job), at=end, job_id=job, tenant=tenant)
        out.append((arrive, 2 * j, observed.subject(tenant, "submitted"), submitted))
        out.append((end, 2 * j + 1, observed.subject(tenant, "finished"), finished))
    return out


def tenant_workload(
    jobs: int,
    *,
    nodes: int,
    seed: int,
    tick_s: int = 60,
    tenants: tuple[str, ...] = _TENANTS,
    models: NodeModels = _MODELS,
    cpu_milli: int = 64_000,
    memory_mib: int = 512_000,
) -> Workload:
    """``jobs`` tenants' jobs as a replayer observed them, on ``nodes`` nodes that sample every
    ``tick_s`` until two ticks after the last job ends.

    The replayer does not know where the slicer puts a job, so every GPU reports the fleet's
    mean activity (the ledger attributes by placement, not by sample). A driver that wants a
    placement to depend only on the order of the events sizes the fleet so that jobs never wait
    (``models``, ``cpu_milli`` and ``memory_mib`` are the node shapes).
    """
    rng = random.Random(seed)
    spec = [(f"node-{i:02d}", *models[i % len(models)]) for i in range(nodes)]
    timed = _tenant_jobs(rng, jobs, seed=seed, tick_s=tick_s, tenants=tenants)
    end = max((t for t, *_ in timed), default=START) + timedelta(seconds=2 * tick_s)
    inventory: list[tuple[str, Event]] = [
        (
            telemetry.inventory(n),
            _inventory(seed, n, model, c, mem, cpu_milli=cpu_milli, memory_mib=memory_mib),
        )
        for n, model, c, mem in spec
    ]
    busy = {(n, g): 0.5 for n, _, c, _ in spec for g in range(c)}
    energy = dict.fromkeys(busy, 0.0)
    for k in range(int((end - START).total_seconds() // tick_s) + 1):
        at = START + timedelta(seconds=k * tick_s)
        for n, _model, count, _mem in spec:
            samples = [_sample(rng, busy, energy, n, g, tick_s) for g in range(count)]
            batch = GpuSampleBatch(id=_id(seed, "s", n, k), at=at, node=n, gpus=samples)
            timed.append((at, -1, telemetry.sample(n), batch))
    timed.sort(key=lambda x: (x[0], x[1]))
    return Workload(inventory + [(s, e) for _, _, s, e in timed], tenants, end)


async def read_stream(
    bus: Any, stream: str, timeout_s: float = 60.0, *, subject: str = ">"
) -> list[Any]:
    """Every message of ``stream`` on ``subject`` (a filter; default all) that the stream holds
    when called, in order, through one ordered consumer.

    It reads until it has as many as the stream counted, never until a quiet gap: a consumer
    that stalls for a moment on a loaded machine would end such a read early, and the caller
    would see part of the stream. An ordered consumer that resets (a leader change) can hand a
    message out twice: kept once.
    """
    import asyncio

    info = await bus.js.stream_info(stream, subjects_filter=None if subject == ">" else subject)
    total = info.state.messages if subject == ">" else sum((info.state.subjects or {}).values())
    if not total:
        return []
    out: list[Any] = []
    sub = await bus.js.subscribe(subject, stream=stream, ordered_consumer=True)
    bound = asyncio.timeout(timeout_s)
    try:
        async with bound:
            while len(out) < total:
                msg = await sub.next_msg(timeout=None)  # bounded by timeout_s
                if out and msg.metadata.sequence.stream <= out[-1].metadata.sequence.stream:
                    continue
                out.append(msg)
        return out
    except TimeoutError:
        if not bound.expired():
            raise
        raise TimeoutError(
            f"read {len(out)} of the {total} messages of {stream} on {subject} in {timeout_s} s"
        ) from None
    finally:
        await sub.unsubscribe()


async def checkpoint_seq(bus: Any, state_key: str) -> int:
    """The input sequence of the ledger replicas' shared checkpoint (0: none yet)."""
    import msgspec
    from nats.js.errors import KeyNotFoundError

    kv = await bus.js.key_value("seedance-ledger")
    try:
        entry = await kv.get(f"checkpoint.{state_key}")
    except KeyNotFoundError:
        return 0
    return int(msgspec.msgpack.decode(entry.value)[0]) if entry.value else 0


async def wait_checkpointed(bus: Any, state_key: str, sent: int, timeout_s: float) -> int:
    """Until the merged input stream holds the ``sent`` events and the replicas' shared
    checkpoint is at its last sequence; returns that sequence.

    After a node kill the server can resume sourcing a stream into the merged one many seconds
    later: a merged stream that merely stopped growing for a moment is not yet complete.
    """
    import asyncio
    import contextlib
    import time

    from seedance.core import TRANSIENT_BUS_ERRORS

    deadline = time.monotonic() + timeout_s
    last, seq, held = -1, 0, 0
    while time.monotonic() < deadline:
        info = await bus.js.stream_info("SEEDANCE_LEDGER_IN")
        with contextlib.suppress(*TRANSIENT_BUS_ERRORS):  # a KV fail-over: ask again
            seq = await checkpoint_seq(bus, state_key)
        held = info.state.messages
        if held >= sent and info.state.last_seq == last and seq >= last:
            return last
        last = info.state.last_seq
        await asyncio.sleep(0.5)  # replicas checkpoint every second; bounded by the deadline
    raise TimeoutError(
        f"ledger replicas did not catch up in {timeout_s} s (checkpoint {seq}/{last}, "
        f"merged stream {held}/{sent} events)"
    )
