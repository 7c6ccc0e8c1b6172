"""The catalogue's public surface, pinned: ``seedance.events.subjects`` is the one place its
names are imported from, also those split out of it to keep it under the module size cap
(`stores`, `tenant_names`, `tenant_subjects`). A name added or dropped is a decision; a name
defined twice (one re-export drifting from its home) would let two services disagree."""

from __future__ import annotations

from seedance.events import stores, subjects, tenant_names, tenant_subjects


def test_the_catalogue_exports_exactly_these_names() -> None:
    assert sorted(subjects.__all__) == [
        "BUCKETS",
        "BucketSpec",
        "CONSUMERS",
        "ConsumerSpec",
        "Header",
        "OBJECT_STORES",
        "ObjectStoreSpec",
        "POLICY_BUCKET",
        "QUOTA_POLICY_KEY",
        "QUOTA_USAGE_KEYS",
        "STREAMS",
        "StreamSource",
        "StreamSpec",
        "SubjectShapeError",
        "TENANT_CONSUMERS",
        "TENANT_KINDS",
        "TENANT_PUBLISHED",
        "TRUSTED_FAMILIES",
        "TenantSubject",
        "api",
        "consumer",
        "consumer_create",
        "cost_reader",
        "costs",
        "deliver_prefix",
        "dlq",
        "fleet_plan_consumer",
        "graph",
        "inbox_prefix",
        "jobs",
        "ledger",
        "models",
        "observed",
        "owner_of",
        "parse_tenant_subject",
        "published_by_tenant",
        "quota_usage_key",
        "replica_consumer",
        "routing",
        "slicing",
        "subject_tenant",
        "telemetry",
        "tenant_consumers",
    ]
    assert all(hasattr(subjects, name) for name in subjects.__all__)


def test_names_split_out_of_the_catalogue_are_the_same_objects_there() -> None:
    split = [
        (name, module)
        for module in (stores, tenant_names, tenant_subjects)
        for name in module.__all__
        if name in subjects.__all__
    ]
    assert {n for n, _ in split} >= {"SubjectShapeError", "owner_of", "TENANT_KINDS", "BUCKETS"}
    assert [n for n, m in split if getattr(subjects, n) is not getattr(m, n)] == []
    # Kept under their family where their users import them from.
    assert subjects.routing.replica_key is stores.replica_key
    assert subjects.routing.REPLICAS_BUCKET == stores.REPLICAS_BUCKET in stores.BUCKETS
    assert subjects.api.scope_of is tenant_subjects.allocation_scope
    assert subjects.api.FLEET == tenant_subjects.FLEET_SCOPE
