"""The key-value buckets and object stores of Seedance, declared once.

Owns their names, history, TTLs and size limits, and the keys that more than one service reads
or writes: the policy bucket's (the quota policy, the per-pool quota usage) and the router
replicas bucket's (`replica_key`). ``seedance.events.subjects``
re-exports them; ``seedance.core.bus`` creates them at start-up. It must not declare streams,
subjects or consumers (``seedance.events.subjects`` owns those) nor connect to a server.
"""

from __future__ import annotations

from seedance.events.specs import BucketSpec, ObjectStoreSpec
from seedance.events.tokens import check_tenant, check_token

__all__ = [
    "BUCKETS",
    "OBJECT_STORES",
    "POLICY_BUCKET",
    "QUOTA_POLICY_KEY",
    "QUOTA_USAGE_KEYS",
    "REPLICAS_BUCKET",
    "quota_usage_key",
    "replica_key",
]

_DAY_S = 86_400.0
#: Bucket of inference replicas that router gateways route to (`ReplicaRegistration`).
REPLICAS_BUCKET = "seedance-router-replicas"


BUCKETS: dict[str, BucketSpec] = {
    b.name: b
    for b in (
        BucketSpec("seedance-slicer-state", description="slicer state snapshot per pool"),
        BucketSpec(
            "seedance-leases",
            ttl_s=10.0,
            description="leader leases (slicer per pool, router planner per fleet)",
            # Each holder is granted its own keys only (permissions.KEY_GRANTS).
            direct=True,
        ),
        # The router fleet's planner state with the stream sequence of the last observation it
        # reflects (a `StateStore` under ``<fleet>.plan``), and the counts the fleet's other
        # gateways follow (``<fleet>.replicas``): a new leader or a restart resumes from it.
        BucketSpec(
            "seedance-router-plan",
            description="router planner state per fleet (state store + observation sequence)",
        ),
        BucketSpec(
            "seedance-ledger", description="cost-ledger checkpoints (core snapshot + sequence)"
        ),
        BucketSpec(
            "seedance-router-weights",
            history=5,
            description="routing weights shared by router gateways",
        ),
        # Idempotency by request id: a request already answered is not compiled again.
        BucketSpec(
            "seedance-graph-results",
            ttl_s=30 * _DAY_S,
            description="graph-compiler results by tenant and request id",
        ),
        # Each worker re-announces its execution providers well inside the TTL; a worker that
        # died drops out, so a cuda request never waits on a GPU worker that is gone.
        BucketSpec(
            "seedance-graph-workers",
            ttl_s=60.0,
            description="graph-compiler workers' capabilities (execution providers)",
        ),
        # Replicas join and leave without a gateway restart: one key per (model, replica), put
        # and deleted by a registrar (`replica_key`). No TTL: a registrar that only
        # writes on change (the bridge) would see its entries expire; a stale entry is harmless
        # because the gateway probes every replica and keeps an unready one out of traffic.
        BucketSpec(
            REPLICAS_BUCKET,
            description="inference replicas (model, replica, address, ready) router gateways use",
        ),
        # The Kubernetes bridge's record of the pod jobs it submitted and has not ended, so
        # that a pod deleted while no bridge ran still ends its job (tenant.job -> creation).
        BucketSpec(
            "seedance-k8s-bridge-jobs",
            description="pod jobs the k8s bridge submitted and has not yet ended",
        ),
        # Tenants added at run time: tenant id -> its password's scrypt hash; operators write,
        # the auth-callout service reads (seedance.core.auth_callout).
        BucketSpec("seedance-tenants", description="tenant credentials for the auth callout"),
        # Policy documents reconciled from the cluster's CRs by the k8s-bridge (key `quota`:
        # the slicer's QuotaPolicy, see QUOTA_POLICY_KEY); a little history for the operator.
        BucketSpec(
            "seedance-policy",
            history=5,
            description="policy documents the k8s-bridge reconciles from CRs (quota: the slicer's)",
        ),
    )
}

#: The bucket and key holding the slicer's quota policy (the JSON or YAML mapping that
#: QuotaPolicy.from_yaml parses). The k8s-bridge writes it, the slicer watches it.
POLICY_BUCKET = "seedance-policy"
QUOTA_POLICY_KEY = "quota"
#: Keys ``usage.<pool>``: per tenant, what the pool's slicer has admitted now (JSON
#: ``{"revision": <policy revision>, "tenants": {tenant: {dimension: amount}}}``); the slicer
#: writes its pool's, the k8s-bridge reads them all into the TenantQuota statuses.
QUOTA_USAGE_KEYS = "usage.*"
#: The key holding the SlicingPolicy in force (`seedance.events.slicing_policy.SlicingPolicyDoc`
#: as JSON): the k8s-bridge writes it from the `default` SlicingPolicy CR, the slicer watches
#: it and says in its ``usage.<pool>`` document which of its fields it follows.
SLICING_POLICY_KEY = "slicing"


def quota_usage_key(pool: str) -> str:
    """The KV key (bucket POLICY_BUCKET) of pool `pool`'s quota usage."""
    return f"usage.{check_token('pool', pool)}"


def replica_key(fleet: str, model: str, replica: str, owner: str = "") -> str:
    """Key of one replica serving one model in `REPLICAS_BUCKET`: ``<fleet>.<model>.<replica>``
    in the operator's shared pool, ``<fleet>.<owner>.<model>.<replica>`` for a tenant's own
    (``owner``, its tenant id: a gateway sends it that tenant's requests only).

    A gateway of fleet ``f`` watches ``f.>``; a registrar (the Kubernetes bridge from
    EndpointSlices, an operator) puts one key per (model, replica) and deletes it on leave.
    """
    head = check_token("fleet", fleet) + (f".{check_tenant(owner)}" if owner else "")
    return f"{head}.{check_token('model', model)}.{check_token('replica', replica)}"


OBJECT_STORES: dict[str, ObjectStoreSpec] = {
    o.name: o
    for o in (
        ObjectStoreSpec(
            "seedance-router-models",
            max_bytes=256 * 1024**2,
            description="versioned router forecast models (LightGBM)",
        ),
        # Models to compile (inputs/<tenant>/...) and compiled artifacts (artifacts/<tenant>/...)
        # up to the compiler's inline limit; larger artifacts go by reference (path + sha256).
        ObjectStoreSpec(
            "seedance-graph-models",
            ttl_s=30 * _DAY_S,
            max_bytes=16 * 1024**3,
            description="graph-compiler inputs and compiled ONNX artifacts",
        ),
    )
}
