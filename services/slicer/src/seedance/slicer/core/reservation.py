"""Which nodes a job blocked too long reserves: the placement queue's anti-starvation choice.

Owns the choice of nodes for `seedance.slicer.core.queue.PlacementQueue`'s reservations: those
that could host one replica when empty and have the most of its resources free now (they drain
soonest), the smallest such nodes first (big nodes stay for big jobs). It must not reserve
anything itself: the queue records the choice and releases it when the job leaves.
"""

from __future__ import annotations

import numpy as np

from seedance.slicer.core.model import ClusterState, PodRequest

__all__ = ["nodes_to_reserve"]


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
