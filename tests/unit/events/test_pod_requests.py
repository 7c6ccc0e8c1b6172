"""One counting rule for the bridge and the node agent (``seedance.events.pod_requests``): the
devices the kubelet's per-container Allocates use (``device_steps``, its reuse of a done init
container's devices) are exactly the pod's request the bridge asks the slicer for
(``pod_resources``), for every small pod of init containers, sidecars and app containers."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

from seedance.events import pod_requests
from seedance.events.pod_requests import (
    ContainerRole,
    DeviceStep,
    containers_of,
    device_steps,
    pod_resources,
)

GPU = "nvidia.com/gpu"


def test_the_module_exports_exactly_these_names() -> None:
    assert sorted(pod_requests.__all__) == [
        "ContainerRequest",
        "ContainerRole",
        "DeviceStep",
        "containers_of",
        "device_steps",
        "pod_resources",
    ]


def _c(name: str, n: int, **over: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": {GPU: str(n)}}, **over}


def test_the_steps_of_pods_users_write() -> None:
    spec = {
        "initContainers": [_c("build", 2), _c("proxy", 1, restartPolicy="Always")],
        "containers": [_c("serve", 1), _c("eval", 1), {"name": "log"}],
    }
    steps = device_steps(containers_of(spec), GPU)
    # build gets 0,1; the sidecar reuses 0 (build is done); serve reuses 1; eval needs a new one.
    assert steps == [
        DeviceStep("build", ContainerRole.INIT, (0, 1)),
        DeviceStep("proxy", ContainerRole.SIDECAR, (0,)),
        DeviceStep("serve", ContainerRole.APP, (1,)),
        DeviceStep("eval", ContainerRole.APP, (2,)),
    ]
    assert pod_resources(spec)[GPU] == 3


def test_the_devices_the_steps_use_are_the_pods_request_for_every_small_pod() -> None:
    checked = 0
    for n_init in range(4):
        for roles in itertools.product((None, "Always"), repeat=n_init):
            for counts in itertools.product(range(3), repeat=n_init):
                for apps in itertools.chain.from_iterable(
                    itertools.product(range(3), repeat=k) for k in range(3)
                ):
                    inits = [
                        _c(f"i{i}", n, **({"restartPolicy": r} if r else {}))
                        for i, (r, n) in enumerate(zip(roles, counts, strict=True))
                    ]
                    spec = {
                        "initContainers": inits,
                        "containers": [_c(f"a{i}", n) for i, n in enumerate(apps)],
                    }
                    steps = device_steps(containers_of(spec), GPU)
                    used = {s for step in steps for s in step.slots}
                    assert used == set(range(len(used)))
                    assert len(used) == pod_resources(spec).get(GPU, 0), spec
                    # Containers running together never share a device.
                    running = [s for s in steps if s.role is not ContainerRole.INIT]
                    flat = [x for s in running for x in s.slots]
                    assert len(flat) == len(set(flat)), spec
                    checked += 1
    assert checked > 1000


def test_pod_level_resources_replace_the_containers_cpu_and_memory() -> None:
    # Review p6: a pod's spec.resources (PodLevelResources, KEP-2837) is what the kubelet and
    # kube-scheduler count for cpu and memory (applyPodLevelResources), overhead on top; the
    # containers' GPUs are still theirs. Requests default from limits, as for containers.
    spec = {
        "resources": {"limits": {"cpu": "4", "memory": "16Gi"}},
        "containers": [
            {"name": "main", "resources": {"limits": {GPU: "1"}, "requests": {"cpu": "100m"}}}
        ],
        "overhead": {"cpu": "250m"},
    }
    got = pod_resources(spec)
    assert got == {GPU: 1, "cpu": Fraction(17, 4), "memory": 16 * 2**30}
    spec["resources"] = {"requests": {"memory": "1Gi"}}  # cpu stays the containers'
    assert pod_resources(spec) == {GPU: 1, "cpu": Fraction(7, 20), "memory": 2**30}
