"""The Kubernetes pods' job-id space: no tenant request may name a pod's job (issue 27)."""

from __future__ import annotations

import pytest

from seedance.events.jobs import K8S_JOB_PREFIX, is_k8s_job, pod_job_id, tenant_job_problem
from seedance.events.subjects import jobs, observed
from seedance.sdk.job_events import job_event, job_submitted

UID = "0e5f8c8a-6f2e-4f55-9d5c-1b1f0c3e2a11"


def test_a_pods_job_id_is_its_uid_in_the_pods_space() -> None:
    assert pod_job_id(UID) == f"k8s:{UID}"
    assert is_k8s_job(pod_job_id(UID))
    assert not is_k8s_job(UID)
    assert K8S_JOB_PREFIX == "k8s:"


@pytest.mark.parametrize("kind", sorted(jobs.KINDS))
def test_a_tenant_request_naming_a_pods_job_has_a_problem_naming_it(kind: str) -> None:
    problem = tenant_job_problem(jobs.subject("globex", kind), pod_job_id(UID))
    assert repr(pod_job_id(UID)) in problem
    assert "Kubernetes pods" in problem


def test_only_tenant_requests_are_refused_other_ids_and_subjects_pass() -> None:
    # the bridge's own report of the pod's job, on the observed subjects, is the fact
    assert tenant_job_problem(observed.subject("acme", "submitted"), pod_job_id(UID)) == ""
    # any other id of the tenant's own, the bare uid included
    assert tenant_job_problem(jobs.subject("acme", "submitted"), UID) == ""
    assert tenant_job_problem(jobs.subject("acme", "submitted"), "train-k8s:1") == ""
    assert tenant_job_problem(jobs.subject("acme", "submitted"), None) == ""
    # events of other families (decisions name pods' jobs, rightly)
    assert tenant_job_problem("seedance.slicing.acme.placement", pod_job_id(UID)) == ""


def test_the_sdk_refuses_a_pods_job_id_before_publishing() -> None:
    with pytest.raises(ValueError, match="Kubernetes pods"):
        job_submitted("acme", pod_job_id(UID))
    for kind in ("started", "finished", "failed", "cancelled"):
        with pytest.raises(ValueError, match="k8s:"):
            job_event(kind, "acme", pod_job_id(UID))
    assert job_submitted("acme", UID).job_id == UID
