"""The SlicingPolicy in force applied to requests, and the fields the slicer says it does not
follow (issue 28, item 4): a status built from them never says a field is followed when it is
not."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedance.events.jobs import ResourceRequest
from seedance.events.slicing_policy import (
    SlicingPolicyDoc,
    decode_policy,
    digest,
    encode_policy,
    from_spec,
)
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.core import GpuSpec, JobSpec, NodeSpec, Placed, Refused, Scheduler
from seedance.slicer.core.cluster_policy import unhonoured, with_default_profile

SPEC = {
    "placementPolicy": "seedance",
    "mig": {"strategy": "mixed", "defaultProfile": "3g.40gb"},
}


def job(**kw: object) -> JobSpec:
    return JobSpec(job_id="j", tenant="a", **kw)  # type: ignore[arg-type]


def test_a_request_for_a_mig_instance_gets_the_default_profile() -> None:
    policy = from_spec(SPEC)
    assert with_default_profile(job(mig=True), policy).mig_profile == "3g.40gb"
    # a named profile, or a request that is not for MIG, is left as it is
    assert with_default_profile(job(mig=True, mig_profile="1g.10gb"), policy).mig_profile == (
        "1g.10gb"
    )
    assert with_default_profile(job(), policy).mig_profile is None
    assert with_default_profile(job(mig=True), None).mig_profile is None


def test_the_scheduler_places_it_and_refuses_one_without_a_default_naming_the_field() -> None:
    s = Scheduler()
    gpu = GpuSpec(model="NVIDIA A100-SXM4-80GB", mig_capable=True, mig_enabled=True)
    s.upsert_node(NodeSpec(name="n", cpu_milli=8000, memory_mib=64_000, gpus=(gpu,)), 0)
    (placed,) = s.submit(with_default_profile(job(mig=True), from_spec(SPEC)), 1)
    assert isinstance(placed, Placed)
    assert placed.gpus[0].mig_profile == "3g.40gb"
    (refused,) = s.submit(JobSpec(job_id="k", tenant="a", mig=True), 2)
    assert isinstance(refused, Refused)
    assert refused.reason == "invalid_request"
    assert "spec.mig.defaultProfile" in refused.detail


def test_a_mig_request_takes_one_instance_on_the_wire_too() -> None:
    assert ResourceRequest(mig=True).mig
    with pytest.raises(ValueError, match="a MIG request takes one instance"):
        ResourceRequest(mig=True, gpus=2)


def test_what_the_slicer_does_not_follow_is_named() -> None:
    assert unhonoured(from_spec(SPEC), "seedance") == {}
    spec = {
        "placementPolicy": "first-fit",
        "mig": {"strategy": "single"},
        "sharedGpu": [{"gpuModel": "NVIDIA H100 80GB HBM3", "replicas": 8}],
    }
    out = unhonoured(from_spec(spec), "seedance")
    assert sorted(out) == ["spec.mig.strategy", "spec.placementPolicy", "spec.sharedGpu[0]"]
    assert "the slicer runs 'seedance'" in out["spec.placementPolicy"]
    assert "8 time-slicing sharers per GPU is not enforced" in out["spec.sharedGpu[0]"]


def test_the_document_round_trips_and_one_policy_is_one_digest() -> None:
    doc = from_spec(SPEC)
    data = encode_policy(doc)
    assert decode_policy(data) == doc
    assert encode_policy(decode_policy(data)) == data
    assert digest(data) != digest(encode_policy(SlicingPolicyDoc()))


def test_the_follower_takes_the_kv_document_over_the_file_and_refuses_a_bad_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "slicing.json"
    path.write_bytes(encode_policy(SlicingPolicyDoc(mig_default_profile="1g.10gb")))
    follower = ClusterPolicy("seedance", key="slicing", file=str(path))
    assert follower.resolve(job(mig=True)).mig_profile == "1g.10gb"
    file_applied = follower.applied()
    assert file_applied is not None
    assert file_applied.key == ""  # the file's: no KV key followed
    data = encode_policy(from_spec(SPEC))
    follower.seen(data)
    assert follower.resolve(job(mig=True)).mig_profile == "3g.40gb"
    applied = follower.applied()
    assert applied is not None
    assert (applied.digest, applied.key, applied.unhonoured) == (digest(data), "slicing", {})
    follower.seen(b'{"mig_default_profile": 7}')
    assert follower.refusal is not None
    assert follower.resolve(job(mig=True)).mig_profile == "3g.40gb"  # the old one stays
    follower.seen(None)  # deleted: the file's again
    assert follower.resolve(job(mig=True)).mig_profile == "1g.10gb"
