"""The three PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic
merge driven by the Pod schema's patch merge keys, never mutating their inputs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from seedance.testing.kube_api.patch import (
    PatchDecodeError,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge,
)
from seedance.testing.kube_api.validation import builtin_schemas

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "i:1",
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"containerPort": 80, "name": "http"}],
            },
            {"name": "side", "image": "s:1"},
        ],
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    },
    "status": {
        "conditions": [
            {"type": "PodScheduled", "status": "False"},
            {"type": "Ready", "status": "False"},
        ]
    },
}


def _pod_strategy() -> Any:
    return builtin_schemas().strategy("pod-v1")


def test_merge_patch_merges_maps_deletes_nulls_and_replaces_lists() -> None:
    before = copy.deepcopy(POD)
    out = merge_patch(
        POD, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"tolerations": []}}
    )
    assert out["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert out["spec"]["tolerations"] == []
    assert out["spec"]["containers"] == POD["spec"]["containers"]
    assert before == POD


def test_json_patch_ops_and_failures() -> None:
    out = json_patch(
        POD,
        [
            {"op": "add", "path": "/metadata/labels/c", "value": "3"},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "i:2"},
            {"op": "remove", "path": "/spec/containers/1"},
            {"op": "add", "path": "/metadata/finalizers/-", "value": "y"},
            {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/d"},
            {"op": "move", "from": "/metadata/labels/b", "path": "/metadata/labels/e"},
            {"op": "test", "path": "/metadata/labels/e", "value": "2"},
        ],
    )
    assert out["metadata"]["labels"] == {"a": "1", "c": "3", "d": "1", "e": "2"}
    assert [c["name"] for c in out["spec"]["containers"]] == ["main"]
    assert out["spec"]["containers"][0]["image"] == "i:2"
    assert out["metadata"]["finalizers"] == ["x", "y"]
    assert POD["spec"]["containers"][0]["image"] == "i:1"
    with pytest.raises(PatchError, match="test failed"):
        json_patch(POD, [{"op": "test", "path": "/metadata/name", "value": "q"}])
    with pytest.raises(PatchError, match="not found"):
        json_patch(POD, [{"op": "remove", "path": "/spec/nope"}])
    with pytest.raises(PatchDecodeError):
        json_patch(POD, {"spec": {}})


def test_strategic_merge_merges_conditions_by_type() -> None:
    out = strategic_merge(
        POD,
        {
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                ]
            }
        },
        _pod_strategy(),
    )
    assert out["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "False"},
        {"type": "Initialized", "status": "True"},
    ]


def test_strategic_merge_merges_containers_env_and_ports_by_their_keys() -> None:
    out = strategic_merge(
        POD,
        {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "9"}],
                        "ports": [{"containerPort": 9090, "name": "metrics"}],
                    }
                ]
            }
        },
        _pod_strategy(),
    )
    main, side = out["spec"]["containers"]
    assert (main["image"], side["name"]) == ("i:1", "side")
    assert main["env"] == [{"name": "A", "value": "9"}, {"name": "B", "value": "2"}]
    assert [p["containerPort"] for p in main["ports"]] == [80, 9090]
    assert POD["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]


def test_strategic_merge_replaces_lists_without_a_merge_strategy() -> None:
    out = strategic_merge(
        POD, {"spec": {"tolerations": [{"key": "cpu", "operator": "Exists"}]}}, _pod_strategy()
    )
    assert out["spec"]["tolerations"] == [{"key": "cpu", "operator": "Exists"}]


def test_strategic_merge_directives() -> None:
    strategy = _pod_strategy()
    deleted = strategic_merge(
        POD, {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}, strategy
    )
    assert [c["name"] for c in deleted["spec"]["containers"]] == ["main"]
    replaced = strategic_merge(
        POD, {"metadata": {"labels": {"$patch": "replace", "z": "1"}}}, strategy
    )
    assert replaced["metadata"]["labels"] == {"z": "1"}
    ordered = strategic_merge(
        POD, {"$setElementOrder/spec": [], "metadata": {"labels": {"a": None}}}, strategy
    )
    assert ordered["metadata"]["labels"] == {"b": "2"}
    finalizers = strategic_merge(POD, {"metadata": {"finalizers": ["y", "x"]}}, strategy)
    assert finalizers["metadata"]["finalizers"] == ["x", "y"]  # merged as a set
    dropped = strategic_merge(
        POD, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}, strategy
    )
    assert dropped["metadata"]["finalizers"] == []
