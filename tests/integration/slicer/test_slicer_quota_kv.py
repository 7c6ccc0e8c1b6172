"""The slicer reads its quota policy from KV (`seedance-policy`), as the k8s-bridge writes it.

Real nats-server, real SlicerService: a new document replaces the file's between batches (a
raised quota admits held jobs, a lowered one preempts nothing), an invalid one is refused with
its reason and the old policy stays, deleting the key returns to the file's, the snapshot
carries the policy in force to a restart and a standby, and what the bridge's reconciler makes
of the example CRs the slicer accepts (and what it refuses, the slicer refuses too). Under the
shipped permissions the slicer reads the key and cannot write it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import StateStore
from seedance.events.slicing import Placement, Unschedulable
from seedance.events.subjects import POLICY_BUCKET, QUOTA_POLICY_KEY, quota_usage_key
from seedance.k8s_bridge.core.policy import TENANT_QUOTA, merge_usage, reconcile, tenant_entry
from seedance.slicer.durable import SlicerState
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.paths import REPO
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.slicer import test_slicer_service as base
from tests.integration.slicer.test_slicer_service import (
    Decisions,
    add_nodes,
    finish,
    inventory,
    nodes_known,
    slicer,
    submit,
)
from tests.unit.slicer.test_quota_yaml_bounds import alias_bomb

env = base.env  # the fixture: this test's durables fast-forwarded, its decisions followed

EXAMPLES = REPO / "deploy" / "k8s" / "examples"


def doc(tenants: dict[str, Any]) -> bytes:
    return json.dumps({"version": 1, "tenants": tenants}).encode()


def updates(svc: SlicerService, outcome: str) -> float:
    value = svc._rt.registry.get_sample_value(
        "seedance_slicer_quota_updates_total", {"outcome": outcome}
    )
    return value or 0.0


def usage_of(svc: SlicerService) -> dict[str, Any]:
    """What the slicer last wrote to its pool's usage key (its own record of it)."""
    return dict(json.loads(svc.quota.usage_written or b"{}").get("tenants") or {})


async def until(pred: Any, timeout_s: float = 15.0) -> None:
    async def check() -> bool:
        return bool(pred())

    await eventually(check, timeout_s)


@pytest.fixture
async def policy_kv(bus: Bus) -> Any:
    return await ensure_bucket(bus, POLICY_BUCKET)


async def test_a_kv_policy_replaces_the_files_between_batches_and_held_jobs_follow(
    nats_url: str, env: tuple[Bus, Decisions], unique: str, tmp_path: Path, policy_kv: Any
) -> None:
    bus, d = env
    t = f"t{unique}"
    quota = tmp_path / "quota.yaml"
    quota.write_text(f"version: 1\ntenants:\n  {t}: {{quota: {{gpus: 1}}}}\n")
    key = f"quota-{unique}"
    await add_nodes(bus, inventory(f"n-{unique}", 4))
    async with slicer(nats_url, unique, quota_file=str(quota), quota_key=key) as svc:
        await until(lambda: svc.leading)
        await nodes_known(svc, f"n-{unique}")  # a2's first decision is over_quota, not no_capacity
        await submit(bus, t, "a1", gpus=1, minute=1)
        await submit(bus, t, "a2", gpus=1, minute=2)
        await d.wait(lambda: [e.reason for e in d.of(Unschedulable, "a2")] == ["over_quota"])
        assert [p.job_id for p in d.of(Placement)] == ["a1"]

        # the bridge raises the quota: the held job is placed, with no event from the tenant
        await policy_kv.put(key, doc({t: {"quota": {"gpus": 3}}}))
        await d.wait(lambda: [p.job_id for p in d.of(Placement)] == ["a1", "a2"])
        assert updates(svc, "applied") == 1
        assert svc.scheduler.quota is not None
        assert svc.scheduler.quota.tenants[t].nominal == {"gpus": 3}
        # the pool's usage, as the bridge reads it into the TenantQuota status
        await until(lambda: usage_of(svc) == {t: {"gpus": 2}})
        entry = await policy_kv.get(quota_usage_key(f"p{unique}"))
        written = json.loads(entry.value)
        assert merge_usage([written]) == {t: {"gpus": 2}}
        assert written["revision"] == (await policy_kv.get(key)).revision  # the policy's

        # lowered below what runs: both keep running, a new job waits until enough ended
        await policy_kv.put(key, doc({t: {"quota": {"gpus": 1}}}))
        await until(lambda: updates(svc, "applied") == 2)
        assert sorted(svc.scheduler.running_ids) == ["a1", "a2"]
        await submit(bus, t, "a3", gpus=1, minute=3)
        await d.wait(lambda: [e.reason for e in d.of(Unschedulable, "a3")] == ["over_quota"])
        await finish(bus, t, "a1", minute=4)
        await finish(bus, t, "a2", minute=5)
        await d.wait(lambda: "a3" in [p.job_id for p in d.of(Placement)])

        # the key deleted: the file's policy (1 GPU) again
        await policy_kv.delete(key)
        await until(lambda: updates(svc, "applied") == 3)
        assert svc.scheduler.quota is not None
        assert svc.scheduler.quota.tenants[t].nominal == {"gpus": 1}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"version: 2\ntenants: {}\n", "version: expected 1, got 2"),
        (b"{not json nor yaml", "not valid YAML"),
        (b"\xff\xfe", "codec can't decode"),
        (
            doc({"x": {"cohort": None, "lending_limit": {"gpus": 1}, "quota": {"gpus": 1}}}),
            "tenants.x.lending_limit: only meaningful with a cohort",
        ),
        # the review's probe (depth 6 of its 9): the refusal's repr of the expanded aliases was
        # ~17 MB here, ~12.7 GB at depth 9 (a MemoryError that took down every replica)
        (alias_bomb(6).encode(), "anchors and aliases are not accepted"),
        # 4 KB of brackets: RecursionError out of the parser took the leader down
        (b"version: 1\ntenants: " + b"[" * 2000 + b"]" * 2000, "nested deeper than 32 levels"),
    ],
    ids=["version", "not_yaml", "not_utf8", "lending_without_cohort", "alias_bomb", "deep"],
)
async def test_an_invalid_policy_is_refused_with_its_reason_and_the_old_one_stays(
    nats_url: str,
    env: tuple[Bus, Decisions],
    unique: str,
    policy_kv: Any,
    bad: bytes,
    reason: str,
) -> None:
    bus, d = env
    t = f"t{unique}"
    key = f"quota-{unique}"
    await add_nodes(bus, inventory(f"n-{unique}", 4))
    await policy_kv.put(key, doc({t: {"quota": {"gpus": 1}}}))
    async with slicer(nats_url, unique, quota_key=key) as svc:
        await until(lambda: updates(svc, "applied") == 1)
        await policy_kv.put(key, bad)
        await until(lambda: updates(svc, "refused") == 1)
        assert svc.quota.refusal is not None
        assert reason in svc.quota.refusal  # the parser's words, as logged
        assert len(svc.quota.refusal) <= 1000
        assert svc.scheduler.quota is not None
        assert svc.scheduler.quota.tenants[t].nominal == {"gpus": 1}
        # still the old policy, and the service still decides
        await submit(bus, t, "b1", gpus=1, minute=1)
        await submit(bus, t, "b2", gpus=1, minute=2)
        await d.wait(lambda: [e.reason for e in d.of(Unschedulable, "b2")] == ["over_quota"])
        await policy_kv.put(key, doc({t: {"quota": {"gpus": 2}}}))
        await d.wait(lambda: "b2" in [p.job_id for p in d.of(Placement)])
        assert updates(svc, "refused") == 1
        assert svc.quota.refusal is None


async def test_the_snapshot_carries_the_policy_to_a_restart_and_a_standby(
    nats_url: str, env: tuple[Bus, Decisions], unique: str, policy_kv: Any, bus: Bus
) -> None:
    _, d = env
    t = f"t{unique}"
    key = f"quota-{unique}"
    await add_nodes(bus, inventory(f"n-{unique}", 4))
    policy = doc({t: {"quota": {"gpus": 2}}})
    await policy_kv.put(key, policy)
    async with slicer(nats_url, unique, replica="a", quota_key=key) as first:
        await until(lambda: updates(first, "applied") == 1)
        async with slicer(nats_url, unique, replica="b", quota_key=key) as second:
            for i in range(3):
                await submit(bus, t, f"c{i}", gpus=1, minute=i)
            await d.wait(lambda: [e.reason for e in d.of(Unschedulable, "c2")] == ["over_quota"])
            saved = first.durable.new_state(
                await StateStore.open(bus, "seedance-slicer-state", f"pool.p{unique}")
            )
            assert isinstance(saved, SlicerState)
            await saved.load()
            assert saved.quota_doc == policy
            await first.stop()
            await until(lambda: second.leading, 30)
            # the standby restored the state and the policy it was decided under: nothing to
            # apply, the same accounting (c2 still waits until one of c0, c1 ends)
            assert second.scheduler.quota is not None
            assert second.scheduler.quota.tenants[t].nominal == {"gpus": 2}
            assert updates(second, "applied") == 0
            await finish(bus, t, "c0", minute=5)
            await d.wait(lambda: "c2" in [p.job_id for p in d.of(Placement)])
            assert sorted(second.scheduler.running_ids) == ["c1", "c2"]


def _examples() -> list[dict[str, Any]]:
    return [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]


async def test_the_slicer_takes_what_the_reconciler_makes_of_the_examples_and_refuses_the_rest(
    nats_url: str, env: tuple[Bus, Decisions], unique: str, policy_kv: Any
) -> None:
    bus, d = env
    key = f"quota-{unique}"
    classes = {"seedance-high": 1000, "seedance-normal": 100, "seedance-low": 0}
    crs = [c for c in _examples() if c["kind"] == TENANT_QUOTA]
    out = reconcile([], crs, priority_classes=classes)
    assert out.quota_document is not None
    async with slicer(nats_url, unique, quota_key=key) as svc:
        await until(lambda: svc.leading)
        await policy_kv.put(key, json.dumps(out.quota_document).encode())
        await until(lambda: updates(svc, "applied") == 1)
        assert svc.scheduler.quota is not None
        assert set(svc.scheduler.quota.tenants) == {"acme", "team-a", "team-b"}
        assert svc.scheduler.quota.tenants["team-b"].max_priority == 1000
        # each invalid example the reconciler refuses, put in the document anyway: refused
        for path in sorted((EXAMPLES / "invalid").glob("*.yaml")):
            cr = list(yaml.safe_load_all(path.read_text()))[-1]
            if cr["kind"] != TENANT_QUOTA or path.stem in ("namespace-twice", "tenant-renamed"):
                continue  # not the slicer's to know: bindings and the API server's old object
            refused = reconcile([], [cr], priority_classes=classes)
            assert refused.quota_document is None, path.stem
            bad = {**out.quota_document, "tenants": {"bad": tenant_entry(cr["spec"])}}
            before = updates(svc, "refused")
            await policy_kv.put(key, json.dumps(bad).encode())
            await until(lambda b=before: updates(svc, "refused") == b + 1)  # type: ignore[misc]
        assert set(svc.scheduler.quota.tenants) == {"acme", "team-a", "team-b"}
    del bus, d


async def test_under_the_shipped_permissions_the_slicer_reads_the_key_and_cannot_write_it(
    auth_url: str, unique: str
) -> None:
    admin = await Bus.connect(
        BusSettings(url=auth_url, user="admin", password=shipped_password("admin"))
    )
    try:
        await admin.ensure_streams()
        kv = await ensure_bucket(admin, POLICY_BUCKET)
        await kv.put(QUOTA_POLICY_KEY, doc({"acme": {"quota": {"gpus": 7}}}))
        settings = SlicerSettings(pool=f"p{unique}", replica="a", lease_ttl_s=1.5)
        runtime = ServiceRuntime(
            "slicer",
            BusSettings(url=auth_url, user="slicer", password=shipped_password("slicer")),
        )
        async with serving(SlicerService.build(runtime, WallClock(), settings), 15) as svc:
            await until(lambda: updates(svc, "applied") == 1)
            assert svc.scheduler.quota is not None
            assert svc.scheduler.quota.tenants["acme"].nominal == {"gpus": 7}
            own = await svc._rt.bus.js.key_value(POLICY_BUCKET)
            with pytest.raises(Exception, match=r"(?i)permission|timeout|no response"):
                await own.put(QUOTA_POLICY_KEY, doc({"acme": {"quota": {"gpus": 99}}}))
            await until(lambda: svc.quota.usage_written is not None)
        assert (await kv.get(QUOTA_POLICY_KEY)).value == doc({"acme": {"quota": {"gpus": 7}}})
        # the slicer may write its pool's usage (an operator reads it back)
        usage = json.loads((await kv.get(quota_usage_key(f"p{unique}"))).value)
        assert usage["tenants"] == {"acme": {}}
        await kv.delete(QUOTA_POLICY_KEY)
    finally:
        await admin.close()
