"""The slicer follows the SlicingPolicy in force from KV (`seedance-policy`, key ``slicing``), as
the k8s-bridge writes it from the `default` CR, and says which fields it follows.

Real nats-server, real SlicerService: a request for "a MIG instance" gets the policy's default
profile (and is refused, naming the field, while no policy names one); the pool's usage
document carries the digest of the document applied and the fields not followed, which the
bridge's reconciler turns into `PartiallyInForce`; a document that does not decode is refused
and the old policy stays.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from seedance.core import Bus
from seedance.core.kv import ensure_bucket
from seedance.events.slicing import JobRejected, Placement
from seedance.events.slicing_policy import digest, encode_policy, from_spec
from seedance.events.stores import POLICY_BUCKET, quota_usage_key
from seedance.k8s_bridge.core.policy import READY, SLICING_POLICY, merge_applied, reconcile
from seedance.testing.waits import eventually
from tests.integration.slicer import test_slicer_service as base
from tests.integration.slicer.test_slicer_service import (
    Decisions,
    add_nodes,
    inventory,
    slicer,
    submit,
)

env = base.env

SPEC = {
    "placementPolicy": "seedance",
    "mig": {"strategy": "mixed", "defaultProfile": "2g.20gb"},
    "sharedGpu": [{"gpuModel": "NVIDIA H100 80GB HBM3", "mode": "time-slicing", "replicas": 8}],
}


@pytest.fixture
async def policy_kv(bus: Bus) -> Any:
    return await ensure_bucket(bus, POLICY_BUCKET)


async def test_a_mig_request_gets_the_default_profile_and_the_status_names_what_is_not_followed(
    nats_url: str, env: tuple[Bus, Decisions], unique: str, policy_kv: Any
) -> None:
    bus, d = env
    t = f"t{unique}"
    key = f"slicing-{unique}"
    await add_nodes(
        bus,
        inventory(f"a100-{unique}", 1, "NVIDIA A100-SXM4-80GB", mig_capable=True, mig_enabled=True),
    )
    async with slicer(nats_url, unique, slicing_key=key, quota_key="") as svc:

        async def leading() -> bool:
            return svc.leading

        await eventually(leading, 15)
        # no policy in force: a MIG instance without a profile is refused, naming the field
        await submit(bus, t, "m0", mig=True)
        await d.wait(lambda: bool(d.of(JobRejected, "m0")))
        (rejected,) = d.of(JobRejected, "m0")
        assert "spec.mig.defaultProfile" in rejected.detail

        data = encode_policy(from_spec(SPEC))
        await policy_kv.put(key, data)

        async def in_force() -> bool:
            return svc.cluster_policy.policy is not None

        await eventually(in_force, 15)
        await submit(bus, t, "m1", mig=True, minute=2)
        await d.wait(lambda: bool(d.of(Placement, "m1")))
        (placed,) = d.of(Placement, "m1")
        assert [g.mig_profile for g in placed.gpus] == ["2g.20gb"]

        # what the pool's slicer says it follows, as the bridge reads it
        async def reported() -> bool:
            written = json.loads(svc.quota.usage_written or b"{}")
            return (written.get("slicing") or {}).get("digest") == digest(data)

        await eventually(reported, 15)
        entry = await policy_kv.get(quota_usage_key(f"p{unique}"))
        applied = merge_applied({entry.key: json.loads(entry.value)}, key)
        assert set(applied[entry.key].unhonoured) == {"spec.sharedGpu[0]"}
        cr = {
            "apiVersion": "seedance.io/v1alpha1", "kind": "SlicingPolicy",
            "metadata": {"name": "default", "generation": 1,
                         "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": SPEC,
        }  # fmt: skip
        out = reconcile([cr], [], slicing_applied=applied)
        ready = {c["type"]: c for c in out.statuses[(SLICING_POLICY, "default")]["conditions"]}
        assert (ready[READY]["status"], ready[READY]["reason"]) == ("True", "PartiallyInForce")
        assert "spec.sharedGpu[0]" in ready[READY]["message"]

        # a document that does not decode is refused; the old policy stays
        await policy_kv.put(key, b'{"mig_default_profile": 7}')

        async def refused() -> bool:
            return svc.cluster_policy.refusal is not None

        await eventually(refused, 15)
        assert svc.cluster_policy.policy == from_spec(SPEC)
