"""Which job a pod already bound is, when a (re)starting bridge meets it, and whose.

Owns the bridge's record of the jobs it submitted (`JobRecords`: the KV bucket's keys, by
(tenant, job), read when a bridge takes the lead) and ``adoption``: a bound pod's job and
tenant, or why it is not one of ours. A pod author can write its pod's annotations (and create
a pod with ``spec.nodeName``), so the placement annotation says nothing that is taken on its
word:

- the job is derived from what the API server assigned: ``k8s:<uid>`` for a lone pod; for a
  ``seedance.io/pod-group`` member, ``gang_job_id`` of its namespace, its group and the members'
  UIDs the annotation lists, only if the pod's own UID is one of them (an edited list derives
  another id); the bare ids the bridge used before pods' jobs had a space of their own are
  derived the same way;
- the job is taken only if the bridge recorded it (it records a job before its submit goes
  out, and only jobs of pods it saw pending under Seedance's scheduler), and the tenant is the
  record's: the tenant the job was submitted for. A namespace relabelled since moves nothing
  (its running jobs stay billed and decided where they were submitted); a pod whose job no
  record holds is refused (``not_adopted``), whatever its annotation says.

Must not do I/O or read a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from seedance.events.jobs import K8S_JOB_PREFIX, gang_job_id, pod_job_id
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.ends import parse_k8s_time
from seedance.k8s_bridge.core.kube import node_name, parse_annotation
from seedance.k8s_bridge.core.pods import PodRef, RefusalReason, Refused
from seedance.k8s_bridge.core.tracked import JobKey, int_or_zero

__all__ = ["Adopted", "JobRecords", "adoption", "scheduled_at"]

Json = Mapping[str, Any]


class JobRecords:
    """The (tenant, job) of every job the bridge recorded as submitted and not yet ended."""

    def __init__(self, records: Iterable[JobKey] = ()) -> None:
        self._tenants: dict[str, set[str]] = {}
        for tenant, job_id in records:
            self._tenants.setdefault(job_id, set()).add(tenant)

    def tenants_of(self, job_id: str) -> set[str]:
        return set(self._tenants.get(job_id, ()))


@dataclass(frozen=True, slots=True)
class Adopted:
    """A bound pod's job, as the bridge recorded it; ``gang`` its group (namespace, name) and
    ``gang_size`` the group's size label, for a member."""

    tenant: str
    job_id: str
    node: str
    bound_at: datetime | None
    gang: tuple[str, str] | None = None
    gang_size: int = 0


def _refused(ref: PodRef, node: str, why: str) -> Refused:
    return Refused(
        RefusalReason.NOT_ADOPTED,
        f"pod is bound to {node!r} but is no job Seedance submitted: {why}; a pod must be "
        "created without spec.nodeName and without the seedance.io/placement annotation",
    )


def _gang_ids(ref: PodRef, group: str, doc: Json) -> list[str] | str:
    gang = doc.get("gang")
    if not isinstance(gang, dict) or not isinstance(gang.get("members"), list):
        return f"pod group {group!r} without the members its job is derived from"
    members = [str(m) for m in gang["members"]]
    if gang.get("name") != group or ref.uid not in members:
        return f"the annotation's pod group is not {group!r} with this pod among its members"
    return [gang_job_id(ref.namespace, group, members)]


def scheduled_at(pod: Json) -> datetime | None:
    """When the API server bound the pod: its ``PodScheduled=True`` condition, which the
    binding subresource writes; never the annotation's ``boundAt`` (a pod author's to edit)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return parse_k8s_time(c.get("lastTransitionTime"))
    return None


def adoption(
    pod: Json, ref: PodRef, records: JobRecords, namespace_tenant: str = ""
) -> Adopted | Refused | None:
    """The job of ``pod`` (bound: ``spec.nodeName`` set), or why it is none of ours; None when
    it carries no placement annotation of ours at all (then it was created bound). Of several
    records of its job (tenants that each had it, the namespace relabelled between), the one
    of ``namespace_tenant`` (the namespace's tenant now) is taken."""
    md = pod.get("metadata") or {}
    doc = parse_annotation(md.get("annotations") or {})
    node = str((pod.get("spec") or {}).get("nodeName"))
    if doc is None:
        return None
    if doc.get("podUid") != ref.uid or node_name(str(doc.get("node"))) != node:
        return _refused(ref, node, "its placement annotation names another pod or node")
    labels = md.get("labels") or {}
    group = labels.get(keys.LABEL_POD_GROUP)
    ids = _gang_ids(ref, str(group), doc) if group else [pod_job_id(ref.uid)]
    if isinstance(ids, str):
        return _refused(ref, node, ids)
    # A pod bound before pods' jobs had a space of their own was submitted under the bare id.
    ids += [i.removeprefix(K8S_JOB_PREFIX) for i in ids]
    found = [(t, j) for j in ids for t in sorted(records.tenants_of(j))]
    if len(found) > 1:
        found = [(t, j) for t, j in found if t == namespace_tenant]
    if len(found) != 1:
        why = "no record of its job" if not found else f"records of {found} are ambiguous"
        return _refused(ref, node, why)
    ((tenant, job_id),) = found
    return Adopted(
        tenant=tenant,
        job_id=job_id,
        node=node,
        bound_at=scheduled_at(pod),
        gang=(ref.namespace, str(group)) if group else None,
        gang_size=int_or_zero(labels.get(keys.LABEL_POD_GROUP_SIZE)) if group else 0,
    )
