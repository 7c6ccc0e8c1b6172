"""The slicer's state as entries: a small value per node, job and ended key, written as it changes.

Owns the keyed form of `SchedulerSnapshot` (version 3 of the state's format): the state split
into entries (`str -> bytes`, msgpack), so that a batch writes only the entries it changed
(`seedance.core.state_store` keeps them), and the two conversions: `entries_of` (a whole
snapshot, for a first base or a migrated older state) and `snapshot_of` (entries back to the
one plain value `Scheduler.restore` reads). `SchedulerState.state_changes` produces the entries
one batch changed. This module must not decide anything.

Keys (a job key holds a `/`, a node name does not; both are free text inside an entry key):

* `g`: `Globals` (sequence counters, the workload refresh counter); every batch that submits.
* `n/<node>`: `NodeEntry` (its stable index, `NodeSpec`, and the span of the last allocation
  released on each of its GPUs); when the node is added or re-described, or a GPU of it freed.
* `j/<tenant>/<job>`: `JobEntry` (the request, attempts, submit time, queue record); when the
  job is submitted, placed, evicted, re-reasoned, reserved for, or ends (deleted).
* `e/<tenant>/<job>`: its ordinal among ended jobs; when it ends (deleted when forgotten).
* `w/<ordinal>`: one `RequestShape` of the workload window; when a submit adds it (deleted
  when it leaves the window).
* `shapes`: the shapes the policy was built from; when the policy is refreshed.
* `unhealthy`, `paused`, `held`, `mig`, `mig_queue`: the whole (small) collection; when it
  changes.

The last row is written whole: unhealthy GPUs, paused tenants, jobs held for quota or a pause,
MIG instances and MIG jobs waiting are few next to the running jobs, and their order is part
of the state (a held job's place, the instance list MIG placement searches first to last).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from seedance.slicer.core.inputs import JobSpec, NodeSpec
from seedance.slicer.core.snapshot import (
    STATE_VERSION,
    HeldJob,
    MigSlot,
    MovesRecord,
    PendingJob,
    RequestShape,
    RunningJob,
    SchedulerSnapshot,
)

__all__ = [
    "ENTRIES_VERSION",
    "Globals",
    "JobEntry",
    "NodeEntry",
    "encode_entry",
    "entries_of",
    "snapshot_of",
]

#: The format of the entries (the snapshot's own is `STATE_VERSION`; 3 is the first keyed one).
ENTRIES_VERSION = 3


class Globals(msgspec.Struct, frozen=True, kw_only=True):
    version: int = ENTRIES_VERSION
    #: The placement queue's last arrival number.
    seq: int = 0
    since_refresh: int = 0
    #: Ordinals handed out so far: the next window shape's and the next ended job's.
    window_next: int = 0
    ended_next: int = 0


class NodeEntry(msgspec.Struct, frozen=True, array_like=True):
    index: int
    spec: NodeSpec
    #: (GPU, start, end) of the last allocation released on each of its GPUs, by GPU (absent
    #: in entries written before it was kept).
    released: tuple[tuple[int, float, float], ...] = ()
    #: (GPU, end, thousandths) of the latest releases on its GPUs (absent in entries written
    #: before they were kept: `SchedulerState.freed_after`).
    freed: tuple[tuple[int, float, int], ...] = ()


class JobEntry(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Everything the state keeps per job, but its place among held and MIG-waiting jobs."""

    spec: JobSpec
    attempts: int = 0
    submitted_s: float | None = None
    running: RunningJob | None = None
    pending: PendingJob | None = None
    #: The latest decision published about the job (absent in entries written before).
    published_s: float | None = None


_enc = msgspec.msgpack.Encoder()
_DECODERS: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "g": msgspec.msgpack.Decoder(Globals),
    "n": msgspec.msgpack.Decoder(NodeEntry),
    "j": msgspec.msgpack.Decoder(JobEntry),
    "e": msgspec.msgpack.Decoder(int),
    "w": msgspec.msgpack.Decoder(RequestShape),
    "shapes": msgspec.msgpack.Decoder(tuple[RequestShape, ...]),
    "unhealthy": msgspec.msgpack.Decoder(tuple[tuple[str, int], ...]),
    "paused": msgspec.msgpack.Decoder(tuple[str, ...]),
    "held": msgspec.msgpack.Decoder(tuple[HeldJob, ...]),
    "mig": msgspec.msgpack.Decoder(tuple[MigSlot, ...]),
    "mig_queue": msgspec.msgpack.Decoder(tuple[HeldJob, ...]),
    "moves": msgspec.msgpack.Decoder(MovesRecord),
}


def encode_entry(value: object) -> bytes:
    return _enc.encode(value)


def entries_of(snap: SchedulerSnapshot) -> dict[str, bytes]:
    """Every entry of `snap` (a version-2 snapshot: `decode_snapshot` lifts older ones)."""
    e = encode_entry
    running = {r.job_id: r for r in snap.running}
    pending = {p.job_id: p for p in snap.pending}
    out = {
        "g": e(
            Globals(
                seq=snap.seq,
                since_refresh=snap.since_refresh,
                window_next=_next(snap.window_next, snap.window),
                ended_next=_next(snap.ended_next, snap.ended),
            )
        ),
        "shapes": e(snap.policy_shapes),
        "unhealthy": e(snap.unhealthy),
        "paused": e(snap.paused),
        "held": e(snap.held),
        "mig": e(snap.mig),
        "mig_queue": e(snap.mig_queue),
        "moves": e(snap.moves),
    }
    released: dict[str, list[tuple[int, float, float]]] = {}
    for name, gpu, start, end in snap.released:
        released.setdefault(name, []).append((gpu, start, end))
    freed: dict[str, list[tuple[int, float, int]]] = {}
    for name, gpu, end, milli in snap.freed:
        freed.setdefault(name, []).append((gpu, end, milli))
    out.update(
        (
            f"n/{n.name}",
            e(
                NodeEntry(
                    i, n, tuple(sorted(released.get(n.name, ()))), tuple(freed.get(n.name, ()))
                )
            ),
        )
        for i, n in enumerate(snap.nodes)
    )
    for key, spec in snap.jobs.items():
        out[f"j/{key}"] = e(
            JobEntry(
                spec=spec,
                attempts=snap.attempts.get(key, 0),
                submitted_s=snap.submitted_s.get(key),
                running=running.get(key),
                pending=pending.get(key),
                published_s=snap.published_s.get(key),
            )
        )
    first_ended = _next(snap.ended_next, snap.ended) - len(snap.ended)
    out.update((f"e/{k}", e(first_ended + i)) for i, k in enumerate(snap.ended))
    first_shape = _next(snap.window_next, snap.window) - len(snap.window)
    out.update((f"w/{first_shape + i}", e(s)) for i, s in enumerate(snap.window))
    return out


def _next(count: int, items: tuple[Any, ...]) -> int:
    """The ordinal of the next item: a snapshot older than the counter starts at its length."""
    return max(count, len(items))


def snapshot_of(entries: Mapping[str, bytes]) -> SchedulerSnapshot:
    """The snapshot the entries hold (raises ValueError on a key or format it does not know)."""
    g = Globals()
    nodes: list[NodeEntry] = []
    jobs: dict[str, JobEntry] = {}
    ended: list[tuple[int, str]] = []
    window: list[tuple[int, RequestShape]] = []
    whole: dict[str, Any] = {}
    for key, data in entries.items():
        kind, _, rest = key.partition("/")
        dec = _DECODERS.get(kind)
        if dec is None:
            raise ValueError(f"slicer state entry {key!r}: unknown kind {kind!r}")
        value = dec.decode(data)
        if kind == "g":
            g = value
        elif kind == "n":
            nodes.append(value)
        elif kind == "j":
            jobs[rest] = value
        elif kind == "e":
            ended.append((value, rest))
        elif kind == "w":
            window.append((int(rest), value))
        else:
            whole[kind] = value
    waiting = [
        ((-j.spec.priority, j.pending.submitted_s, j.pending.seq), j.pending)
        for j in jobs.values()
        if j.pending is not None
    ]
    if g.version != ENTRIES_VERSION:
        raise ValueError(f"slicer state entries version {g.version}, this slicer reads 3")
    nodes.sort(key=lambda n: n.index)
    if [n.index for n in nodes] != list(range(len(nodes))):
        raise ValueError("slicer state entries: node indices are not 0..n-1")
    return SchedulerSnapshot(
        version=STATE_VERSION,
        nodes=tuple(n.spec for n in nodes),
        jobs={k: j.spec for k, j in jobs.items()},
        attempts={k: j.attempts for k, j in jobs.items() if j.attempts},
        submitted_s={k: j.submitted_s for k, j in jobs.items() if j.submitted_s is not None},
        published_s={k: j.published_s for k, j in jobs.items() if j.published_s is not None},
        running=tuple(sorted((j.running for j in jobs.values() if j.running), key=_seq)),
        # In queue order, as `Scheduler.snapshot` lists them: priority, then arrival.
        pending=tuple(p for _, p in sorted(waiting, key=lambda x: x[0])),
        seq=g.seq,
        since_refresh=g.since_refresh,
        window=tuple(s for _, s in sorted(window, key=lambda x: x[0])),
        ended=tuple(k for _, k in sorted(ended)),
        window_next=g.window_next,
        ended_next=g.ended_next,
        policy_shapes=whole.get("shapes", ()),
        unhealthy=whole.get("unhealthy", ()),
        paused=whole.get("paused", ()),
        held=whole.get("held", ()),
        mig=whole.get("mig", ()),
        mig_queue=whole.get("mig_queue", ()),
        moves=whole.get("moves", MovesRecord()),
        released=tuple((n.spec.name, g, a, b) for n in nodes for g, a, b in n.released),
        freed=tuple((n.spec.name, g, end, m) for n in nodes for g, end, m in n.freed),
    )


def _seq(r: RunningJob) -> int:
    return r.seq
