"""Right-sizing: a smaller request from measured use, never below the measured peak.

The jobs run through the real ledger core; their lines go through the bus mapping and the
wire codec (``to_bus`` → ``encode`` → ``decode`` → ``lines_from_events``), as a report reads
them from the cost stream, before they are sized.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedance.cost_ledger import core
from seedance.cost_ledger.core import (
    BookRightsizer,
    CostLine,
    GpuAllocation,
    GpuSample,
    JobEnded,
    Ledger,
    LedgerConfig,
    NodeInfo,
    default_price_book,
    recommend,
)
from seedance.cost_ledger.core.mapping import to_bus
from seedance.cost_ledger.core.rightsizing import (
    HEADROOM,
    HOURS_PER_MONTH,
    options,
    recommend_all,
)
from seedance.events import decode, encode
from seedance.events.gpus import identify
from seedance.reports import (
    JobUse,
    Recommendation,
    ReportLine,
    ReportWindow,
    job_uses,
    lines_from_events,
    render_lines,
    tenant_savings,
)

W = 300_000  # the ledger's default 5-minute window
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z, a window edge
BOOK = default_price_book()
GIB = 1024


def _node(node: str = "n1", model: str = "H100", gpus: int = 8) -> NodeInfo:
    return NodeInfo(event_id=f"inv:{node}", node=node, gpu_model=model, gpu_count=gpus, at_ms=T0)


def _alloc(
    job: str, gpus: tuple[int, ...], *, kind: str = "whole", milli: int = 1000, profile: str = "",
    node: str = "n1", model: str = "H100", tenant: str = "acme",
) -> GpuAllocation:  # fmt: skip
    return GpuAllocation(
        event_id=f"p:{job}", job_id=f"{tenant}/{job}", tenant=tenant, node=node,
        gpu_model=model, gpu_indices=gpus, start_ms=T0, kind=kind,  # type: ignore[arg-type]
        gpu_milli=milli, mig_profile=profile,
    )  # fmt: skip


def _sample(gpu: int, at_ms: int, activity: float, mem_mib: int, node: str = "n1") -> GpuSample:
    return GpuSample(
        event_id=f"s:{node}:{gpu}:{at_ms}", node=node, gpu_index=gpu, at_ms=at_ms,
        activity=activity, mem_used_mib=mem_mib,
    )  # fmt: skip


def _lines(events: Sequence[object], as_of_ms: int) -> list[ReportLine]:
    """Run the ledger and read its lines back as a report does: from the wire."""
    led = Ledger(BOOK, LedgerConfig())
    led.apply_many(events)  # type: ignore[arg-type]
    out = [o for o in led.advance(as_of_ms) if isinstance(o, CostLine)]
    return lines_from_events(decode(encode(to_bus(o).event)) for o in out)


def _run_job(
    per_window: list[list[tuple[int, float, int]]], alloc: GpuAllocation
) -> list[ReportLine]:
    """One job on node n1 for ``len(per_window)`` windows; samples (gpu, activity, MiB)."""
    events: list[object] = [_node(model=alloc.gpu_model), alloc]
    for w, samples in enumerate(per_window):
        for i, (gpu, act, mem) in enumerate(samples):
            events.append(_sample(gpu, T0 + w * W + 1_000 * (i + 1), act, mem))
    end = T0 + len(per_window) * W
    events.append(JobEnded(event_id=f"end:{alloc.job_id}", job_id=alloc.job_id, end_ms=end))
    return _lines(events, end + 2 * W)


def test_a_job_using_a_fifth_of_its_gpu_is_offered_a_share_with_its_saving_in_dollars() -> None:
    # A whole H100 that ran at 20 % at most (mean lower) and held 9 GiB: 12 windows of samples.
    windows = [[(0, a, 9 * GIB) for a in (0.12, 0.2, 0.15, 0.18)] for _ in range(12)]
    lines = _run_job(windows, _alloc("train", (0,)))
    (use,) = job_uses(lines)
    assert use.peak_activity_ppm == 200_000
    assert use.peak_mem_mib == 9 * GIB
    assert use.kind == "whole"
    assert use.gpus == 1
    assert use.measured_windows == 12

    rec = recommend(use, BOOK)
    # need = 20 % + 15 % headroom = 23 %: the cheapest option covering it is a 25 % share
    # (MIG 2g.20gb is charged (2/7 + 2/8) / 2 = 26.8 %; 1g.10gb holds only 14.3 %).
    assert rec.recommended == "share 25 %"
    price = BOOK.usd_per_gpu_hour("H100", "on_demand")  # $6.88 per GPU-hour
    assert rec.monthly_now_usd_micro == 6_880_000 * HOURS_PER_MONTH
    assert rec.saving_usd_micro == core.round_micro((1 - Fraction(1, 4)) * price * 730)
    assert rec.saving_usd_micro == 3_766_800_000  # $3,766.80 a month
    assert rec.capacity_activity_ppm >= rec.peak_activity_ppm * (1 + HEADROOM)
    assert rec.capacity_mem_mib >= 9 * GIB


def test_four_gpus_at_thirty_percent_are_offered_two() -> None:
    windows = [[(g, 0.3, 20 * GIB) for g in range(4)] for _ in range(3)]
    (use,) = job_uses(_run_job(windows, _alloc("big", (0, 1, 2, 3))))
    assert use.gpus == 4
    assert use.peak_activity_ppm == 1_200_000
    rec = recommend(use, BOOK)
    assert (rec.current, rec.recommended) == ("4 GPUs", "2 GPUs")  # 1.38 GPUs of activity
    assert rec.saving_usd_micro == 2 * 6_880_000 * HOURS_PER_MONTH


def test_memory_keeps_a_job_from_a_slice_its_activity_would_fit() -> None:
    # 10 % busy but 60 GiB held (69 GiB with headroom): a 15 % share would hold 11 GiB and the
    # largest MIG slice below 7g holds 40 GB, so only a 95 % share (72 GiB) covers it.
    windows = [[(0, 0.1, 60 * GIB)] for _ in range(2)]
    rec = recommend(job_uses(_run_job(windows, _alloc("kv", (0,))))[0], BOOK)
    assert rec.recommended == "share 95 %"
    assert rec.capacity_mem_mib >= 60 * GIB * (1 + HEADROOM)
    assert rec.saving_usd_micro == core.round_micro(Fraction(5, 100) * Fraction("6.88") * 730)


def test_without_a_memory_reading_memory_is_never_cut() -> None:
    windows = [[(0, 0.1, 0)] for _ in range(2)]  # activity read, memory not
    (use,) = job_uses(_run_job(windows, _alloc("blind", (0,))))
    assert use.peak_mem_mib is None
    rec = recommend(use, BOOK)
    assert rec.need_mem_mib == 80_000_000_000 // 2**20  # the whole GPU it holds
    assert rec.recommended is None
    assert rec.reason == "no memory reading"
    assert rec.saving_usd_micro == 0


def test_a_job_at_its_request_and_an_unmeasured_one_get_no_recommendation() -> None:
    busy = recommend(job_uses(_run_job([[(0, 0.95, 70 * GIB)]], _alloc("hot", (0,))))[0], BOOK)
    assert busy.recommended is None
    assert busy.reason == "its peak needs what it holds"
    quiet = job_uses(_run_job([[]], _alloc("dark", (0,))))
    assert quiet[0].measured_windows == 0
    assert recommend(quiet[0], BOOK).reason.startswith("not measured")


def test_a_late_sample_raises_the_peak_through_the_lines_adjustment() -> None:
    alloc = _alloc("late", (0,))
    first = [_node(), alloc, _sample(0, T0 + 1_000, 0.1, 4 * GIB)]
    led = Ledger(BOOK, LedgerConfig())
    led.apply_many(first)
    out = led.advance(T0 + 3 * W)
    led.apply(_sample(0, T0 + 2_000, 0.6, 30 * GIB))  # arrives after the window closed
    out += led.advance(T0 + 4 * W)
    lines = lines_from_events(
        decode(encode(to_bus(o).event)) for o in out if isinstance(o, CostLine)
    )
    revisions = sorted(e.revision for e in lines if e.job_id == "late" and e.window_start_ms == T0)
    assert revisions == [0, 1]
    (use,) = job_uses(lines)
    assert use.peak_activity_ppm == 600_000
    assert use.peak_mem_mib == 30 * GIB
    # Replayed (the same lines twice, as a re-read stream holds them): the same use.
    assert job_uses(lines + lines) == [use]


def test_shared_and_mig_jobs_are_sized_down_from_their_slice() -> None:
    shared = _run_job([[(0, 0.05, 3 * GIB)]], _alloc("s", (0,), kind="shared", milli=500))
    rec = recommend(job_uses(shared)[0], BOOK)
    assert rec.current == "share 50 %"
    assert rec.recommended == "share 10 %"
    mig = _run_job(
        [[(0, 0.05, 3 * GIB)]], _alloc("m", (0,), kind="mig", profile="3g.71gb", model="H200")
    )
    rec = recommend(job_uses(mig)[0], BOOK)
    assert rec.current == "MIG 3g.71gb"
    assert rec.recommended is not None
    assert rec.saving_usd_micro > 0


def test_reports_show_the_table_and_roll_it_up_per_tenant() -> None:
    a = _run_job([[(0, 0.2, 9 * GIB)]], _alloc("a", (0,)))
    b = _run_job([[(1, 0.9, 70 * GIB)]], _alloc("b", (1,), tenant="globex"))
    lines = a + b
    sizer = BookRightsizer(BOOK)
    recs = sizer.recommend_all(job_uses(lines))
    (acme, globex) = sorted(tenant_savings(recs), key=lambda t: t.tenant)
    assert (acme.resized, acme.saving_usd_micro) == (1, 3_766_800_000)
    assert (globex.resized, globex.saving_usd_micro) == (0, 0)
    args = {"tenant": None, "window": ReportWindow(), "by": "job", "share": False,
            "generated_at_ms": T0, "rightsizer": sizer}  # fmt: skip
    text, _ = render_lines(lines, fmt="text", **args)  # type: ignore[arg-type]
    assert "right-sizing" in text
    assert "acme/a" in text
    assert "$3,766.80" in text
    assert "share 25 %" in text
    assert "rule: " in text
    html, _ = render_lines(lines, fmt="html", **args)  # type: ignore[arg-type]
    assert '<table class="rightsizing">' in html
    assert "$3,766.80" in html
    assert "its peak needs what it holds" in html
    plain, _ = render_lines(lines, fmt="html", **{**args, "rightsizer": None})  # type: ignore[arg-type]
    assert "rightsizing" not in plain
    tenant_only, _ = render_lines(lines, fmt="text", **{**args, "tenant": "acme"})  # type: ignore[arg-type]
    assert "acme/a" in tenant_only
    assert "globex/b" not in tenant_only


# ------------------------------------------------------------------------------ properties

_KINDS = st.sampled_from(["whole1", "whole2", "whole4", "shared", "mig"])
_READING = st.tuples(
    st.floats(min_value=0, max_value=1, allow_nan=False), st.integers(0, 140 * GIB)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=_KINDS,
    milli=st.integers(1, 1000),
    windows=st.lists(st.lists(_READING, min_size=0, max_size=4), min_size=1, max_size=4),
)
def test_no_recommendation_is_ever_below_the_measured_peak(
    kind: str, milli: int, windows: list[list[tuple[float, int]]]
) -> None:
    gpus = {"whole1": (0,), "whole2": (0, 1), "whole4": (0, 1, 2, 3)}.get(kind, (0,))
    alloc = _alloc(
        "p", gpus, model="H200", kind=kind.rstrip("124"), milli=milli if kind == "shared" else 1000,
        profile="3g.71gb" if kind == "mig" else "",
    )  # fmt: skip
    # Each GPU of the job gets every reading of the window (so their sum is the job's peak).
    per_window = [[(g, a, m) for a, m in w for g in gpus] for w in windows]
    lines = _run_job(per_window, alloc)
    (use,) = job_uses(lines)
    # The true peak, from the generated readings themselves (ppm as the ledger rounds them).
    peak_act = max((len(gpus) * max(round(a * 1e6) for a, _ in w) for w in windows if w), default=0)
    peak_mem = max((len(gpus) * max(m for _, m in w) for w in windows if w), default=0)
    assert use.peak_activity_ppm == peak_act
    rec = recommend(use, BOOK)
    _check(rec, use, peak_act, peak_mem)


@settings(max_examples=300, deadline=None)
@given(
    kind=_KINDS,
    milli=st.integers(1, 1000),
    peak_act=st.integers(0, 4_000_000),
    peak_mem=st.one_of(st.none(), st.integers(1, 4 * 140 * GIB)),
    model=st.sampled_from(sorted(BOOK.gpus)),
    tier=st.sampled_from(["on_demand", "reserved", "spot", "on_prem", ""]),
)
def test_any_profile_gets_a_covering_cheaper_request_or_none(
    kind: str, milli: int, peak_act: int, peak_mem: int | None, model: str, tier: str
) -> None:
    has_mig = BOOK.gpus[model].mig_memory_gb is not None
    if kind == "mig" and not has_mig:
        kind = "shared"
    gpus = {"whole1": 1, "whole2": 2, "whole4": 4}.get(kind, 1)
    use = JobUse(
        tenant="t", job_id="j", gpu_model=model, pricing_tier=tier, kind=kind.rstrip("124"),
        gpus=gpus, milli=milli if kind == "shared" else 1000,
        mig_profile=_half_profile(model) if kind == "mig" else "",
        windows=1, measured_windows=1, samples=1, peak_activity_ppm=peak_act,
        peak_mem_mib=peak_mem,
    )  # fmt: skip
    _check(recommend(use, BOOK), use, peak_act, peak_mem or 0)


def _half_profile(model: str) -> str:
    """A profile of ``model`` holding half its memory, as NVIDIA names it where the identity
    holds its table (A100 80GB: 3g.40gb; H200: 3g.71gb; A30: 2g.12gb), else 3g.<half>gb."""
    gpu = identify(model).identity
    plain = [p for p in (gpu.mig_profiles if gpu else ()) if p.endswith("gb")]
    table = [p for p in plain if p[:3] in ("2g.", "3g.")]
    return table[-1] if table else f"3g.{(BOOK.gpus[model].mig_memory_gb or 0) // 2}gb"


def _check(rec: Recommendation, use: JobUse, peak_act: int, peak_mem: int) -> None:
    if rec.recommended is None:
        assert rec.saving_usd_micro == 0
        return
    assert use.measured_windows > 0
    assert rec.capacity_activity_ppm >= peak_act  # never below the measured peak ...
    assert rec.capacity_mem_mib >= peak_mem
    need_act = -(-peak_act * 115 // 100)  # ... nor below it plus its headroom
    need_mem = -(-peak_mem * 115 // 100) if use.peak_mem_mib is not None else rec.need_mem_mib
    assert rec.need_activity_ppm == need_act
    assert rec.need_mem_mib == need_mem
    assert rec.capacity_activity_ppm >= need_act
    assert rec.capacity_mem_mib >= need_mem
    assert rec.saving_usd_micro > 0
    assert rec.monthly_after_usd_micro < rec.monthly_now_usd_micro
    # ... and it is the cheapest request that covers the need.
    offered = options(BOOK, use.gpu_model, use.gpus)
    chosen = next(o for o in offered if o.label == rec.recommended)
    assert not any(o.covers(need_act, need_mem) and o.fraction < chosen.fraction for o in offered)


def test_the_allocation_answer_carries_the_recommendations_when_asked() -> None:
    from seedance.events.allocation import AllocationAnswer, AllocationQuery, AllocationRefusal
    from seedance.reports.allocation import allocation

    lines = _run_job([[(0, 0.2, 9 * GIB)]], _alloc("a", (0,))) + _run_job(
        [[(1, 0.9, 70 * GIB)]], _alloc("b", (1,), tenant="globex")
    )
    query = AllocationQuery(window="30d", aggregate="job", rightsize=True)
    sizer = BookRightsizer(BOOK)
    answer = allocation(lines, query, tenant="acme", as_of_seq=9, rightsizer=sizer)
    assert isinstance(answer, AllocationAnswer)
    (rec,) = answer.rightsizing  # acme's own job only
    assert (rec.job_id, rec.recommended, rec.saving_usd_micro) == ("a", "share 25 %", 3_766_800_000)
    assert answer.rightsizing_rule == sizer.rule
    refused = allocation(lines, query, tenant="acme", as_of_seq=9)
    assert isinstance(refused, AllocationRefusal)
    assert refused.parameter == "rightsize"


def test_a_media_extension_mig_job_is_sized_like_its_plain_profile() -> None:
    """``1g.10gb+me`` (the slicer places it; the bus allows it) was read by splitting the name
    by hand: ``int('10gb+me')`` ended the whole fleet's report (review of 2026-12-07)."""
    recs = {}
    for profile in ("1g.10gb", "1g.10gb+me"):
        alloc = _alloc(profile, (0,), kind="mig", profile=profile, model="A100-SXM4-80GB")
        recs[profile] = recommend(job_uses(_run_job([[(0, 0.01, GIB)]], alloc))[0], BOOK)
    plain, me = recs["1g.10gb"], recs["1g.10gb+me"]
    assert me.current == "MIG 1g.10gb+me"
    assert (me.recommended, me.saving_usd_micro) == (plain.recommended, plain.saving_usd_micro)


def test_a_mig_job_s_activity_is_read_against_its_gpu_s_own_slices() -> None:
    """An A30 has 4 compute slices: its ``1g.6gb`` holds a quarter of the GPU's activity, not
    a seventh (the old reading said the job held 14 % of a GPU while it measured 20 %)."""
    alloc = _alloc("a30", (0,), kind="mig", profile="1g.6gb", model="A30")
    rec = recommend(job_uses(_run_job([[(0, 0.2, GIB)]], alloc))[0], BOOK)
    assert rec.current == "MIG 1g.6gb"
    assert rec.recommended is None  # its peak and headroom need what it holds
    assert rec.capacity_activity_ppm == 250_000


def test_a_line_whose_request_cannot_be_read_gets_its_own_verdict_not_the_report_s_end() -> None:
    """A MIG line stored before its profile was checked against the GPU (``7g.10gb`` on an
    80 GB A100 was billed 9/16 until this release) has no price now: that job's row says so,
    and every other job is still recommended (the fleet's report ended on it, review of
    2026-12-07)."""
    stored = JobUse(
        tenant="t", job_id="old", gpu_model="NVIDIA A100-SXM4-80GB", pricing_tier="on_demand",
        kind="mig", gpus=1, milli=1000, mig_profile="7g.10gb", windows=1, measured_windows=1,
        samples=1, peak_activity_ppm=1000, peak_mem_mib=100,
    )  # fmt: skip
    fine = msgspec.structs.replace(stored, job_id="new", mig_profile="1g.10gb")
    old, new = recommend_all([stored, fine], BOOK)
    assert old.recommended is None
    assert old.reason.startswith("its request cannot be read")
    assert "7g.10gb" in old.reason
    assert new.current == "MIG 1g.10gb"
