"""The cluster as the bridge sees it: the informers on its Pods, Nodes and Namespaces, and what
each change calls for once this replica leads.

Owns the informers (`seedance.k8s_bridge.watch`: every replica watches, so a standby's cache is
warm), the pods deleted lately (tombstones: replayed on taking the lead, should the old leader
have missed their ends or this replica's last term not have made them durable; kept while
leading too, until every end is durable: `settled`), when each pod was first seen (the bind
latency's start), whose replicas a namespace's Services are (`replica_owners`), and handing each
change to the leader's `Tracker` (``tracker()``; None: standing by). Its actions go to
``enqueue``; an object the tracker cannot take is logged and counted, never stops the watch.

Must not decide anything (the tracker does) nor carry an action out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from seedance.core import Clock
from seedance.core.logs import get_logger
from seedance.k8s_bridge.core.endpoints import replica_owners
from seedance.k8s_bridge.core.keys import LABEL_TENANT
from seedance.k8s_bridge.core.nodes import UndescribedNode, gpus_left_out
from seedance.k8s_bridge.core.tracker import Action, Tracker
from seedance.k8s_bridge.kube import KubeApi
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.k8s_bridge.watch import Informer

__all__ = ["ClusterView"]

log = get_logger(__name__)

#: Deleted pods remembered until their ends are durable, replayed on taking the lead.
_TOMBSTONES_KEPT = 10_000


class ClusterView:
    """``on_node`` and ``on_namespace`` also tell the capacity release and the replicas'
    registrar (any replica: their caches follow)."""

    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        settings: BridgeSettings,
        metrics: BridgeMetrics,
        *,
        tracker: Callable[[], Tracker | None],
        enqueue: Callable[[list[Action]], None],
        on_restart: Callable[[str, str], None],
    ) -> None:
        self._clock = clock
        self._settings = settings
        self._metrics = metrics
        self._tracker = tracker
        self._enqueue = enqueue
        self._on_restart = on_restart
        self.first_seen: dict[str, float] = {}
        self._tombstones: list[dict[str, Any]] = []
        #: Nodes published no inventory for, and why (`_node`).
        self._undescribed: dict[str, str] = {}
        #: Nodes whose GPUs the inventory leaves out, and why: said once per why
        #: (`gpus_left_out`).
        self._left_out: dict[str, str] = {}
        #: Told of each Node change / each Namespace change (set by the service).
        self.node_listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self.namespace_listeners: list[Callable[[], None]] = []
        self.pods = self._informer(
            "pods", api.list_pods, api.watch_pods, self._on_pod,
            f"spec.schedulerName={settings.scheduler_name}",
        )  # fmt: skip
        self.nodes = self._informer("nodes", api.list_nodes, api.watch_nodes, self._on_node)
        self.namespaces = self._informer(
            "namespaces", api.list_namespaces, api.watch_namespaces, self._on_namespace
        )

    def _informer(
        self, kind: str, lister: Any, watcher: Any, handler: Any, selector: str = ""
    ) -> Informer:
        s = self._settings
        return Informer(
            kind, lister, watcher, handler, self._clock,
            selector=selector, timeout_s=s.watch_timeout_s,
            backoff_initial_s=s.backoff_initial_s, backoff_max_s=s.backoff_max_s,
            on_restart=self._on_restart,
        )  # fmt: skip

    @property
    def informers(self) -> tuple[Informer, Informer, Informer]:
        """In the order their caches must be synced before leading (a pod's tenant comes from
        its namespace)."""
        return self.namespaces, self.nodes, self.pods

    def replica_owners(self, bindings: Mapping[str, str]) -> dict[str, str]:
        """Namespace -> whose replicas its Services are (the shared pool's: ""), from the
        settings, the TenantQuota ``bindings`` and the namespaces' tenant labels."""
        labelled = {}
        for ns in self.namespaces.cache.values():
            md = ns.get("metadata") or {}
            if tenant := (md.get("labels") or {}).get(LABEL_TENANT):
                labelled[str(md.get("name", ""))] = str(tenant)
        return replica_owners(
            shared=self._settings.shared_namespace_names, bindings=bindings, labelled=labelled
        )

    def replay(self, tracker: Tracker, now: datetime) -> list[Action]:
        """What the caches (and the pods deleted while standing by) call for, taken by a new
        leader's ``tracker``. The caller makes ``tracker`` the one ``tracker()`` returns with no
        await in between, or a change meanwhile would be seen by neither."""
        actions: list[Action] = []
        for ns in self.namespaces.cache.values():
            tracker.namespace_seen(ns)
        if self._settings.publish_inventory:
            for node in self.nodes.cache.values():
                actions += self._taken("nodes", node, lambda n=node: self._node(tracker, n, now))
        for pod in self.pods.cache.values():
            actions += self._taken("pods", pod, lambda p=pod: tracker.pod_seen(p, now))
        for pod in self._tombstones:
            actions += self._taken(
                "pods",
                pod,
                lambda p=pod: tracker.pod_seen(p, now) + tracker.pod_seen(p, now, deleted=True),
            )
        self._tombstones = []
        return actions

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        self._metrics.pods_seen_total.labels(kind).inc()
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if kind == "ADDED":
            self.first_seen.setdefault(uid, self._clock.monotonic())
        elif kind == "DELETED":
            self.first_seen.pop(uid, None)
        if kind == "DELETED":
            self._tombstones.append(pod)
            del self._tombstones[:-_TOMBSTONES_KEPT]
        tracker = self._tracker()
        if tracker is None:
            return
        now, deleted = self._clock.now(), kind == "DELETED"
        self._guarded("pods", pod, lambda: tracker.pod_seen(pod, now, deleted=deleted))

    def settled(self) -> None:
        """Every end the leader's tracker emitted so far is durable: the tombstones seen until
        now are no longer needed (the executor's ``on_settled``, called with no await since it
        looked)."""
        self._tombstones = []

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        for listener in self.node_listeners:
            listener(kind, node)
        tracker, deleted = self._tracker(), kind == "DELETED"
        # Without the inventory (node agents publish the nodes': the dev overlay), a deletion is
        # still said: the node's agent goes with it, so nothing else would (docs/k8s-bridge.md).
        if tracker is None or not (self._settings.publish_inventory or deleted):
            return
        self._guarded("nodes", node, lambda: self._node(tracker, node, self._clock.now(), deleted))

    def _node(
        self, tracker: Tracker, node: dict[str, Any], now: datetime, deleted: bool = False
    ) -> list[Action]:
        """The node's inventory; none where its labels cannot describe it (`UndescribedNode`),
        said in a log line and a gauge naming the node and why, until they can or it is gone.
        A node published before is published again ``cordoned`` then (its shape kept, nothing
        new lands: `core.nodes.held_cordoned`), and the log line says so."""
        name = str((node.get("metadata") or {}).get("name", ""))
        try:
            actions = tracker.node_seen(node, now, deleted=deleted)
        except UndescribedNode as exc:
            if deleted:
                self._clear_undescribed(name)
            elif self._undescribed.get(name) != exc.reason:
                self._clear_undescribed(name)
                self._undescribed[name] = exc.reason
                self._metrics.nodes_undescribed.labels(name, exc.reason).set(1)
                log.warning(
                    "bridge_node_undescribed", node=name, reason=exc.reason, detail=exc.detail,
                    held="cordoned: its last shape kept, nothing new lands" if exc.held else None,
                )  # fmt: skip
            return exc.held
        self._clear_undescribed(name)
        left_out = None if deleted else gpus_left_out(node)
        if left_out is None:
            self._left_out.pop(name, None)
        elif self._left_out.get(name) != left_out:
            self._left_out[name] = left_out
            log.warning("bridge_node_gpus_left_out", node=name, detail=left_out)
        return actions

    def _clear_undescribed(self, name: str) -> None:
        if (reason := self._undescribed.pop(name, None)) is not None:
            self._metrics.nodes_undescribed.remove(name, reason)

    def _on_namespace(self, kind: str, ns: dict[str, Any]) -> None:
        if (tracker := self._tracker()) is not None:
            now, deleted = self._clock.now(), kind == "DELETED"
            step = lambda: tracker.namespace_seen(ns, now, deleted=deleted)  # noqa: E731
            self._guarded("namespaces", ns, step)
        for listener in self.namespace_listeners:
            listener()

    def _guarded(self, resource: str, obj: dict[str, Any], step: Any) -> None:
        self._enqueue(self._taken(resource, obj, step))

    def _taken(self, resource: str, obj: dict[str, Any], step: Any) -> list[Action]:
        """What one object's change calls for. An object the tracker cannot take (a bug, a
        shape no schema foresaw) is left as it is, logged and counted, rather than stopping
        the watch for every other pod: the per-object counterpart of a consumer's dead letter
        (a watch event has no message to dead-letter)."""
        try:
            return list(step())
        except Exception as exc:
            md = obj.get("metadata") or {}
            self._metrics.object_errors_total.labels(resource).inc()
            log.error(
                "bridge_object_failed",
                resource=resource,
                name=f"{md.get('namespace', '')}/{md.get('name', '')}",
                error=repr(exc),
            )
            return []
