"""The slicer's settings (``SEEDANCE_SLICER_*``)."""

from __future__ import annotations

import msgspec

from seedance.core.durable import LEASE_BUCKET
from seedance.events.stores import BUCKETS, SLICING_POLICY_KEY
from seedance.events.subjects import QUOTA_POLICY_KEY

__all__ = ["SlicerSettings"]


class SlicerSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: Names the leader lease (``slicer.<pool>``) and the state snapshot key (``pool.<pool>``).
    pool: str = "default"
    #: This replica's name in the leader lease (default: host name, pid and a random suffix,
    #: `seedance.core.holder.default_holder`).
    replica: str = ""
    #: How long a leader holds its lease without a refresh that succeeded (one every ttl/3):
    #: > 0 and at most the leases bucket's TTL, past which the key is gone and a standby may
    #: lead (validated below: a longer one had two leaders for a while, and from 3x the
    #: bucket's TTL on the key expired between every two refreshes).
    lease_ttl_s: float = 10.0
    http_port: int = 9401
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: Jobs handled per fetched batch; one state snapshot is written per batch.
    batch: int = 100
    #: ``seedance`` (SeedancePolicy, backfill, reservations, priority preemption) or
    #: ``first-fit`` (first-fit, strict FIFO: the queueing baseline).
    policy: str = "seedance"
    #: How far a node's inventory or health may be dated past the server's receive time before
    #: it is dead-lettered (``future_time``, ``seedance.slicer.intake``): a publisher's clock
    #: a little off is fine, a fact from the future never moves the slicer's clock. A replay
    #: whose virtual time runs ahead of the wall clock sets more. (A tenant's claimed `at`
    #: counts for nothing at all: ``seedance.slicer.trusted_time``.)
    telemetry_ahead_s: float = 10.0
    #: ``receive``: a tenant's request happens at the stream's receive time (above). ``replay``:
    #: at the latest trusted time the slicer has seen, for a fleet replayed in virtual time (the
    #: demo, the chaos runs), where the server's clock is not the fleet's: a tenant's request
    #: then happens "now" in the replay and can no more move its clock than in a live fleet.
    request_clock: str = "receive"
    #: A QuotaPolicy YAML (docs/slicer-mig-quota-k8s.md); empty: no quotas, every tenant known.
    quota_file: str = ""
    #: The KV key (bucket ``seedance-policy``) holding the quota policy, written by the
    #: k8s-bridge from the TenantQuota CRs (docs/k8s-crds.md); empty: not watched. A document
    #: there replaces ``quota_file``'s between batches; deleting the key returns to
    #: ``quota_file``'s. Another key is for tests side by side on one server: the generated
    #: NATS permissions grant the catalogue's key (``QUOTA_POLICY_KEY``) alone.
    quota_key: str = QUOTA_POLICY_KEY
    #: The KV key (bucket ``seedance-policy``) holding the SlicingPolicy in force, written by
    #: the k8s-bridge from the ``default`` SlicingPolicy CR (docs/k8s-crds.md); empty: not
    #: watched. Another key is for tests side by side on one server (as ``quota_key``).
    slicing_key: str = SLICING_POLICY_KEY
    #: The same document as a JSON file (`seedance.events.slicing_policy.SlicingPolicyDoc`),
    #: in force while the key holds none: the SlicingPolicy outside Kubernetes.
    slicing_file: str = ""
    #: A YAML file of node pools that may have no node now (scaled to zero by an autoscaler):
    #: their node type and optional ``max_nodes`` (docs/slicer.md, "Impossible is said at
    #: once"). A request one of them could hold waits for it instead of being answered
    #: ``unsatisfiable``. Empty: the fleet is the nodes the inventory described.
    node_pools_file: str = ""
    #: The target workload is the request shapes of the last this many jobs ...
    workload_window: int = 500
    #: ... and the policy is rebuilt from it every this many submissions.
    workload_refresh: int = 100
    #: Node label keys naming topology domains, innermost first, comma-separated (the levels
    #: of the cluster's Kueue or KAI Topology; GPU feature discovery labels a multi-node
    #: NVLink domain ``nvidia.com/gpu.clique``): a gang goes whole into the tightest domain
    #: that holds it. Empty: gangs keep to one GPU model, no topology.
    topology_levels: str = "nvidia.com/gpu.clique"
    #: Non-empty: durables ``slicer-<kind>-<instance>`` instead of the catalogue's names, so
    #: that slicers side by side on one server (tests, two demos) do not share a durable.
    #: Development only: the generated NATS permissions grant the catalogue's names alone.
    instance: str = ""
    #: Tenants whose shared jobs' compute shares are right-sized automatically, with a guard,
    #: comma-separated (``*``: every tenant); empty: the loop does not run (docs/slicer.md,
    #: "Recommendations that apply themselves"). Then: how far the billed cost may exceed the
    #: predicted one before a change is rolled back, and how many points of a window's time the
    #: job may be held at its new share beyond its history's (the SLO signal), how long (and
    #: over how many of the node agent's readings) a job is measured before, and guarded after,
    #: a change, and the charge window the guard checks.
    autosize_tenants: str = ""
    autosize_bound: float = 0.05
    autosize_slo_bound: float = 0.05
    autosize_min_history_s: float = 3600.0
    autosize_min_samples: int = 60
    autosize_guard_s: float = 3600.0
    autosize_window_s: float = 300.0
    #: At most this many jobs of one tenant wait (queued or held back); a submit past it is
    #: refused ``JobRejected(too_many_waiting)`` (``seedance.slicer.core.tenant_waiting``). It
    #: bounds the slicer's memory and the work one tenant's waiting jobs add to a release
    #: (docs/slicer.md, "A tenant's waiting jobs are bounded"). 0: no bound.
    max_waiting_per_tenant: int = 1000
    #: The placement term that leaves nodes empty (docs/slicer-fleet.md, "Capacity release"):
    #: with ``policy=seedance`` a job goes to the fullest nodes in use that fit (the policy's
    #: fragmentation descent choosing among them), an empty node only when none does, so the
    #: least used nodes empty as their work ends and the fleet's autoscaler can release them.
    #: Off by default, from measurement (docs/slicer-fleet.md, "LeaveEmpty in the running
    #: slicer"): on, it gives up the fragmentation win (`make bench-slicer`) and the paid
    #: GPU-hours of `make bench-fleet` move within the seeds' spread (it halves the moves).
    leave_empty: bool = False
    #: Consolidation (docs/slicer-fleet.md): after a batch, at most once per interval of
    #: trusted time, running jobs that said they are movable are moved off lightly used nodes
    #: so whole nodes empty; a drained node is held empty for ``consolidate_hold_s``. The
    #: disruption budget: moves per ``consolidate_window_s``, a fraction of the running jobs
    #: but at least ``consolidate_min_per_window``; per tenant in a window (0: no cap) and per
    #: job. ``consolidate_restart_s``: a restart's cost where a job gave no hint.
    consolidate: bool = True
    consolidate_interval_s: float = 60.0
    consolidate_hold_s: float = 600.0
    consolidate_window_s: float = 600.0
    consolidate_window_fraction: float = 0.01
    consolidate_min_per_window: int = 1
    consolidate_per_tenant: int = 0
    consolidate_per_job: int = 1
    #: A job that has run longer than this is never moved (a move restarts it); 0: no bound.
    consolidate_max_lost_s: float = 3600.0
    consolidate_restart_s: float = 180.0

    def __post_init__(self) -> None:
        bucket_ttl_s = BUCKETS[LEASE_BUCKET].ttl_s
        if not 0 < self.lease_ttl_s <= bucket_ttl_s:
            raise ValueError(
                f"SEEDANCE_SLICER_LEASE_TTL_S={self.lease_ttl_s!r}: must be > 0 and at most "
                f"the TTL of the leases bucket {LEASE_BUCKET!r} ({bucket_ttl_s:g} s): the key "
                "expires that long after its last refresh, and a standby may then lead"
            )
        if self.telemetry_ahead_s < 0:
            raise ValueError(
                f"SEEDANCE_SLICER_TELEMETRY_AHEAD_S={self.telemetry_ahead_s!r}: must be >= 0"
            )
        if self.request_clock not in ("receive", "replay"):
            raise ValueError(
                f"SEEDANCE_SLICER_REQUEST_CLOCK={self.request_clock!r}: expected receive or replay"
            )
