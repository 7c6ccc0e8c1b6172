"""Extended-resource quantities as the node agent counts them: any integral quantity the API
server accepts, and one pod's odd value never stops the listing of the others."""

from __future__ import annotations

import pytest

from seedance.node_agent.kube import pod_view, quantity_int


@pytest.mark.parametrize(("q", "n"), [("2", 2), (3, 3), ("1k", 1000), ("1e3", 1000), ("1Ki", 1024)])
def test_integral_quantities(q: object, n: int) -> None:
    assert quantity_int(q) == n


@pytest.mark.parametrize("q", ["0.5", "abc", "500m", "-1"])
def test_non_integral_quantities_are_refused_naming_them(q: str) -> None:
    with pytest.raises(ValueError, match=repr(q)):
        quantity_int(q)


def test_a_pod_with_an_odd_quantity_asks_for_nothing_of_it_instead_of_failing() -> None:
    # The pod's count of a resource is its containers' (the kubelet's and the bridge's rule,
    # seedance.events.pod_requests): with half a GPU in one container it is no whole number,
    # so the pod asks for none (its Allocate is refused; the API server refuses such a pod).
    pod = {
        "metadata": {"uid": "u", "namespace": "n", "name": "p"},
        "spec": {
            "nodeName": "gpu-1",
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "x.io/y": "2"}}},
            ],
        },
    }
    assert pod_view(pod).requests == {"x.io/y": 2}
