"""Node signatures: which nodes a placement policy would score alike, kept node by node.

Owns, per node of a `ClusterState`, a small integer id of everything a node's placement score
depends on: its hardware type (`ClusterState.type_id`: GPU model, CPU, memory, GPU count) and
its free CPU, free memory and free share of each GPU slot, in slot order (a shared request's
GPU choice is a slot index). Nodes with one id get the same score for any request, so a policy
that must rescore many nodes (`SeedancePolicy` after each refresh of its target workload)
scores one node of each id and copies: at 80 % fill of the 4,278-node fleet 958 ids cover the
nodes, on the ×4 fleet (17,112 nodes) 3,133, 3.3 times as many (``bench_scale_replay --profile``).

The ids are kept incrementally: a node is re-keyed only when its `version` moved since the
last `ids` (a placement changes one or two nodes), never by a pass over every row's values
(`np.unique` over the rows takes ~125 ms at 4,278 nodes, more than the rescans it saves).
Ids no node holds any more are reused, so they stay below the number of rows.

Per id it also keeps the nodes holding it (sorted: `rep` is the lowest, the one a tie goes
to) and a generation (`gen`) that moves each time the id is given to another signature, so a
policy can keep scores per id rather than per node (`SeedancePolicy`): an id whose generation
it scored still scores the same, whichever nodes hold it now.

It must not score, place, or change the state.
"""

from __future__ import annotations

import bisect
import struct

import numpy as np

from seedance.slicer.core.model import ClusterState

__all__ = ["NodeSignatures"]

# Up to this many changed rows are re-keyed one by one rather than as one block.
_FEW_ROWS = 8


class NodeSignatures:
    """Signature ids of a state's nodes (`ids`); equal ids mean equal scores."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        rows = state.capacity
        self._id = np.full(rows, -1, dtype=np.int64)
        self._seen = np.full(rows, -1, dtype=np.int64)
        self._tick = -1  # the state's `tick` at the last `_sync` (`ClusterState.stale_rows`)
        self._of: dict[bytes, int] = {}  # signature bytes -> id
        self._keys: list[bytes] = []  # id -> signature bytes (b"" while free)
        self._count: list[int] = []  # id -> nodes holding it
        self._free: list[int] = []  # ids no node holds
        self._members: list[list[int]] = []  # id -> the nodes holding it, sorted
        # id -> its lowest node (-1 while free), and its generation: numpy, so a policy reads
        # them for many ids at once. Sized in doublings; `bound` says how much is used.
        self._rep = np.full(64, -1, dtype=np.int64)
        self._gen = np.zeros(64, dtype=np.int64)
        self._live: np.ndarray | None = None  # the ids held, while none was freed or given

    @property
    def bound(self) -> int:
        """Every id is below this (for scratch arrays indexed by id)."""
        return len(self._keys)

    def __len__(self) -> int:
        """Distinct signatures held by the nodes now (as of the last `ids`)."""
        return len(self._of)

    def ids(self, rows: np.ndarray) -> np.ndarray:
        """The signature id of each node of `rows`, after re-keying the nodes that changed."""
        self._sync()
        found: np.ndarray = self._id[rows]
        return found

    def held(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """After re-keying the nodes that changed: (the ids some node holds, sorted; the
        lowest node holding each; each one's generation)."""
        self._sync()
        live = self._live
        if live is None:  # an id was freed or given out since: the held ids changed
            live = self._live = np.flatnonzero(self._rep[: self.bound] >= 0)
        return live, self._rep[live], self._gen[live]

    def count(self, sig: int) -> int:
        """How many nodes hold id `sig` (as of the last sync)."""
        return self._count[sig]

    def of_nodes(self) -> np.ndarray:
        """Every node's id, in node order (as of the last sync: a view, not to be kept)."""
        found: np.ndarray = self._id[: len(self.state)]
        return found

    def _sync(self) -> None:
        st = self.state
        n = len(st)
        if len(self._seen) < n:  # the state grew its rows: nodes added
            rows = st.capacity
            for name in ("_id", "_seen"):
                grown = np.full(rows, -1, dtype=np.int64)
                old = getattr(self, name)
                grown[: len(old)] = old
                setattr(self, name, grown)
        changed = st.stale_rows(self._seen, self._tick)
        self._tick = st.tick
        if changed.size == 0:
            return
        if changed.size <= _FEW_ROWS:
            # A placement's node or two: each row's bytes packed as the block below lays
            # them out (int64s in native order), without building a block for two rows.
            tid, cpu, mem, gpu, version = (
                st.type_id,
                st.cpu_free,
                st.mem_free,
                st.gpu_free,
                st.version,
            )
            for row in changed.tolist():
                head = struct.pack("=3q", tid[row], cpu[row], mem[row])
                self._rekey(row, head + gpu[row].tobytes())
                self._seen[row] = version[row]
            return
        sig = np.empty((changed.size, 3 + st.gpu_free.shape[1]), dtype=np.int64)
        sig[:, 0] = st.type_id[changed]
        sig[:, 1] = st.cpu_free[changed]
        sig[:, 2] = st.mem_free[changed]
        sig[:, 3:] = st.gpu_free[changed]
        raw, width = sig.tobytes(), sig.itemsize * sig.shape[1]
        for k, row in enumerate(changed.tolist()):
            self._rekey(row, raw[k * width : (k + 1) * width])
        self._seen[changed] = st.version[changed]

    def _rekey(self, row: int, key: bytes) -> None:
        """Node `row` now has signature `key`: move it to that signature's id."""
        ids, of, keys, count, members = self._id, self._of, self._keys, self._count, self._members
        old = int(ids[row])
        if old >= 0:
            if keys[old] == key:
                return
            count[old] -= 1
            held = members[old]
            del held[bisect.bisect_left(held, row)]
            self._rep[old] = held[0] if held else -1
            if count[old] == 0:  # no node holds it any more: forget it, reuse the id
                del of[keys[old]]
                keys[old] = b""
                self._free.append(old)
                self._live = None
        new = of.get(key)
        if new is None:
            if self._free:
                new = self._free.pop()
                keys[new] = key
                count[new] = 0
            else:
                new = len(keys)
                keys.append(key)
                count.append(0)
                members.append([])
                if new == len(self._rep):
                    self._grow_ids()
            self._gen[new] += 1  # another signature under this id: scores of it are stale
            self._live = None
            of[key] = new
        count[new] += 1
        bisect.insort(members[new], row)
        self._rep[new] = members[new][0]
        ids[row] = new

    def _grow_ids(self) -> None:
        rep = np.full(2 * len(self._rep), -1, dtype=np.int64)
        rep[: len(self._rep)] = self._rep
        gen = np.zeros(2 * len(self._gen), dtype=np.int64)
        gen[: len(self._gen)] = self._gen
        self._rep, self._gen = rep, gen

    def groups(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(one node of each signature among `rows`, per row of `rows` the position of its
        signature's node in the first array): scoring the first array and taking it at the
        second scores every row. A scatter over the ids, not a sort."""
        sig = self.ids(rows)
        some = np.full(self.bound, -1, dtype=np.int64)
        some[sig] = rows  # any node of each id will do: they score alike
        present = np.flatnonzero(some >= 0)
        slot = np.empty(self.bound, dtype=np.int64)
        slot[present] = np.arange(present.size)
        return some[present], slot[sig]
