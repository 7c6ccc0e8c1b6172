"""The fleet planner's state as entries of a `seedance.core.state_store.StateStore`, and back.

Owns the planner's whole state as one value (`PlanSnapshot`: each model's `PlanState` and
`EstimatorState`, the merge's `MergeState`, the stream sequence they reflect), how it maps onto
the store's entries (`PlanEntries`: what a commit holds, and the value a restore reads back),
and the key names in ``seedance-router-plan``. Must not read or write the bus (`plan_leader`
commits and loads the store) nor decide anything.

Why these entries. Nearly all of the state is raw arrivals: the estimators' last
`moments_window_s` (600 s) and the merge's pending ones, ~13 bytes each (8 MB at 1000 req/s);
the rest (plans, the estimators' scoring record, the merge's watermarks) is a few KB. Written
as one value, every plan rewrote the whole history, and it had to fit one NATS message, so
above ~130 req/s the oldest arrivals were cut and a handover forgot them. Here arrivals are
keyed by (planning bin, model): an arrival's bin never changes and a bin is complete once the
watermark has passed it, so a plan's commit writes the bins released since the last one (one
per interval when every gateway reports on time), deletes those the estimator let go, and
rewrites a bin only when arrivals were added to or dropped from it (a late gateway's report,
the window's edge). Keyed per model alone, each commit would again carry the whole window;
keyed per arrival, every key would outweigh its value. A bin is cut into chunks of
`CHUNK_ARRIVALS` so that one entry stays well under the store's record size at any rate. The
store keeps commits in a journal and writes a base of the whole map now and then
(`StateStore`), so a restore reads everything the planner held, whatever its size.

Entries (``<model>`` last: a model name is a subject token, which may hold ``/``):

* ``~seq``: (the stream sequence of the last report reflected, the watermark last planned at);
* ``~merge``: the merge's `MergeState` without its pending arrivals;
* ``p/<model>``: the model's `PlanState`;
* ``e/<model>``: its `EstimatorState` without the arrivals;
* ``a/<bin>/<chunk>/<model>``: the estimator's arrivals in planning bin ``<bin>`` (its start
  over `bin_s`, an integer), chunk ``<chunk>`` of it;
* ``q/<bin>/<chunk>/<model>``: the merge's pending arrivals, likewise.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import NamedTuple

import msgspec

from seedance.core.logs import get_logger
from seedance.router.core.planning.load import EstimatorState
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_observations import MergeState

__all__ = [
    "CHUNK_ARRIVALS",
    "STORE_COMPACT_RECORDS",
    "STORE_SLOTS",
    "ModelSnapshot",
    "PlanEntries",
    "PlanSnapshot",
    "counts_key",
    "legacy_key",
    "state_prefix",
]

log = get_logger(__name__)

#: Arrivals in one entry at most: ≤ 15 bytes each in msgpack, ~480 KB, half the store's 900 KiB
#: record even before deflate (a bin of one model at 2200 req/s and 15 s bins fills one).
CHUNK_ARRIVALS = 32_768

Arrivals = tuple[tuple[float, int], ...]


#: The store's journal: a base every `STORE_COMPACT_RECORDS` commits at most (sooner when the
#: journal holds as many bytes as the base), in `STORE_SLOTS` slots. The server keeps one record
#: a slot whether the base holds it or not, so the slots bound what it keeps beyond the state:
#: 1024 (the store's default, this planner's before) kept 28x a 0.8 MB state (review2). A commit
#: waits for the base only once `STORE_SLOTS` records are unbased: 64 plans after one is due
#: (16 min at the shipped 15 s), where a base takes well under a second (3.9 MB: 0.18 s).
STORE_COMPACT_RECORDS = 64
STORE_SLOTS = 128


def state_prefix(fleet: str) -> str:
    """The store's key prefix for `fleet` (its keys ``<fleet>.plan.head`` ...)."""
    return f"{fleet}.plan"


def counts_key(fleet: str) -> str:
    """The key holding each model's last committed count (`fleet_target`: what a gateway that
    does not plan follows; small, so that it need not read the store every interval)."""
    return f"{fleet}.replicas"


def legacy_key(fleet: str) -> str:
    """The one key older planners wrote the whole `PlanSnapshot` to (read once, to migrate)."""
    return fleet


class ModelSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    plan: PlanState
    estimator: EstimatorState


class PlanSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag="router.plan_snapshot.v1"):
    """The fleet planner's state, and the stream sequence of the last report it reflects (also
    the one-value form older planners wrote, `legacy_key`)."""

    seq: int
    # The time (`ObservationMerge.as_of_s`) the last plan was made as of (None: none yet).
    planned_s: float | None = None
    models: dict[str, ModelSnapshot] = msgspec.field(default_factory=dict)
    merge: MergeState = msgspec.field(default_factory=MergeState)


_enc = msgspec.msgpack.Encoder()
_seq_dec = msgspec.msgpack.Decoder(tuple[int, float | None])
_merge_dec = msgspec.msgpack.Decoder(MergeState)
_plan_dec = msgspec.msgpack.Decoder(PlanState)
_estimator_dec = msgspec.msgpack.Decoder(EstimatorState)
_arrivals_dec = msgspec.msgpack.Decoder(Arrivals)


class _Bin(NamedTuple):
    """A bin's arrivals as committed: how many, its first and last (the objects), its chunks."""

    n: int
    first: tuple[float, int]
    last: tuple[float, int]
    chunks: int


def _same(old: _Bin | None, new: _Bin) -> bool:
    return (
        old is not None
        and (old.n, old.chunks) == (new.n, new.chunks)
        and (old.first is new.first and old.last is new.last)
    )


class PlanEntries:
    """`PlanSnapshot` <-> the store's entries, with what was last committed: `changes` is a
    commit (what differs from it), `committed` says it is durable, `restore` reads a loaded
    store back (and makes it the committed view).

    Arrival bins are compared by their count and their first and last arrival as objects,
    never element by element: at 1000 req/s a pass that sliced or compared all 600,000 took
    ~40 ms of the event loop per plan, which slicing only the changed bins avoids. Exact
    because an arrival is one tuple from the report it was decoded from (or the store it was
    restored from), never changed in place, and both the estimator (its window's edge) and the
    merge (its watermark) drop arrivals only from the oldest end of a bin: a bin that lost any
    lost its first (held here, so no other object can be it), one that gained any without
    losing grew. Arrivals built afresh with equal values (a test) are written again: more
    bytes, never a change missed."""

    def __init__(self, bin_s: float) -> None:
        if bin_s <= 0:
            raise ValueError(f"bin_s must be > 0, got {bin_s}")
        self._bin_s = bin_s
        # What the store holds as of the last commit: the small entries' bytes, each arrival
        # bin's `_Bin` by (kind, model, bin), and the arrival entries' keys.
        self._small: dict[str, bytes] = {}
        self._bins: dict[tuple[str, str, int], _Bin] = {}
        self._keys: set[str] = set()
        self._staged: tuple[dict[str, bytes], dict[tuple[str, str, int], _Bin], set[str]] | None
        self._staged = None

    # -- writing ---------------------------------------------------------------------------
    def changes(self, snapshot: PlanSnapshot) -> dict[str, bytes | None]:
        """The entries that differ from the last committed (None: deleted); `committed` once
        they are durable (until then the next call diffs against the older view again)."""
        merge = snapshot.merge
        small = {
            "~seq": _enc.encode((snapshot.seq, snapshot.planned_s)),
            "~merge": _enc.encode(replace(merge, pending=())),
        }
        sources: list[tuple[str, str, Arrivals]] = []
        for model, m in snapshot.models.items():
            small[f"p/{model}"] = _enc.encode(m.plan)
            small[f"e/{model}"] = _enc.encode(replace(m.estimator, arrivals=()))
            sources.append(("a", model, m.estimator.arrivals))
        sources += [("q", model, tuple(sorted(pending))) for model, pending in merge.pending]
        out: dict[str, bytes | None] = {k: v for k, v in small.items() if self._small.get(k) != v}
        out.update(dict.fromkeys(self._small.keys() - small.keys()))
        bins: dict[tuple[str, str, int], _Bin] = {}
        keys: set[str] = set()
        for kind, model, arrivals in sources:
            for b, start, end in self._spans(arrivals):
                new = _Bin(end - start, arrivals[start], arrivals[end - 1],
                           -(-(end - start) // CHUNK_ARRIVALS))  # fmt: skip
                bins[(kind, model, b)] = new
                names = [f"{kind}/{b}/{c}/{model}" for c in range(new.chunks)]
                keys.update(names)
                if _same(self._bins.get((kind, model, b)), new):
                    continue
                for c, name in enumerate(names):
                    part = start + c * CHUNK_ARRIVALS
                    out[name] = _enc.encode(arrivals[part : min(end, part + CHUNK_ARRIVALS)])
        out.update(dict.fromkeys(self._keys - keys))
        self._staged = (small, bins, keys)
        return out

    def committed(self) -> None:
        """The last `changes` are durable: the next diff starts from them."""
        if self._staged is not None:
            self._small, self._bins, self._keys = self._staged
            self._staged = None

    def entries(self, snapshot: PlanSnapshot) -> dict[str, bytes]:
        """Every entry of `snapshot` (a store's first base: a migrated one-value snapshot)."""
        self._small, self._bins, self._keys = {}, {}, set()
        return {k: v for k, v in self.changes(snapshot).items() if v is not None}

    def _spans(self, arrivals: Arrivals) -> Iterable[tuple[int, int, int]]:
        """(bin, start, end) of `arrivals` (in time order) per planning bin: one bisection
        per bin, no pass over the arrivals."""
        bin_s = self._bin_s

        def bin_of(a: tuple[float, int]) -> int:
            return math.floor(a[0] / bin_s)

        i = 0
        while i < len(arrivals):
            b = bin_of(arrivals[i])
            end = bisect_left(arrivals, b + 1, lo=i, key=bin_of)
            yield b, i, end
            i = end

    # -- reading ---------------------------------------------------------------------------
    def restore(self, entries: Mapping[str, bytes]) -> PlanSnapshot | None:
        """The snapshot the store's `entries` hold (None: none, or one this version cannot
        read: logged, and the next commit overwrites it); they become the committed view."""
        self._staged = None
        self._small = {k: v for k, v in entries.items() if not k.startswith(("a/", "q/"))}
        self._bins = {}  # every bin written afresh, unless read below
        self._keys = {k for k in entries if k.startswith(("a/", "q/"))}
        if not entries:
            return None
        try:
            snapshot, self._bins = self._decoded(entries)
        except (msgspec.DecodeError, ValueError, KeyError) as exc:  # another version's
            log.warning("plan_state_unreadable", error=str(exc))
            return None
        return snapshot

    def _decoded(
        self, entries: Mapping[str, bytes]
    ) -> tuple[PlanSnapshot, dict[tuple[str, str, int], _Bin]]:
        seq, planned_s = _seq_dec.decode(entries["~seq"])
        merge = _merge_dec.decode(entries["~merge"])
        plans: dict[str, PlanState] = {}
        estimators: dict[str, EstimatorState] = {}
        # (kind, model) -> {bin: {chunk: arrivals}}
        parts: dict[tuple[str, str], dict[int, dict[int, Arrivals]]] = {}
        for key, value in entries.items():
            kind, _, rest = key.partition("/")
            if kind == "p":
                plans[rest] = _plan_dec.decode(value)
            elif kind == "e":
                estimators[rest] = _estimator_dec.decode(value)
            elif kind in ("a", "q"):
                b, c, model = rest.split("/", 2)
                chunks = parts.setdefault((kind, model), {}).setdefault(int(b), {})
                chunks[int(c)] = _arrivals_dec.decode(value)
            elif kind not in ("~seq", "~merge"):
                raise ValueError(f"entry {key!r} is not a planner entry this version knows")
        if plans.keys() != estimators.keys():
            raise ValueError(f"plans for {sorted(plans)}, estimators for {sorted(estimators)}")
        joined, bins = _joined(parts)
        models = {
            m: ModelSnapshot(
                plan=plans[m], estimator=replace(estimators[m], arrivals=joined.get(("a", m), ()))
            )
            for m in sorted(plans)
        }
        pending = tuple((m, a) for (kind, m), a in sorted(joined.items()) if kind == "q")
        snapshot = PlanSnapshot(
            seq=seq, planned_s=planned_s, models=models, merge=replace(merge, pending=pending)
        )
        return snapshot, bins


def _joined(
    parts: Mapping[tuple[str, str], Mapping[int, Mapping[int, Arrivals]]],
) -> tuple[dict[tuple[str, str], Arrivals], dict[tuple[str, str, int], _Bin]]:
    """Each (kind, model)'s arrivals from its bins' chunks in order, and each bin's `_Bin`."""
    bins: dict[tuple[str, str, int], _Bin] = {}
    joined: dict[tuple[str, str], Arrivals] = {}
    for (kind, model), by_bin in parts.items():
        out: list[tuple[float, int]] = []
        for b, chunks in sorted(by_bin.items()):
            if sorted(chunks) != list(range(len(chunks))):
                raise ValueError(f"{kind}/{b}/*/{model} has chunks {sorted(chunks)}")
            arrivals = [a for c in range(len(chunks)) for a in chunks[c]]
            if arrivals:  # the same objects the estimator gets: compared by identity
                bins[(kind, model, b)] = _Bin(len(arrivals), arrivals[0], arrivals[-1],
                                              len(chunks))  # fmt: skip
            out += arrivals
        joined[(kind, model)] = tuple(out)
    return joined, bins
