"""The bridge's settings (``SEEDANCE_K8S_BRIDGE_*``); the API server is found through
``KUBECONFIG`` (the ecosystem's name) or, inside a pod, the service account."""

from __future__ import annotations

import re

import msgspec

from seedance.events.jobs import MOVE_REFUSED_WITHIN_S
from seedance.events.replicas import DEFAULT_FLEET
from seedance.events.stores import SLICING_POLICY_KEY
from seedance.events.subjects import QUOTA_POLICY_KEY, consumer
from seedance.events.tokens import check_token
from seedance.k8s_bridge.core.keys import DEFAULT_SCHEDULER_NAME
from seedance.k8s_bridge.evictions import give_up_s

__all__ = ["BridgeSettings"]

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: Deliveries of one decision before the consumer dead-letters it (the catalogue's).
DECISIONS_MAX_DELIVER = consumer("k8s-bridge-decisions").max_deliver


class BridgeSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: Pods whose ``spec.schedulerName`` is this are Seedance's.
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    #: A kubeconfig file; empty: ``KUBECONFIG``, else the in-cluster service account.
    kubeconfig: str = ""
    #: The ``coordination.k8s.io/v1`` Lease electing the one active bridge.
    lease_name: str = "seedance-k8s-bridge"
    lease_namespace: str = "seedance-system"
    #: A standby takes over once the lease went unrenewed this long (by its own clock).
    lease_duration_s: float = 15.0
    #: The leader renews this often; it stops acting when it could not renew for
    #: ``lease_duration_s`` * 2/3 (before any standby may take over).
    lease_renew_s: float = 2.0
    #: This replica's name in the lease and its Events (defaults to the host name).
    replica: str = ""
    http_port: int = 9406
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: Publish a NodeInventory per Node (off once node agents publish real inventories).
    publish_inventory: bool = True
    #: Decisions handled per fetched batch.
    batch: int = 100
    #: A watch is re-opened after this long (the server ends it; the resume is from its
    #: resourceVersion, so nothing is missed).
    watch_timeout_s: int = 300
    #: Reconnect backoff after an API error: from ``backoff_initial_s``, doubling, capped.
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    #: A Binding that failed for now (no answer, 5xx, 429) is tried again after this long
    #: (its placement is naked with this delay and redelivered).
    bind_retry_s: float = 0.5
    #: Concurrent API writes (Bindings, status patches, Events, deletions).
    api_concurrency: int = 32
    #: Requests a second to the API server, and at once (a token bucket: client-go's ``QPS`` /
    #: ``Burst``), for the pod, node and list/watch calls; Events have a bucket of the same size
    #: and the Lease none (`seedance.k8s_bridge.kube`). kube-scheduler's defaults (its
    #: ``clientConnection.qps``/``burst``); client-go's own are 5/10. ``API_QPS`` 0: no limit.
    api_qps: float = 50.0
    api_burst: int = 100
    #: Objects per list page (``limit``; then ``continue``); 0: whole lists at once.
    list_page_size: int = 500
    #: Non-empty: the durable ``k8s-bridge-decisions-<instance>``, so that bridges of two
    #: clusters (tests) on one NATS do not share it. Development only: the generated NATS
    #: permissions grant the catalogue's name alone.
    instance: str = ""
    #: The KV key (bucket ``seedance-policy``) the TenantQuotas' quota document is written to,
    #: the slicer's ``SEEDANCE_SLICER_QUOTA_KEY``; empty: the CRs are not reconciled.
    policy_key: str = QUOTA_POLICY_KEY
    #: The KV key the SlicingPolicy in force is written to, the slicer's
    #: ``SEEDANCE_SLICER_SLICING_KEY``; empty: not written.
    slicing_key: str = SLICING_POLICY_KEY
    #: Changes (CRs, PriorityClasses, the slicers' usage) within this long reconcile once.
    policy_debounce_s: float = 0.1
    #: Register the router's inference replicas from EndpointSlices labelled
    #: ``seedance.io/model`` into the ``seedance-router-replicas`` bucket (leader only).
    discover_replicas: bool = True
    #: The slice port that is a replica's OIP gRPC endpoint.
    replica_port_name: str = "grpc"
    #: The router fleet of a Service without the ``seedance.io/router-fleet`` label.
    router_fleet: str = DEFAULT_FLEET
    #: Comma-separated namespaces whose labelled Services are the operator's shared inference
    #: pool (shared replica keys, sent every tenant's requests for the model). Any other
    #: namespace registers replicas only when bound to a tenant, as that tenant's own.
    shared_namespaces: str = ""
    #: This cluster's name in the release taint's value and annotation (``seedance.io/
    #: releasing``): the nodes this bridge marked are those carrying its name.
    cluster: str = "default"
    #: Cordon and taint the nodes the slicer holds empty (its capacity plans' ``drained_nodes``)
    #: for the cluster's autoscaler to remove; lift both when the slicer takes one back.
    release_nodes: bool = True
    #: A consolidation move's eviction the API server did not answer (no answer, 5xx) is tried
    #: again after this long, doubled at each try up to 60 s (its decision is naked with this
    #: delay and redelivered).
    evict_retry_s: float = 5.0
    #: An eviction the API server has not answered (no answer, 5xx) at this many tries of its
    #: decision is given up: the move is reported refused (`JobMoveRefused`, cause
    #: ``unanswered``) so the slicer puts the job back. Below the decisions consumer's
    #: ``max_deliver`` (10), so the give-up comes before the decision would be dead-lettered;
    #: with ``evict_retry_s``, the give-up must come within
    #: `seedance.events.jobs.MOVE_REFUSED_WITHIN_S` (480 s) of the first try (405 s here).
    evict_tries: int = 9

    def __post_init__(self) -> None:
        if not 0 < self.lease_renew_s < self.lease_duration_s * 2 / 3:
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_LEASE_RENEW_S={self.lease_renew_s} must be above 0 and "
                f"below 2/3 of SEEDANCE_K8S_BRIDGE_LEASE_DURATION_S={self.lease_duration_s}"
            )
        check_token("SEEDANCE_K8S_BRIDGE_ROUTER_FLEET", self.router_fleet)
        self._check_evictions()
        if self.batch < 1 or self.api_concurrency < 1:
            raise ValueError("SEEDANCE_K8S_BRIDGE_BATCH and _API_CONCURRENCY must be at least 1")
        if not _LABEL_VALUE.match(self.cluster):
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_CLUSTER={self.cluster!r} must be a label value (1 to 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
            )
        if self.api_qps > 0 and self.api_burst < 1:
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_API_BURST={self.api_burst} must be at least 1 where "
                f"SEEDANCE_K8S_BRIDGE_API_QPS={self.api_qps} limits the rate"
            )
        if self.list_page_size < 0:
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_LIST_PAGE_SIZE={self.list_page_size} must be 0 (whole "
                "lists) or more"
            )
        for ns in self.shared_namespace_names:
            if not _NAMESPACE.match(ns):
                raise ValueError(
                    f"SEEDANCE_K8S_BRIDGE_SHARED_NAMESPACES: {ns!r} is not a namespace name "
                    "(a DNS label: lower-case letters, digits and '-', at most 63)"
                )

    def _check_evictions(self) -> None:
        """The eviction tries: given up before a dead letter, and reported within the bound the
        slicer holds an emptied node for (`MOVE_REFUSED_WITHIN_S`, docs/k8s-bridge.md)."""
        if not 1 <= self.evict_tries < DECISIONS_MAX_DELIVER:
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_EVICT_TRIES={self.evict_tries} must be at least 1 and "
                f"below the decisions consumer's max_deliver ({DECISIONS_MAX_DELIVER}), or the "
                "decision is dead-lettered before the move is reported"
            )
        if not self.evict_retry_s > 0:
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_EVICT_RETRY_S={self.evict_retry_s} must be above 0"
            )
        if (late_s := give_up_s(self.evict_retry_s, self.evict_tries)) > MOVE_REFUSED_WITHIN_S:
            raise ValueError(
                f"SEEDANCE_K8S_BRIDGE_EVICT_RETRY_S={self.evict_retry_s} and _EVICT_TRIES="
                f"{self.evict_tries} give an unanswered eviction up {late_s:g} s after its first "
                f"try, past the {MOVE_REFUSED_WITHIN_S:g} s within which the slicer expects a "
                "refused move's report (it holds the emptied node that long): lower either"
            )

    @property
    def shared_namespace_names(self) -> tuple[str, ...]:
        """`shared_namespaces` as names."""
        return tuple(n.strip() for n in self.shared_namespaces.split(",") if n.strip())
