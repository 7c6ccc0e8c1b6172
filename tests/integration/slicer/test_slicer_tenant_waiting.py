"""One tenant's waiting jobs cannot stall another tenant's job ends, against a real nats-server.

The slicer runs in-process under its shipped user with a quota in force; tenant-acme and
tenant-globex publish on their own subjects as their shipped users. acme fills its bound on
waiting jobs (all held over its quota), and its next submit is refused by name. globex holds a
GPU and cycles (submit the next job, held over its quota; end the current one: the next is
placed). On main every globex end re-checked each of acme's held jobs (probe F1: 5,000 of them
took 7.1 s per release, and the leader lost its lease); now it re-checks globex's one held job,
as when acme is quiet. Counted, not timed: `seedance_slicer_held_rechecked_total`; the time is
`make bench-slicer-release`'s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from seedance.core import Bus
from seedance.events import new_event_id
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.slicing import JobRejected, Placement, Unschedulable
from seedance.events.subjects import inbox_prefix, jobs
from seedance.slicer.service import SlicerService
from seedance.testing.identities import ADMIN, as_user
from seedance.testing.waits import eventually
from tests.integration.slicer.test_slicer_claims import live_node, of
from tests.integration.slicer.test_slicer_service import Decisions, fast_forward, slicer

BOUND = 40


def _sub(tenant: str, job: str, **req: object) -> JobSubmitted:
    return JobSubmitted(
        id=new_event_id(), at=datetime.now(UTC), job_id=job, tenant=tenant,
        request=ResourceRequest(gpus=1, **req),  # type: ignore[arg-type]
    )  # fmt: skip


def rechecked(svc: SlicerService) -> float:
    value = svc._rt.registry.get_sample_value("seedance_slicer_held_rechecked_total")
    assert value is not None, "the slicer counts no held-job re-checks"
    return value


async def _cycle(globex: Bus, d: Decisions, svc: SlicerService, k: int) -> float:
    """globex's g<k+1> waits for its quota, g<k> ends, g<k+1> is placed: the re-checks
    that end cost."""
    await globex.publish(jobs.subject("globex", "submitted"), _sub("globex", f"g{k + 1}"))
    await d.wait(lambda: bool(of(d, Unschedulable, "globex", f"g{k + 1}")))
    before = rechecked(svc)
    end = JobFinished(id=new_event_id(), at=datetime.now(UTC), job_id=f"g{k}", tenant="globex")
    await globex.publish(jobs.subject("globex", "finished"), end)
    await d.wait(lambda: bool(of(d, Placement, "globex", f"g{k + 1}")))

    async def counted() -> bool:  # the metric follows the batch's commit
        return rechecked(svc) > before

    await eventually(counted, 15, what="the release's re-checks counted")
    return rechecked(svc) - before


async def test_a_tenant_at_its_waiting_bound_costs_another_tenants_release_nothing(
    nats_url: str, unique: str, tmp_path: Path
) -> None:
    quota = tmp_path / "quota.yaml"
    quota.write_text(
        "version: 1\ntenants:\n  acme: {quota: {gpus: 1}}\n  globex: {quota: {gpus: 1}}\n"
    )
    admin = await Bus.connect(as_user(nats_url, ADMIN))
    acme = await Bus.connect(as_user(nats_url, "tenant-acme", inbox_prefix=inbox_prefix("acme")))
    globex = await Bus.connect(
        as_user(nats_url, "tenant-globex", inbox_prefix=inbox_prefix("globex"))
    )
    d: Decisions | None = None
    try:
        await admin.ensure_streams()
        await fast_forward(admin, unique)
        d = await Decisions.open(admin, "acme", "globex")
        settings = {"quota_file": str(quota), "max_waiting_per_tenant": BOUND}
        async with slicer(nats_url, unique, **settings) as svc:
            await live_node(admin, svc, f"n0-{unique}", 2)
            await globex.publish(jobs.subject("globex", "submitted"), _sub("globex", "g0"))
            await d.wait(lambda: bool(of(d, Placement, "globex", "g0")))
            quiet = [await _cycle(globex, d, svc, k) for k in range(2)]

            # acme: one job runs (its quota), BOUND wait over quota (distinct shapes too),
            # and the next is refused, naming the bound and the count.
            await acme.publish(jobs.subject("acme", "submitted"), _sub("acme", "a0"))
            for i in range(1, BOUND + 1):
                await acme.publish(
                    jobs.subject("acme", "submitted"), _sub("acme", f"a{i}", gpu_mem_mib=i)
                )
            await acme.publish(jobs.subject("acme", "submitted"), _sub("acme", "over"))
            await d.wait(lambda: bool(of(d, JobRejected, "acme", "over")))
            assert len(of(d, Placement, "acme", "a0")) == 1
            assert all(
                [e.reason for e in of(d, Unschedulable, "acme", f"a{i}")] == ["over_quota"]
                for i in range(1, BOUND + 1)
            )
            (rejected,) = of(d, JobRejected, "acme", "over")
            assert rejected.reason == "too_many_waiting"
            assert f"has {BOUND} jobs waiting" in rejected.detail
            assert f"bound of {BOUND}" in rejected.detail
            assert ("acme", "over") not in svc.scheduler.waiting_jobs

            busy = [await _cycle(globex, d, svc, k) for k in range(2, 4)]
            # globex's end re-checks globex's one held job, acme's flood or not.
            assert quiet == [1.0, 1.0]
            assert busy == quiet, ("acme's held jobs were re-checked on globex's release", busy)
    finally:
        if d is not None:
            await d.close()
        for bus in (admin, acme, globex):
            await bus.close()
