"""The node agent's settings refuse, naming the variable and the value: a simulated GPU model
the GPU identity does not know, more simulated GPUs than a node holds, a mig-manager ConfigMap
that is not <namespace>/<name>, negative waits, a node name that is no subject token."""

from __future__ import annotations

from typing import Any

import pytest

from seedance.node_agent.settings import NodeAgentSettings


def test_the_defaults_serve_real_gpus_and_no_mig_manager() -> None:
    s = NodeAgentSettings(node_name="gpu-1")
    assert (s.simulated_gpus, s.mig_manager_config_map) == (0, None)
    assert s.placement_wait_s > 0
    assert s.plugin_conflict_wait_s > 0


def test_simulated_gpus_of_a_model_named_as_nvml_does() -> None:
    s = NodeAgentSettings(node_name="kind-worker", simulated_gpus=2, simulated_gpu_model="Tesla T4")
    assert (s.simulated_gpus, s.simulated_gpu_model) == (2, "Tesla T4")


def test_a_mig_manager_configmap_is_namespace_and_name() -> None:
    s = NodeAgentSettings(
        node_name="n", mig_manager_config="gpu-operator/seedance-mig-parted-config"
    )
    assert s.mig_manager_config_map == ("gpu-operator", "seedance-mig-parted-config")


@pytest.mark.parametrize(
    ("field", "kw", "message"),
    [
        ("SIMULATED_GPU_MODEL", {"simulated_gpus": 1, "simulated_gpu_model": "NVIDIA Z9"}, "Z9"),
        ("SIMULATED_GPUS", {"simulated_gpus": 17}, "17"),
        ("SIMULATED_GPUS", {"simulated_gpus": -1}, "-1"),
        ("MIG_MANAGER_CONFIG", {"mig_manager_config": "seedance-mig-parted-config"}, "parted"),
        ("MIG_MANAGER_CONFIG", {"mig_manager_config": "GPU/x"}, "GPU/x"),
        ("PLACEMENT_WAIT_S", {"placement_wait_s": -1.0}, "-1"),
        ("PLUGIN_CONFLICT_WAIT_S", {"plugin_conflict_wait_s": -0.5}, "-0.5"),
        ("SIMULATED_SAMPLE_INTERVAL_S", {"simulated_sample_interval_s": 0}, "above 0"),
        ("SHARES_INTERVAL_S", {"shares_interval_s": 0}, "above 0"),
        ("MEMORY_SAMPLE_S", {"memory_sample_s": 0}, "above 0"),
        ("MEMORY_SAMPLE_S", {"memory_sample_s": float("nan")}, "nan"),
        ("SIMULATED_MIG_GPUS", {"simulated_gpus": 2, "simulated_mig_gpus": 3}, "3"),
        ("SIMULATED_MIG_LAYOUT", {"simulated_mig_layout": "1g.10gb:9"}, "'9'"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(
    field: str, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"SEEDANCE_NODE_AGENT_{field}") as caught:
        NodeAgentSettings(node_name="n", **kw)
    assert message in str(caught.value)


@pytest.mark.parametrize("name", ["gpu 1", "n" * 129, "gpu-1.example>"])
def test_a_node_name_that_cannot_name_its_subjects_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="SEEDANCE_NODE_AGENT_NODE_NAME") as caught:
        NodeAgentSettings(node_name=name)
    assert repr(name) in str(caught.value)


def test_a_dotted_node_name_is_accepted_as_kubernetes_names_nodes() -> None:
    assert NodeAgentSettings(node_name="ip-10-0-0-7.ec2.internal").node_name == (
        "ip-10-0-0-7.ec2.internal"
    )


@pytest.mark.parametrize(
    "resources",
    [
        "nvidia.com/gpu,seedance.io/gpu-milli,seedance.io/mig",  # the manifests'
        "nvidia.com/gpu,nvidia.com/mig-1g.10gb.me,nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-1g.24gb-me,nvidia.com/mig-1g.24gb.me.all,nvidia.com/mig-1g.24gb.gfx",
    ],
)
def test_resources_named_as_nvidias_device_plugin_names_them_are_served(resources: str) -> None:
    s = NodeAgentSettings(node_name="n", resources=resources)
    assert ",".join(s.resource_names) == resources


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        # Kubernetes refuses '+' in a resource name: the plugin writes '.', and so do pods
        ("nvidia.com/gpu,nvidia.com/mig-1g.10gb+me", "write nvidia.com/mig-1g.10gb.me"),
        ("nvidia.com/mig-1g.24gb+me.all", "write nvidia.com/mig-1g.24gb.me.all"),
        ("nvidia.com/mig-1G.10GB", "write nvidia.com/mig-1g.10gb"),  # names are case-sensitive
        ("nvidia.com/mig-3g-40gb", "'3g-40gb' is not a MIG profile"),
        ("nvidia.com/mig-9g.80gb", "no MIG GPU can hold"),
        # a compute instance NVIDIA's device plugin serves: not this agent's (no quota wording)
        ("nvidia.com/mig-1c.3g.20gb", "the node agent serves GPU instances only"),
        ("gpu", "'gpu' is no Kubernetes extended resource name"),
        ("nvidia.com/gpu,nvidia.com/gpu", "listed twice"),
        (" , ", "name at least one resource"),
    ],
)
def test_a_resource_the_kubelet_would_refuse_is_refused_at_start_with_the_fix(
    resources: str, message: str
) -> None:
    with pytest.raises(ValueError, match="SEEDANCE_NODE_AGENT_RESOURCES") as caught:
        NodeAgentSettings(node_name="n", resources=resources)
    assert message in str(caught.value)
