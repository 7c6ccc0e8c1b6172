"""Which nodes a job blocked too long reserves, and which nodes a job may be placed on.

Owns, for `seedance.slicer.core.queue.PlacementQueue`, the reservations of its nodes
(`Reservations`: each node's holder, the job's arrival sequence, and how many nodes are held)
and the nodes closed to new work (cordoned, held empty), so it answers where one waiting job
may go. The choice of nodes to reserve (`nodes_to_reserve`): those that could host one replica
when empty and have the most of its resources free now (they drain soonest), the smallest such
nodes first (big nodes stay for big jobs). It must not decide when a job is reserved for or
released: the queue says (a job blocked for its `reserve_after_s`, a job that leaves).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seedance.slicer.core.model import ClusterState, PodRequest

__all__ = ["Reservations", "nodes_to_reserve"]


class Reservations:
    """The reservations on the nodes of `state` (rows follow it as nodes are added)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        # The seq of each node's reservation holder (-1: none); rows to the state's capacity.
        self._buf = np.full(state.capacity, -1, dtype=np.int64)
        #: How many nodes are reserved (the holders >= 0), kept as they are held and dropped:
        #: every placement reads it, so it is never counted by a pass over the fleet.
        self.count = 0
        #: Nodes nothing new may land on, a CPU-only job either (`PlacementQueue.set_masked`).
        self.closed: frozenset[int] = frozenset()

    @property
    def holders(self) -> np.ndarray:
        """The seq of each node's reservation holder (-1: none), a view of the buffer."""
        return self._buf[: len(self._state)]

    def grow(self) -> None:
        """Rows for the nodes added to the state since (none reserved)."""
        if len(self._buf) < len(self._state):
            grown = np.full(self._state.capacity, -1, dtype=np.int64)
            grown[: len(self._buf)] = self._buf
            self._buf = grown

    def hold(self, nodes: Sequence[int], seq: int) -> None:
        """Nodes `nodes` (none held) are reserved for the job of arrival `seq`."""
        self._buf[list(nodes)] = seq
        self.count += len(nodes)

    def drop(self, nodes: Sequence[int]) -> None:
        """The reservations on `nodes` end (their job left the queue)."""
        self._buf[list(nodes)] = -1
        self.count -= len(nodes)

    def reserve(self, pod: PodRequest, seq: int, need: int, limit: int) -> list[int]:
        """Reserve `need` nodes for `pod`'s job (arrival `seq`) unless that takes more than
        `limit` in all or fewer could ever host it; the nodes (none: not reserved)."""
        if self.count + need > limit:
            return []
        chosen = nodes_to_reserve(self._state, self.holders, pod, need)
        if chosen is None:
            return []
        nodes = [int(n) for n in chosen]
        self.hold(nodes, seq)
        return nodes

    def allowed_for(self, seq: int) -> np.ndarray | None:
        """The nodes the job of arrival `seq` may be placed on (None: every node): neither
        closed nor reserved for another job."""
        closed = [n for n in self.closed if n < len(self._state)]
        if not self.count:
            if not closed:
                return None
            allowed: np.ndarray = np.ones(len(self._state), dtype=bool)
        else:
            holders = self.holders
            allowed = (holders < 0) | (holders == seq)
        allowed[closed] = False
        return allowed


def nodes_to_reserve(
    state: ClusterState, reserved_by: np.ndarray, pod: PodRequest, need: int
) -> np.ndarray | None:
    """`need` unreserved nodes (indices) for `pod`, or None when fewer could ever host it."""
    st = state
    ok = (reserved_by < 0) & (st.cpu_cap >= pod.cpu_milli)
    ok &= (st.mem_cap >= pod.memory_mib) & (st.gpu_count >= pod.num_gpu)
    if pod.gpu_models:
        ok &= st.model_mask(pod.gpu_models)
    cand = np.flatnonzero(ok)
    if cand.size < need:
        return None
    gpu_room = (st.gpu_free[cand] >= max(pod.gpu_milli, 1)).sum(axis=1) / max(pod.num_gpu, 1)
    room = np.minimum(gpu_room, st.cpu_free[cand] / max(pod.cpu_milli, 1))
    # Prefer the smallest node that can host it (keep big nodes for big jobs), then room.
    order = np.lexsort((-room, st.gpu_count[cand]))
    chosen: np.ndarray = cand[order[:need]]
    return chosen
