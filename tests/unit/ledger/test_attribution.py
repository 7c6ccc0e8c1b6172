"""Attribution's steps, each on its own, and the whole on one node-window built by hand."""

from __future__ import annotations

from fractions import Fraction

import msgspec

from seedance.cost_ledger.core import GpuAllocation, Ledger, LedgerConfig, NodeInfo, PriceBook
from seedance.cost_ledger.core.attribution import (
    IDLE_KEY,
    GpuUsage,
    Pricing,
    attribute,
    delivered_tflops,
    scale_factor,
)
from seedance.cost_ledger.core.facts import Facts, NodeWindow
from tests.unit.ledger.conftest import HOUR_MS

W = 300_000  # the default window, in ms


def _info(gpus: int = 2) -> NodeInfo:
    return NodeInfo(event_id="n", node="n1", gpu_model="X", gpu_count=gpus, at_ms=0)


def _alloc(job: str, kind: str = "whole", milli: int = 1000, gpu: int = 0) -> GpuAllocation:
    return GpuAllocation(
        event_id=f"p:{job}", job_id=job, tenant="acme", node="n1", gpu_model="X",
        gpu_indices=(gpu,), start_ms=0, kind=kind, gpu_milli=milli,  # type: ignore[arg-type]
    )  # fmt: skip


def _usage(ppm: int, n: int = 1, mj: int = 0) -> GpuUsage:
    samples = {f"s{i}": (ppm, mj, 0, 0) for i in range(n)}
    return GpuUsage.of(samples)


def test_scale_factor_caps_an_over_committed_gpu_at_the_window() -> None:
    holders = [(_alloc("a"), 1, W, None), (_alloc("b"), 1, W, None)]
    assert scale_factor(holders, 2 * W, _usage(0, n=0), W) == Fraction(1, 2)


def test_scale_factor_charges_shared_use_beyond_the_request_by_request() -> None:
    a, b = _alloc("a", "shared", 300), _alloc("b", "shared", 200)
    holders = [(a, Fraction(3, 10), W, None), (b, Fraction(1, 5), W, None)]
    allocated = Fraction(1, 2) * W
    # measured 80 % against 50 % requested: k = 0.8 W / 0.5 W
    assert scale_factor(holders, allocated, _usage(800_000), W) == Fraction(8, 5)
    # measured below the request: the request is charged (k = 1)
    assert scale_factor(holders, allocated, _usage(400_000), W) == 1


def test_scale_factor_never_charges_a_whole_gpu_beyond_its_request() -> None:
    holders = [(_alloc("a"), 1, W // 2, None)]
    assert scale_factor(holders, W // 2, _usage(1_000_000), W) == 1


def test_delivered_tflops_needs_a_sample_a_peak_and_charged_time() -> None:
    assert delivered_tflops(_usage(0, n=0), Fraction(100), W, W) == (0, 0)
    assert delivered_tflops(_usage(500_000), None, W, W) == (0, 0)
    assert delivered_tflops(_usage(500_000), Fraction(100), W, 0) == (0, 0)
    num, den = delivered_tflops(_usage(500_000), Fraction(100), W, W)
    assert Fraction(num, den) == Fraction(1, 2) * 100 * W / HOUR_MS


def test_an_untouched_node_is_all_idle(book: PriceBook) -> None:
    pricing = Pricing(book, LedgerConfig())
    win = NodeWindow(
        node="n1", start_ms=0, end_ms=W, info=_info(2), allocations=[], sampled=None, samples={}
    )
    out = attribute(win, pricing)
    assert list(out.lines) == [IDLE_KEY]
    # 2 GPUs x 5 minutes at $2/GPU-hour
    assert out.lines[IDLE_KEY][0].cost_usd_micro == round(Fraction(2 * W, HOUR_MS) * 2_000_000)
    assert out.sources == {IDLE_KEY: ("n",)}


def test_sharers_split_measured_use_and_the_rest_is_idle(book: PriceBook) -> None:
    pricing = Pricing(book, LedgerConfig())
    a, b = _alloc("a", "shared", 300), _alloc("b", "shared", 200)
    win = NodeWindow(
        node="n1", start_ms=0, end_ms=W, info=_info(1),
        allocations=[(a, W, None), (b, W, None)],
        sampled={0}, samples={0: {"s": (800_000, 0, 10, 0)}},
    )  # fmt: skip
    out = attribute(win, pricing)
    gpu_hours = {k: v[0].gpu_hours_micro for k, v in out.lines.items()}
    five_min_micro = 1_000_000 * W // HOUR_MS  # 83,333 µh
    assert gpu_hours[("usage", "a")] == round(Fraction(48, 100) * W * 1_000_000 / HOUR_MS)
    assert gpu_hours[("usage", "b")] == round(Fraction(32, 100) * W * 1_000_000 / HOUR_MS)
    assert gpu_hours[IDLE_KEY] == round(Fraction(20, 100) * W * 1_000_000 / HOUR_MS)
    assert sum(gpu_hours.values()) in (five_min_micro, five_min_micro + 1)
    assert out.sources[("usage", "a")] == ("n", "p:a", "s")


def test_the_ledger_emits_what_attribution_computes_from_its_facts(book: PriceBook) -> None:
    led = Ledger(book)
    led.apply_many([_info(2), _alloc("a"), _alloc("b", "shared", 500, gpu=1)])
    entries = led.advance(W + LedgerConfig().lateness_ms)
    facts: Facts = led.facts
    expected = attribute(facts.window("n1", 0, W), led.pricing)
    assert {(e.kind, e.job_id): e.amounts for e in entries} == {
        k: v[0] for k, v in expected.lines.items()
    }


def test_share_of_an_allocation(book: PriceBook) -> None:
    pricing = Pricing(book, LedgerConfig())
    assert pricing.share(_alloc("a")) == 1
    assert pricing.share(_alloc("a", "shared", 250)) == Fraction(1, 4)
    mig = msgspec.structs.replace(_alloc("a", "mig"), mig_profile="3g.40gb")
    assert pricing.share(mig) == book.mig_fraction("X", "3g.40gb")
