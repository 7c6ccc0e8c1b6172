"""What became of a tenant's jobs, folded from what the bus holds: decisions and costs.

Owns the pure fold of a tenant's slicer decisions (``seedance.slicing.<t>.*``: placements,
waiting reasons, preemptions, releases, rejections, in stream order) and its cost events
(``seedance.costs.<t>.*``) into one `JobStatus` per job, and their human rendering (one job's
block, a table of jobs). Must not read the bus, the clock or print: ``SeedanceClient.job_statuses``
reads the two streams with the tenant's own credentials, the CLI prints.

A job is known only through the slicer's decisions: a job event the slicer has not answered yet
(it is not running, or has not read it) and decisions older than the slicing stream's retention
(30 days) are not here, even where the cost stream (400 days) still holds the job's costs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import (
    JobRejected,
    JobReleased,
    Placement,
    Preempted,
    RejectionReason,
    Unschedulable,
)

__all__ = [
    "JobCost",
    "JobState",
    "JobStatus",
    "describe",
    "fold_statuses",
    "gpus_text",
    "status_table",
]


class JobState(enum.StrEnum):
    """Where a job stands after the slicer's last decision about it."""

    #: Not placed: ``waiting`` says why (the slicer's unschedulable reason and detail).
    WAITING = "waiting"
    #: Holds resources: ``placements`` says where (one per node for a gang over nodes).
    PLACED = "placed"
    #: Evicted; the slicer queues it again (a later placement or waiting reason follows).
    PREEMPTED = "preempted"
    #: Refused outright (unknown tenant, invalid request, ...): it will never run.
    REJECTED = "rejected"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The states of a job that has ended (``released`` holds the slicer's release).
ENDED = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})


class JobCost(msgspec.Struct, frozen=True, kw_only=True):
    """A job's cost so far: the sum of its cost entries (a revision carries a difference, so
    the sum is the cost), and the ledger's final report once the job is closed."""

    cost_micro_usd: int = 0
    gpu_hours_micro: int = 0
    entries: int = 0
    #: The ledger's total for an ended job (its latest revision); None while it runs.
    report: JobCostReport | None = None


class JobStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One job as the bus knows it. The events are the slicer's own, as published."""

    tenant: str
    job_id: str
    state: JobState
    #: The time of the decision that put the job in ``state`` (the slicer's trusted time).
    since: datetime
    #: Where it runs (``placed``) or last ran (ended, preempted: kept for the record).
    placements: list[Placement] = msgspec.field(default_factory=list)
    #: Why it waits (``waiting``); None otherwise.
    waiting: Unschedulable | None = None
    #: Its last eviction, if any.
    preempted: Preempted | None = None
    #: The job's refusal (``rejected``) or the last refused request about it (a duplicate
    #: submit, an end of an ended job), which changed nothing.
    rejection: JobRejected | None = None
    #: The slicer's release of an ended job (outcome, whether it held resources).
    released: JobReleased | None = None
    #: How many decisions the slicer published about it.
    decisions: int = 0
    cost: JobCost = msgspec.field(default_factory=JobCost)


Decision = Placement | Unschedulable | Preempted | JobReleased | JobRejected


@dataclass
class _Acc:
    """A job's fold in progress (mutable; frozen into a `JobStatus` at the end)."""

    state: JobState | None = None
    since: datetime | None = None
    placements: list[Placement] = field(default_factory=list)
    waiting: Unschedulable | None = None
    preempted: Preempted | None = None
    rejection: JobRejected | None = None
    released: JobReleased | None = None
    decisions: int = 0

    def apply(self, ev: Decision) -> None:
        self.decisions += 1
        if isinstance(ev, JobRejected):
            self.rejection = ev
            if self.state is None:
                self._to(JobState.REJECTED, ev.at)
            return
        if isinstance(ev, Placement):
            # Parts of one gang are consecutive placements; a placement after anything else
            # (a wait, a preemption, an earlier life of the id) starts a new set.
            if self.state is not JobState.PLACED:
                self.placements = []
                self.released = None
                self._to(JobState.PLACED, ev.at)
            self.placements.append(ev)
            self.waiting = None
        elif isinstance(ev, Unschedulable):
            self.waiting = ev
            self.released = None
            self.placements = []
            self._to(JobState.WAITING, ev.at)
        elif isinstance(ev, Preempted):
            self.preempted = ev
            self._to(JobState.PREEMPTED, ev.at)
        else:
            self.released = ev
            self.waiting = None
            self._to(JobState(str(ev.outcome)), ev.at)

    def _to(self, state: JobState, at: datetime) -> None:
        self.state, self.since = state, at


def _costs(job_ids: set[str], cost_events: Iterable[object]) -> dict[str, JobCost]:
    sums: dict[str, list[int]] = {}
    reports: dict[str, JobCostReport] = {}
    for ev in cost_events:
        if isinstance(ev, CostEntry) and ev.job_id in job_ids:
            s = sums.setdefault(ev.job_id, [0, 0, 0])
            s[0] += ev.cost_micro_usd
            s[1] += ev.gpu_hours_micro
            s[2] += 1
        elif isinstance(ev, JobCostReport) and ev.job_id in job_ids:
            old = reports.get(ev.job_id)
            if old is None or ev.revision >= old.revision:
                reports[ev.job_id] = ev
    out = {}
    for job in sums.keys() | reports.keys():
        cost, gpu_h, n = sums.get(job, [0, 0, 0])
        out[job] = JobCost(
            cost_micro_usd=cost, gpu_hours_micro=gpu_h, entries=n, report=reports.get(job)
        )
    return out


def _never_a_job(ev: Decision) -> bool:
    """A refused start or end of a job the slicer did not know (``unknown_job``): it says
    nothing of a job, so it does not make one (`jobs status` of it: the bus knows no job)."""
    return isinstance(ev, JobRejected) and ev.reason == RejectionReason.UNKNOWN_JOB


def fold_statuses(
    tenant: str,
    decisions: Iterable[object],
    cost_events: Iterable[object] = (),
    *,
    job_id: str | None = None,
) -> list[JobStatus]:
    """Each job of ``tenant`` that the slicer decided about, in the order it first did.

    ``decisions`` are the tenant's slicing events in stream order (anything else, another
    tenant's or a family the fold does not know, is skipped); ``cost_events`` its cost events.
    With ``job_id``, only that job (an empty list: the bus knows nothing of it).
    """
    accs: dict[str, _Acc] = {}
    for ev in decisions:
        if not isinstance(ev, Decision) or ev.tenant != tenant:
            continue
        if job_id is not None and ev.job_id != job_id:
            continue
        if _never_a_job(ev) and ev.job_id not in accs:
            continue
        accs.setdefault(ev.job_id, _Acc()).apply(ev)
    costs = _costs(set(accs), cost_events)
    out = []
    for job, a in accs.items():
        # every decision sets a state and its time
        assert a.state is not None
        assert a.since is not None
        out.append(
            JobStatus(
                tenant=tenant,
                job_id=job,
                state=a.state,
                since=a.since,
                placements=a.placements,
                waiting=a.waiting,
                preempted=a.preempted,
                rejection=a.rejection,
                released=a.released,
                decisions=a.decisions,
                cost=costs.get(job, JobCost()),
            )
        )
    return out


# --- rendering ----------------------------------------------------------------------------


def gpus_text(p: Placement) -> str:
    """``0, 1`` for whole GPUs, ``0 3g.40gb`` for a MIG instance, ``2 500/1000`` for a share."""
    return ", ".join(
        f"{g.index}"
        + (f" {g.mig_profile}" if g.mig_profile else "")
        + (f" {g.milli}/1000" if g.milli != 1000 else "")
        for g in p.gpus
    )


def _where(p: Placement) -> str:
    model = f", {p.gpu_model}" if p.gpu_model else ""
    return f"{p.node} ({p.kind}{model}, GPUs [{gpus_text(p)}])"


def _time(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def _usd(micro_usd: int) -> str:
    return f"${micro_usd / 1e6:,.6f}"


def _cost_text(c: JobCost) -> str:
    if c.report is not None:
        return (
            f"{_usd(c.report.cost_micro_usd)} in total ({c.report.gpu_hours:.3f} GPU-h; "
            f"the ledger's final report, revision {c.report.revision})"
        )
    if not c.entries:
        return "nothing billed yet (the ledger bills placed GPU time; CPU-only jobs cost nothing)"
    gpu_h = c.gpu_hours_micro / 1e6
    return f"{_usd(c.cost_micro_usd)} so far ({gpu_h:.3f} GPU-h, {c.entries} entries)"


def _state_lines(s: JobStatus) -> list[str]:
    if s.state is JobState.PLACED:
        return [f"placed on {_where(p)}" for p in s.placements]
    if s.state is JobState.WAITING and s.waiting is not None:
        # the words of the submit's own answer (`seedance jobs submit`)
        return [f"waiting ({s.waiting.reason}: {s.waiting.detail})"]
    if s.state is JobState.PREEMPTED and s.preempted is not None:
        by = f" by {s.preempted.by_job_id}" if s.preempted.by_job_id else ""
        line = f"preempted on {s.preempted.node}{by} ({s.preempted.reason}); queued again"
        return [line] + ([s.preempted.detail] if s.preempted.detail else [])
    if s.state is JobState.REJECTED and s.rejection is not None:
        return [f"rejected ({s.rejection.reason}): {s.rejection.detail}; it will not run"]
    if s.released is not None:
        held = (
            "ran on " + "; ".join(_where(p) for p in s.placements)
            if s.released.was_placed and s.placements
            else ("held resources" if s.released.was_placed else "never placed")
        )
        return [f"{s.released.outcome}, released ({held})"]
    return [str(s.state)]


def describe(s: JobStatus) -> str:
    """One job as a block of ``label  value`` lines (``seedance jobs status``)."""
    rows = [("job", f"{s.job_id} (tenant {s.tenant})"), ("state", str(s.state))]
    rows.append(("since", _time(s.since)))
    rows += [("", line) for line in _state_lines(s)]
    if s.rejection is not None and s.state is not JobState.REJECTED:
        r = s.rejection
        rows.append(("refused", f"a later {r.cause_type or 'request'}: {r.reason} ({r.detail})"))
    if s.preempted is not None and s.state is not JobState.PREEMPTED:
        p = s.preempted
        why = f" ({p.reason})" if p.reason else ""
        rows.append(("preempted", f"on {p.node} at {_time(p.at)}{why}"))
        if p.detail:
            rows.append(("", p.detail))
    rows.append(("cost", _cost_text(s.cost)))
    rows.append(("decisions", str(s.decisions)))
    return "\n".join(f"{label:<10} {value}" for label, value in rows)


def _brief(s: JobStatus) -> str:
    if s.state is JobState.PLACED:
        return " + ".join(f"{p.node} [{gpus_text(p)}]" for p in s.placements)
    if s.state is JobState.WAITING and s.waiting is not None:
        return f"{s.waiting.reason}: {s.waiting.detail}"
    if s.state is JobState.PREEMPTED and s.preempted is not None:
        return f"from {s.preempted.node} ({s.preempted.reason})"
    if s.state is JobState.REJECTED and s.rejection is not None:
        return f"{s.rejection.reason}: {s.rejection.detail}"
    if s.released is not None and not s.released.was_placed:
        return "never placed"
    return " + ".join(p.node for p in s.placements)


_HEAD = ("JOB", "STATE", "SINCE", "COST USD", "GPU-H", "WHERE / WHY")
_WHY_WIDTH = 60


def status_table(statuses: Iterable[JobStatus]) -> str:
    """Jobs as an aligned table (``seedance jobs list``); the last column is cut at 60 chars."""
    rows = [_HEAD]
    for s in statuses:
        c = s.cost
        micro = c.report.cost_micro_usd if c.report is not None else c.cost_micro_usd
        gpu_h = c.report.gpu_hours if c.report is not None else c.gpu_hours_micro / 1e6
        why = _brief(s)
        if len(why) > _WHY_WIDTH:
            why = why[: _WHY_WIDTH - 3] + "..."
        rows.append(
            (s.job_id, str(s.state), _time(s.since), f"{micro / 1e6:,.6f}", f"{gpu_h:.3f}", why)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEAD))]
    right = {3, 4}  # money and hours align right
    lines = []
    for r in rows:
        cells = [
            r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(r))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
