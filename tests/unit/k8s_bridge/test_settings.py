"""SEEDANCE_K8S_BRIDGE_* settings: typed, validated at load, unknown names refused."""

import pytest

from seedance.core.settings import SettingsError, load_settings
from seedance.k8s_bridge.settings import BridgeSettings


def test_defaults_and_overrides() -> None:
    s = load_settings(BridgeSettings, "k8s-bridge", {})
    assert s.scheduler_name == "seedance"
    assert s.publish_inventory is True
    s = load_settings(
        BridgeSettings,
        "k8s-bridge",
        {
            "SEEDANCE_K8S_BRIDGE_SCHEDULER_NAME": "gpu",
            "SEEDANCE_K8S_BRIDGE_PUBLISH_INVENTORY": "false",
        },
    )
    assert (s.scheduler_name, s.publish_inventory) == ("gpu", False)


def test_a_misspelt_setting_is_refused() -> None:
    with pytest.raises(SettingsError, match="SEEDANCE_K8S_BRIDGE_SCHEDULER_NAME"):
        load_settings(BridgeSettings, "k8s-bridge", {"SEEDANCE_K8S_BRIDGE_SCHEDULER_NAM": "x"})


def test_a_renewal_slower_than_the_lease_allows_is_refused() -> None:
    with pytest.raises((SettingsError, ValueError), match="LEASE_RENEW_S"):
        load_settings(
            BridgeSettings,
            "k8s-bridge",
            {
                "SEEDANCE_K8S_BRIDGE_LEASE_DURATION_S": "3",
                "SEEDANCE_K8S_BRIDGE_LEASE_RENEW_S": "2.5",
            },
        )


def test_the_request_rate_and_page_size_default_to_kube_schedulers_and_are_checked() -> None:
    s = load_settings(BridgeSettings, "k8s-bridge", {})
    assert (s.api_qps, s.api_burst, s.list_page_size) == (50.0, 100, 500)
    with pytest.raises((SettingsError, ValueError), match="API_BURST=0"):
        load_settings(BridgeSettings, "k8s-bridge", {"SEEDANCE_K8S_BRIDGE_API_BURST": "0"})
    with pytest.raises((SettingsError, ValueError), match="LIST_PAGE_SIZE=-1"):
        load_settings(BridgeSettings, "k8s-bridge", {"SEEDANCE_K8S_BRIDGE_LIST_PAGE_SIZE": "-1"})
    unlimited = load_settings(
        BridgeSettings,
        "k8s-bridge",
        {"SEEDANCE_K8S_BRIDGE_API_QPS": "0", "SEEDANCE_K8S_BRIDGE_API_BURST": "0"},
    )
    assert unlimited.api_qps == 0


def test_the_eviction_tries_end_before_the_decision_is_dead_lettered() -> None:
    assert BridgeSettings(evict_tries=1).evict_tries == 1
    for tries in (0, 10):
        with pytest.raises(ValueError, match=f"EVICT_TRIES={tries} .* max_deliver \\(10\\)"):
            BridgeSettings(evict_tries=tries)
