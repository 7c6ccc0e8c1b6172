"""A pod's request, tenant, priority and gang, or the refusal that names why."""

from typing import Any

import pytest

from seedance.events.jobs import JobKind, ResourceRequest
from seedance.k8s_bridge.core.pods import (
    CARRIED,
    NOT_CARRIED,
    PodAsk,
    RefusalReason,
    Refused,
    pod_ask,
    pod_resources,
    request_of,
)
from tests.unit.k8s_bridge.pods import pod

BOUND = {"team-a": "acme"}


def ask(p: dict[str, Any], **kw: Any) -> PodAsk | Refused:
    return pod_ask(
        p,
        bindings=kw.get("bindings", BOUND),
        labelled=kw.get("labelled", {}),
        priorities=kw.get("priorities", {}),
    )


def asked(p: dict[str, Any], **kw: Any) -> PodAsk:
    a = ask(p, **kw)
    assert isinstance(a, PodAsk), a
    return a


def refused(p: dict[str, Any], **kw: Any) -> Refused:
    a = ask(p, **kw)
    assert isinstance(a, Refused), a
    return a


def test_whole_gpus_cpu_and_memory() -> None:
    a = asked(pod(limits={"nvidia.com/gpu": "2"}, requests={"cpu": "500m", "memory": "1Gi"}))
    assert a.request == ResourceRequest(gpus=2, gpu_milli=1000, cpu_milli=500, memory_mib=1024)
    assert a.tenant == "acme"
    assert a.kind is JobKind.TRAINING
    assert a.gang is None


def test_requests_default_to_limits_and_containers_add_up() -> None:
    p = pod(limits={"cpu": "1", "memory": "1G"})
    p["spec"]["containers"].append(
        {"name": "side", "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}}
    )
    res = pod_resources(p["spec"])
    assert float(res["cpu"]) == 1.25
    a = asked(p)
    assert a.request.cpu_milli == 1250
    assert a.request.memory_mib == 954 + 512


def test_init_containers_take_the_max_and_sidecars_and_overhead_add() -> None:
    p = pod(requests={"cpu": "1"})
    p["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "3"}}},
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
    ]
    p["spec"]["overhead"] = {"cpu": "100m"}
    assert asked(p).request.cpu_milli == 3100


@pytest.mark.parametrize(
    "limits",
    [{"nvidia.com/gpu": "1"}, {"seedance.io/gpu-milli": "500"}, {"nvidia.com/mig-1g.10gb": 1}],
)
def test_gpus_in_a_regular_init_container_are_refused_by_name(limits: dict[str, Any]) -> None:
    # The node agent cannot confirm whose devices a regular init container holds (the
    # kubelet's pod-resources List never names one) and refuses its Allocate: say so here,
    # before binding. A native sidecar with a GPU is listed, and placed.
    p = pod(requests={"cpu": "1"})
    p["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"requests": {"cpu": "1"}}},
        {"name": "build-engine", "resources": {"limits": limits}},
    ]
    r = refused(p)
    assert r.reason is RefusalReason.INVALID_REQUEST
    assert r.message.startswith(f"spec.initContainers[1] 'build-engine' asks for {sorted(limits)}")
    assert "never lists regular init containers" in r.message
    assert "native sidecar (restartPolicy: Always)" in r.message
    p["spec"]["initContainers"][1]["restartPolicy"] = "Always"
    p["spec"]["initContainers"][1]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert asked(p).request.gpus == 1


def test_mig_instance() -> None:
    a = asked(pod(limits={"nvidia.com/mig-3g.40gb": 1}))
    assert a.request.mig_profile == "3g.40gb"
    assert a.request.gpus == 1


def test_a_mig_instance_of_the_default_profile() -> None:
    """seedance.io/mig: 1 names no profile: the request's ``mig`` (the slicer fills in the
    SlicingPolicy's default profile)."""
    a = asked(pod(limits={"seedance.io/mig": 1}))
    assert (a.request.mig, a.request.mig_profile, a.request.gpus) == (True, None, 1)


@pytest.mark.parametrize(
    "limits",
    [
        {"seedance.io/mig": 2},
        {"seedance.io/mig": 1, "nvidia.com/mig-1g.10gb": 1},
        {"seedance.io/mig": 1, "nvidia.com/gpu": 1},
        {"seedance.io/mig": 1, "seedance.io/gpu-milli": 500},
        {"nvidia.com/mig-3g.40gb": 2},
        {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-1g.10gb": 1},
        {"nvidia.com/mig-3g.40gb": 1, "nvidia.com/gpu": 1},
        # two spellings of one profile stay two (only the plugin's own spelling is read)
        {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-1G.10GB": 1},
        {"nvidia.com/mig-1g.10gb.me": 1, "nvidia.com/mig-1g.10gb+me": 1},
    ],
)
def test_mig_requests_are_one_instance_of_one_profile(limits: dict[str, Any]) -> None:
    r = refused(pod(limits=limits))
    assert r.reason is RefusalReason.INVALID_REQUEST
    assert "MIG" in r.message


def test_shared_gpu_resources() -> None:
    a = asked(pod(limits={"seedance.io/gpu-milli": 250, "seedance.io/gpu-memory-mib": 8192}))
    assert (a.request.gpus, a.request.gpu_milli, a.request.gpu_mem_mib) == (1, 250, 8192)


def test_a_share_of_several_gpus_is_refused_by_request_problem() -> None:
    r = refused(pod(limits={"nvidia.com/gpu": 2, "seedance.io/gpu-milli": 500}))
    # request_problem's own words: the one statement of the rule
    assert "a shared-GPU request takes one GPU" in r.message


def test_out_of_bounds_fields_are_refused_by_the_event_bounds() -> None:
    r = refused(pod(limits={"seedance.io/gpu-milli": 2000}))
    assert "gpu_milli" in r.message
    r = refused(pod(limits={"nvidia.com/gpu": "500m"}))
    assert "nvidia.com/gpu" in r.message


def test_unsupported_resources_are_refused_and_storage_ignored() -> None:
    r = refused(pod(limits={"amd.com/gpu": 1}))
    assert "amd.com/gpu" in r.message
    r = refused(pod(limits={"hugepages-2Mi": "1Gi"}))
    assert "hugepages-2Mi" in r.message
    assert asked(pod(limits={"ephemeral-storage": "10Gi"})).request.gpus == 0


def test_bad_quantity_names_it() -> None:
    r = refused(pod(requests={"cpu": "lots"}))
    assert "'lots'" in r.message


def test_tenant_from_binding_first_then_label() -> None:
    p = pod(namespace="ns1")
    assert asked(p, bindings={"ns1": "acme"}, labelled={"ns1": "globex"}).tenant == "acme"
    assert asked(p, bindings={}, labelled={"ns1": "globex"}).tenant == "globex"
    r = refused(p, bindings={}, labelled={})
    assert r.reason is RefusalReason.NO_TENANT
    assert "ns1" in r.message
    assert refused(p, bindings={"ns1": "Not_A_Tenant"}).reason is RefusalReason.NO_TENANT


def test_priority_from_spec_then_class_lookup() -> None:
    assert asked(pod(priority=1000)).priority == 1000
    p = pod(priorityClassName="high")
    assert asked(p, priorities={"high": 500}).priority == 500
    assert "high" in refused(p).message
    assert asked(pod()).priority == 0


def test_gang_labels() -> None:
    a = asked(pod(labels={"seedance.io/pod-group": "g1", "seedance.io/pod-group-size": "4"}))
    assert a.gang is not None
    assert (a.gang.name, a.gang.size) == ("g1", 4)
    r = refused(pod(labels={"seedance.io/pod-group": "g1"}))
    assert r.reason is RefusalReason.INVALID_GANG
    single = asked(pod(labels={"seedance.io/pod-group": "g", "seedance.io/pod-group-size": "1"}))
    assert single.gang is None


def test_preset_node_name_or_placement_is_refused() -> None:
    assert refused(pod(node_name="gpu-1")).reason is RefusalReason.NODE_NAME_PRESET
    p = pod(annotations={"seedance.io/placement": "{}"})
    assert refused(p).reason is RefusalReason.PLACEMENT_PRESET


def test_labels_kind_gpu_model_and_expected_duration() -> None:
    p = pod(
        name="trainer",
        labels={"app": "x", "seedance.io/kind": "inference", "k" * 64: "too long a key"},
        annotations={"seedance.io/expected-duration-s": "3600"},
        nodeSelector={"nvidia.com/gpu.product": "H200"},
        limits={"nvidia.com/gpu": 1},
    )
    a = asked(p)
    assert a.kind is JobKind.INFERENCE
    assert a.expected_duration_s == 3600.0
    assert a.request.gpu_models == ["H200"]
    assert a.labels["app"] == "x"
    assert a.labels["seedance.io/pod"] == "trainer"
    assert a.labels["seedance.io/namespace"] == "team-a"
    assert "k" * 64 not in a.labels
    assert (
        refused(pod(labels={"seedance.io/kind": "batch"})).reason is RefusalReason.INVALID_REQUEST
    )


def test_request_of_a_gang_member_checks_the_gang_rule() -> None:
    r = request_of(pod(limits={"nvidia.com/mig-1g.10gb": 1})["spec"], gang_size=2)
    assert isinstance(r, Refused)
    assert "gang_size=1" in r.message


def test_every_carried_or_not_carried_entry_has_a_reason() -> None:
    assert all(CARRIED.values())
    assert all(NOT_CARRIED.values())


def test_every_job_field_says_which_pod_field_it_comes_from() -> None:
    """A new JobSubmitted or ResourceRequest field must be mapped in CARRIED (or this fails)."""
    from seedance.events.jobs import JobSubmitted

    wanted = (set(JobSubmitted.__struct_fields__) - {"request"}) | {
        f"request.{f}" for f in ResourceRequest.__struct_fields__
    }
    assert set(CARRIED) == wanted


def test_job_bounds_are_the_events_own() -> None:
    r = refused(pod(priority=2**31))
    assert "priority" in r.message
    r = refused(pod(annotations={"seedance.io/expected-duration-s": "-5"}))
    assert "expected_duration_s" in r.message
    r = refused(pod(uid="not a token"))
    assert "job_id" in r.message


def test_a_pod_is_movable_only_when_its_annotation_says_true() -> None:
    plain = asked(pod(limits={"nvidia.com/gpu": 1}))
    assert (plain.movable, plain.restart_s) == (False, None)
    said = asked(
        pod(annotations={"seedance.io/movable": "true", "seedance.io/restart-s": "240"},
            limits={"nvidia.com/gpu": 1})
    )  # fmt: skip
    assert (said.movable, said.restart_s) == (True, 240.0)
    assert asked(pod(annotations={"seedance.io/movable": "false"})).movable is False
    r = refused(pod(annotations={"seedance.io/movable": "yes"}))
    assert (r.reason, "seedance.io/movable='yes'" in r.message) == (
        RefusalReason.INVALID_REQUEST,
        True,
    )
    r = refused(pod(annotations={"seedance.io/restart-s": "-1"}))
    assert "restart_s" in r.message
    r = refused(pod(annotations={"seedance.io/restart-s": "soon"}))
    assert "seedance.io/restart-s='soon'" in r.message


def test_the_submit_event_carries_what_the_pod_said_about_moving() -> None:
    from datetime import UTC, datetime

    from seedance.k8s_bridge.core.job_events import submit_event

    a = asked(pod(annotations={"seedance.io/movable": "true", "seedance.io/restart-s": "90"}))
    ev = submit_event(a, "k8s:u", 1, 0, datetime(2026, 1, 1, tzinfo=UTC), None).event
    assert (ev.movable, ev.restart_s) == (True, 90.0)  # type: ignore[attr-defined]


def test_a_mig_instance_with_media_extensions_as_the_device_plugin_names_it() -> None:
    """``nvidia.com/mig-1g.10gb.me`` (the plugin writes ``+`` as ``.``) asks for the profile
    NVIDIA names ``1g.10gb+me``, the name the slicer and the ledger read."""
    a = asked(pod(limits={"nvidia.com/mig-1g.10gb.me": 1}))
    assert a.request.mig_profile == "1g.10gb+me"
    assert a.request.gpus == 1
