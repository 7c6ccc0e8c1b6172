"""Capacity release with headroom (`seedance.slicer.core.capacity`): the placement term that
leaves nodes empty (and its knob), nodes being emptied get nothing while anything else fits,
and the headroom follows the arrivals' forecast."""

from __future__ import annotations

import numpy as np

from seedance.slicer.core.capacity import ArrivalForecast, LeaveEmpty, headroom_gpus
from seedance.slicer.core.model import ClusterState, NodeGpus, PodRequest
from seedance.slicer.core.policies import FirstFit, Policy, SeedancePolicy
from tests.unit.slicer.nodes import node

ONE = PodRequest(cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000)


def where(
    policy: Policy, st: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
) -> int:
    res = policy.place(st, pod, allowed)
    assert isinstance(res, NodeGpus), res
    return res.node


def fleet(used: list[int]) -> ClusterState:
    """Nodes of 8 GPUs with `used[n]` whole GPUs taken on node n."""
    st = ClusterState([node(f"n{i}") for i in range(len(used))])
    for n, k in enumerate(used):
        for g in range(k):
            st.apply(ONE, NodeGpus(n, (g,)))
    return st


def test_a_request_goes_to_the_fullest_node_in_use_not_to_an_empty_one() -> None:
    st = fleet([0, 1, 7, 0])
    seedance = SeedancePolicy.for_trace([ONE])
    assert where(LeaveEmpty(seedance), st, ONE) == 2
    assert where(LeaveEmpty(FirstFit()), st, ONE) == 2
    # The knob off: the inner policy alone (first-fit takes the first node, an empty one).
    assert where(LeaveEmpty(FirstFit(), enabled=False), st, ONE) == 0


def test_an_empty_node_is_used_when_no_node_in_use_fits() -> None:
    st = fleet([8, 0, 8])
    assert where(LeaveEmpty(FirstFit()), st, ONE) == 1


def test_a_node_being_emptied_gets_nothing_while_another_fits() -> None:
    st = fleet([6, 1, 0])
    policy = LeaveEmpty(FirstFit())
    policy.set_draining([0])
    assert where(policy, st, ONE) == 1
    policy.set_draining([0, 1])
    assert where(policy, st, ONE) == 2  # an empty node before a draining one
    full = fleet([6, 8])
    policy.set_draining([0])
    assert where(policy, full, ONE) == 0  # last resort: it is paid for while it drains


def test_the_allowed_mask_still_binds() -> None:
    st = fleet([7, 1, 0])
    allowed = np.array([False, True, True])
    assert where(LeaveEmpty(FirstFit()), st, ONE, allowed) == 1


def test_the_headroom_follows_the_forecast_arrivals() -> None:
    rng = np.random.default_rng(7)
    forecasts = []
    for mean_gap_s, gpus in ((10.0, 1.0), (1.0, 1.0), (1.0, 4.0)):
        f, t = ArrivalForecast(), 0.0
        for _ in range(4000):
            t += float(rng.exponential(mean_gap_s))
            f.observe(t, gpus)
        lam, g1, g2 = f.rate(t)
        # An estimate over the last ~half hour of arrivals: within a quarter of the truth.
        assert abs(lam * mean_gap_s - 1.0) < 0.25
        assert (g1, g2) == (gpus, gpus * gpus)
        h = headroom_gpus(f, t, 180.0, 2.0)
        # Nothing ends: the whole arriving demand of the 3-minute start-up, + 2 std devs.
        assert h == round(lam * g1 * 180 + 2 * np.sqrt(lam * g2 * 180))
        forecasts.append(h)
    slow, fast, big = forecasts
    assert 5 * slow < fast < big  # ten times the rate, and then four GPUs per job
    assert headroom_gpus(ArrivalForecast(), 0.0, 180.0, 2.0) == 0.0


def test_in_a_steady_state_the_headroom_is_the_noise_not_the_flow() -> None:
    rng = np.random.default_rng(11)
    f, t = ArrivalForecast(), 0.0
    for _ in range(4000):  # one GPU arrives and one ends, each about once a second
        t += float(rng.exponential(1.0))
        f.observe(t, 1.0)
        f.observe_end(t + float(rng.uniform(0, 1e-3)), 1.0)
    lam_in, _, _ = f.rate(t)
    lam_out, _, _ = f.end_rate(t)
    h = headroom_gpus(f, t, 180.0, 2.0)
    assert h == round(2 * np.sqrt((lam_in + lam_out) * 180))  # ~38, not 180 + 27
    assert h < 0.3 * lam_in * 180
    # Growing demand (nothing ends): the flow is back in.
    grow = ArrivalForecast()
    for i in range(4000):
        grow.observe(float(i), 1.0)
    assert headroom_gpus(grow, 4000.0, 180.0, 2.0) > 180
