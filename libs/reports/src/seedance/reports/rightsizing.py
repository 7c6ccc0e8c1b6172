"""Right-sizing as reports read and show it: each job's measured use, and the recommendations.

Owns ``JobUse`` (what one job held and the most it was measured using, read from its cost
lines' ``usage``), ``job_uses`` (lines → uses, in a window, for the fleet or one tenant), the
``TenantSaving`` roll-up per tenant, and the rendering of recommendations as a text table and
an HTML section (a ``Recommendation`` is the allocation API's
``seedance.events.allocation.Recommendation``, so an answer carries it as reports show it).
Must not choose a recommendation: that needs the price book's
prices and MIG rule, which are the ledger's (``seedance.cost_ledger.core.rightsizing``); it
hands its rows over, built from these uses.

Reading the lines: a line's revisions each carry the line's usage as it stood then, so the
latest revision of each (job, node, window) is the one read. A job's use in a window is the sum
over its nodes (GPUs held, peaks); its **measured peak** is the highest of those sums over the
windows that had samples. Its memory peak is unknown (None) when any measured window had no
memory reading: a recommendation then never cuts memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from decimal import Decimal
from html import escape
from typing import Protocol

import msgspec

from seedance.events.allocation import Recommendation
from seedance.reports.lines import ReportLine
from seedance.reports.summary import ReportWindow

__all__ = [
    "JobUse",
    "Recommendation",
    "Rightsizer",
    "TenantSaving",
    "job_uses",
    "rightsizing_html",
    "rightsizing_text",
    "tenant_savings",
]


class JobUse(msgspec.Struct, frozen=True, kw_only=True):
    """One job's request (as of its latest window) and the most it was measured using."""

    tenant: str
    job_id: str
    gpu_model: str
    pricing_tier: str
    kind: str  # whole | shared | mig
    gpus: int  # GPUs held, over all its nodes
    milli: int  # a share's thousandths of its GPU (1000 otherwise)
    mig_profile: str
    windows: int  # charge windows the job has lines in
    measured_windows: int  # of which had samples
    samples: int
    #: Highest per-window sum over its GPUs of each GPU's highest sampled activity, in ppm of
    #: one GPU (2 GPUs at 100 % = 2,000,000); 0 when nothing was measured.
    peak_activity_ppm: int
    #: The same for used memory (MiB); None when a measured window had no memory reading.
    peak_mem_mib: int | None
    #: ``pod`` when every measured line came from the node agent's per-pod share, else ``gpu``
    #: (on a shared GPU the GPU's peak, all sharers included: an upper bound of the job's).
    measured_by: str = "gpu"


class TenantSaving(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's recommendations added up (micro-USD a month at the jobs' current prices)."""

    tenant: str
    jobs: int
    resized: int
    monthly_now_usd_micro: int
    saving_usd_micro: int


class Rightsizer(Protocol):
    """What chooses the recommendations (the ledger's, with its price book) and states its rule."""

    rule: str

    def recommend_all(self, uses: Iterable[JobUse]) -> list[Recommendation]: ...


class _JobAcc:
    """One job's lines read so far: per window, per node, the latest revision's line."""

    def __init__(self) -> None:
        self.latest: dict[tuple[int, str], ReportLine] = {}

    def add(self, e: ReportLine) -> None:
        key = (e.window_start_ms, e.node)
        seen = self.latest.get(key)
        if seen is None or e.revision > seen.revision:
            self.latest[key] = e

    def use(self) -> JobUse | None:
        per_window: dict[int, list[ReportLine]] = defaultdict(list)
        for (w, _), e in sorted(self.latest.items()):
            if e.usage is not None:
                per_window[w].append(e)
        if not per_window:
            return None
        last = per_window[max(per_window)]
        peak_act, peak_mem, mem_known = 0, 0, True
        measured = samples = 0
        by_pod = True
        for lines in per_window.values():
            uses = [e.usage for e in lines if e.usage is not None]
            n = sum(u.samples for u in uses)
            if not n:
                continue
            measured += 1
            samples += n
            by_pod = by_pod and all(u.measured_by == "pod" for u in uses)
            peak_act = max(peak_act, sum(u.peak_activity_ppm for u in uses))
            mem = sum(u.peak_mem_mib for u in uses)
            mem_known = mem_known and all(u.peak_mem_mib > 0 for u in uses if u.samples)
            peak_mem = max(peak_mem, mem)
        head = last[0]
        now = [e.usage for e in last if e.usage is not None]
        return JobUse(
            tenant=head.tenant,
            job_id=head.job_id,
            gpu_model=head.gpu_model,
            pricing_tier=head.pricing_tier,
            kind=now[0].kind,
            gpus=sum(u.gpus for u in now),
            milli=now[0].milli,
            mig_profile=now[0].mig_profile,
            windows=len(per_window),
            measured_windows=measured,
            samples=samples,
            peak_activity_ppm=peak_act,
            peak_mem_mib=peak_mem if mem_known and measured else None,
            measured_by="pod" if measured and by_pod else "gpu",
        )


def job_uses(
    lines: Iterable[ReportLine], *, window: ReportWindow | None = None, tenant: str | None = None
) -> list[JobUse]:
    """Each job's use in ``window`` (all of it: None), the fleet's or one tenant's, sorted."""
    window = window or ReportWindow()
    acc: dict[tuple[str, str], _JobAcc] = defaultdict(_JobAcc)
    for e in lines:
        if e.kind != "usage" or not window.holds(e) or (tenant is not None and e.tenant != tenant):
            continue
        acc[(e.tenant, e.job_id)].add(e)
    uses = (a.use() for _, a in sorted(acc.items()))
    return [u for u in uses if u is not None]


def tenant_savings(recs: Iterable[Recommendation]) -> list[TenantSaving]:
    """The recommendations rolled up per tenant, largest saving first."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in recs:
        a = acc[r.tenant]
        a[0] += 1
        a[1] += r.recommended is not None
        a[2] += r.monthly_now_usd_micro
        a[3] += r.saving_usd_micro
    rows = [
        TenantSaving(tenant=t, jobs=a[0], resized=a[1], monthly_now_usd_micro=a[2],
                     saving_usd_micro=a[3])
        for t, a in acc.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda r: (-r.saving_usd_micro, r.tenant))


def _usd(micro: int) -> str:
    return f"${Decimal(micro).scaleb(-6).quantize(Decimal('0.01')):,}"


def _pct(ppm: int) -> str:
    return f"{ppm / 10_000:.0f} %"


def _mem(mib: int | None) -> str:
    return "not read" if mib is None else f"{mib / 1024:,.1f} GiB"


def _ordered(recs: Iterable[Recommendation]) -> list[Recommendation]:
    return sorted(recs, key=lambda r: (-r.saving_usd_micro, r.tenant, r.job_id))


def rightsizing_text(recs: Sequence[Recommendation], rule: str) -> str:
    """The recommendations as a terminal table, then the per-tenant roll-up and ``rule``."""
    out = [
        "right-sizing (monthly = 730 h at the job's current price)",
        f"{'tenant/job':<34} {'now':<16} {'recommended':<18} {'peak act':>9} {'peak mem':>10}"
        f" {'monthly now':>13} {'saving/month':>13}",
    ]
    out.extend(
        f"{r.tenant + '/' + r.job_id:<34} {r.current:<16} {r.recommended or '-':<18} "
        f"{_pct(r.peak_activity_ppm):>9} {_mem(r.peak_mem_mib):>10} "
        f"{_usd(r.monthly_now_usd_micro):>13} {_usd(r.saving_usd_micro):>13}"
        + ("" if r.recommended else f"  ({r.reason})")
        for r in _ordered(recs)
    )
    out.append("by tenant:")
    out.extend(
        f"  {t.tenant:<32} {t.resized}/{t.jobs} jobs resized, saving "
        f"{_usd(t.saving_usd_micro)} of {_usd(t.monthly_now_usd_micro)} a month"
        for t in tenant_savings(recs)
    )
    out.append(f"rule: {rule}")
    return "\n".join(out) + "\n"


def rightsizing_html(recs: Sequence[Recommendation], rule: str, max_rows: int = 100) -> str:
    """The recommendations as an HTML report section (a table per job, one per tenant)."""
    if not recs:
        return (
            "<section><h2>Right-sizing</h2><p class=sub>No job in the window has measured "
            "use to size it by.</p></section>"
        )
    ordered = _ordered(recs)
    rows = [
        f"<tr><td>{escape(r.job_id)}</td><td>{escape(r.tenant)}</td>"
        f"<td>{escape(r.current)}</td>"
        f"<td>{escape(r.recommended or '— (' + r.reason + ')')}</td>"
        f"<td>{_pct(r.peak_activity_ppm)}</td><td>{_mem(r.peak_mem_mib)}</td>"
        f"<td>{_usd(r.monthly_now_usd_micro)}</td><td>{_usd(r.saving_usd_micro)}</td></tr>"
        for r in ordered[:max_rows]
    ]
    rest = ordered[max_rows:]
    tail = (
        f'<p class="sub">and {len(rest)} more jobs saving '
        f"{_usd(sum(r.saving_usd_micro for r in rest))} a month in all.</p>"
        if rest
        else ""
    )
    tenants = "".join(
        f"<tr><td>{escape(t.tenant)}</td><td>{t.resized} / {t.jobs}</td>"
        f"<td>{_usd(t.monthly_now_usd_micro)}</td><td>{_usd(t.saving_usd_micro)}</td></tr>"
        for t in tenant_savings(recs)
    )
    return (
        '<section><h2>Right-sizing</h2><p class="sub">A smaller request that still covers '
        f"each job's measured peak. {escape(rule)}</p>"
        '<table class="rightsizing"><thead><tr><th>Job</th><th>Tenant</th><th>Now</th>'
        "<th>Recommended</th><th>Peak activity</th><th>Peak memory</th><th>Monthly now</th>"
        f"<th>Saving / month</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{tail}"
        '<table class="rightsizing-tenants"><thead><tr><th>Tenant</th><th>Jobs resized</th>'
        "<th>Monthly now</th><th>Saving / month</th></tr></thead>"
        f"<tbody>{tenants}</tbody></table></section>"
    )
