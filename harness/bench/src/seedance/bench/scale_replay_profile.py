"""The scheduler-alone replay's ``--profile``: what the rescans, the fragmentation index and the
tie-break cost on the replay's filled fleet, each beside its anchor measured in the same run.

Owns these timings of `seedance.slicer.core.policies.SeedancePolicy`'s parts on the state
`seedance.bench.scale_replay` built (docs/slicer.md quotes them):

* ``signatures``: the distinct node signatures (`core.signatures`) among the nodes;
* ``rescan``: per request shape the policy has cached, scoring every node (the anchor) against
  grouping the nodes by signature plus scoring one node per signature (mean per shape);
* ``tiebreak``: BestFit's score of every node as tied, the GPU totals summed over each node's
  GPUs (the anchor) against read off the synced index;
* ``refresh_index``: at each refresh of the target workload during the pairs, the new
  workload's index built from scratch (the anchor), borrowing the replaced index's columns
  without signatures, and with them (the policy's way); mean over the refreshes.

Each figure is the best of `REPEATS` timings (the machine is shared). It must not change what
the scheduler decides: it reads the policy and the state and builds throw-away indexes (the
replay's digest with and without ``--profile`` is the same).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from seedance.slicer.core import Scheduler
from seedance.slicer.core.fragmentation import FragmentationIndex
from seedance.slicer.core.policies import SeedancePolicy, _bestfit_score

__all__ = ["Profile"]

#: Timings per figure; the best is kept.
REPEATS = 5


def _best_ms(call: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


@dataclass
class Profile:
    """The ``--profile`` figures of one replay (`filled` once, `refreshed` at each refresh)."""

    lines: list[str] = field(default_factory=list)
    #: Per refresh: (from scratch, borrowed, borrowed with signatures) in ms.
    refreshes: list[tuple[float, float, float]] = field(default_factory=list)
    #: Seconds spent profiling during the pairs (left out of the replay's rate).
    spent_s: float = 0.0

    def filled(self, sched: Scheduler) -> None:
        """The signatures, rescans and tie-break on the filled fleet."""
        policy = _policy(sched)
        state = sched._queue.state
        nodes = np.arange(len(state))
        sigs = policy.signatures(state)
        sigs.ids(nodes)
        self.lines.append(f"profile: signatures={len(sigs)} nodes={nodes.size}")
        shapes = list(policy._cache)
        whole = grouping = scoring = 0.0
        some, _ = sigs.groups(nodes)
        for shape in shapes:
            whole += _best_ms(partial(policy.node_scores, state, shape, nodes))
            grouping += _best_ms(partial(sigs.groups, nodes))
            scoring += _best_ms(partial(policy.node_scores, state, shape, some))
        k = max(len(shapes), 1)
        self.lines.append(
            f"profile: rescan shapes={len(shapes)} every_node_ms={whole / k:.3f} "
            f"by_signature_ms={grouping / k:.3f}+{scoring / k:.3f} (grouping + scoring)"
        )
        idx = policy.index(state)
        if shapes:
            pod = shapes[0]
            summed = _best_ms(
                lambda: _bestfit_score(state, nodes, pod, state.gpu_free[nodes].sum(axis=1))
            )
            indexed = _best_ms(lambda: _bestfit_score(state, nodes, pod, idx.tot[nodes]))
            self.lines.append(
                f"profile: tiebreak tied={nodes.size} summed_ms={summed:.3f} "
                f"from_index_ms={indexed:.3f}"
            )

    def refreshed(self, sched: Scheduler, replaced: object) -> None:
        """A refresh happened: the new workload's index built three ways from `replaced`'s."""
        started = time.perf_counter()
        if isinstance(replaced, SeedancePolicy) and replaced._index is not None:
            state = sched._queue.state
            workload, old = _policy(sched).workload, replaced._index
            sigs = _policy(sched).signatures(state)
            self.refreshes.append((
                _best_ms(lambda: FragmentationIndex(state, workload)),
                _best_ms(lambda: FragmentationIndex(state, workload, old)),
                _best_ms(lambda: FragmentationIndex(state, workload, old, sigs)),
            ))  # fmt: skip
        self.spent_s += time.perf_counter() - started

    def report(self) -> list[str]:
        if self.refreshes:
            scratch, borrowed, signed = np.mean(np.array(self.refreshes), axis=0).tolist()
            self.lines.append(
                f"profile: refresh_index refreshes={len(self.refreshes)} "
                f"from_scratch_ms={scratch:.1f} borrowed_ms={borrowed:.1f} "
                f"borrowed_by_signature_ms={signed:.1f}"
            )
        return self.lines


def _policy(sched: Scheduler) -> SeedancePolicy:
    policy = sched._policy
    if not isinstance(policy, SeedancePolicy):
        raise TypeError(f"--profile needs the seedance policy, not {type(policy).__name__}")
    return policy
