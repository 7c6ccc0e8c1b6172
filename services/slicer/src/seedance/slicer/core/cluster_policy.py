"""The SlicingPolicy in force (the brief's ClusterPolicy) applied to requests, and which of its
fields the slicer follows.

Owns two pure answers for the shell (`seedance.slicer.cluster_policy`):

- `with_default_profile`: a request for "a MIG instance" (`JobSpec.mig` without a profile)
  gets the policy's `spec.mig.defaultProfile`; without one it stays unnamed and the scheduler
  refuses it (`invalid_request`, naming the field).
- `unhonoured`: per CR field the slicer does not follow, why. A status must never say a field
  is followed when it is not: the bridge reports `PartiallyInForce` with these fields.

What it follows: `spec.mig.defaultProfile`; `spec.mig.strategy: mixed` (its layout search
mixes profiles on a GPU); `spec.placementPolicy` when it is the policy the slicer runs (set
at its start: ``SEEDANCE_SLICER_POLICY``). What it does not, yet: `spec.mig.strategy` `single`
or `none` (the planner does not restrict layouts to one profile, nor refuse MIG work), and
`spec.sharedGpu` (sharers per GPU and MPS memory limits per model: sharing is decided by
milli-shares and measured use, `core.sharing`, and not capped per model yet).

No clock, no I/O; it places nothing.
"""

from __future__ import annotations

import msgspec

from seedance.events.slicing_policy import SlicingPolicyDoc
from seedance.slicer.core.inputs import JobSpec

__all__ = ["unhonoured", "with_default_profile"]


def with_default_profile(job: JobSpec, policy: SlicingPolicyDoc | None) -> JobSpec:
    """`job` with the policy's default MIG profile when it asks for a MIG instance without
    naming one; otherwise `job` as it is."""
    if not job.mig or job.mig_profile is not None or policy is None:
        return job
    if policy.mig_default_profile is None:
        return job
    return msgspec.structs.replace(job, mig_profile=policy.mig_default_profile)


def unhonoured(policy: SlicingPolicyDoc, placement_policy: str) -> dict[str, str]:
    """CR field path -> why the slicer running `placement_policy` does not follow it."""
    out: dict[str, str] = {}
    if policy.placement_policy != placement_policy:
        out["spec.placementPolicy"] = (
            f"the slicer runs {placement_policy!r}, set at its start (SEEDANCE_SLICER_POLICY); "
            f"{policy.placement_policy!r} takes effect when it is started with it"
        )
    if policy.mig_strategy != "mixed":
        out["spec.mig.strategy"] = (
            f"{policy.mig_strategy!r} is not enforced: the MIG planner mixes profiles on a GPU"
        )
    for i, shared in enumerate(policy.shared_gpu):
        out[f"spec.sharedGpu[{i}]"] = (
            f"{shared.gpu_model}: {shared.replicas} {shared.mode} sharers per GPU is not "
            "enforced yet (sharing is decided by milli-shares and measured use)"
        )
    return out
