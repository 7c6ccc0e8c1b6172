"""The test API server's PodDisruptionBudget check at an eviction, as the real eviction REST and
the disruption controller decide it: selectors, minAvailable / maxUnavailable (int and %),
healthy = Ready, pods that may always go, one budget per pod."""

from __future__ import annotations

from typing import Any

import pytest

from seedance.testing.kube_api.disruption import check_eviction, selects
from seedance.testing.kube_api.errors import ApiError


def pod(
    name: str, *, ready: bool = True, phase: str = "Running", app: str = "web"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": app}},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


def pdb(
    name: str = "web-pdb", selector: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selector": selector if selector is not None else {"matchLabels": {"app": "web"}},
                 **spec},
    }  # fmt: skip


def refusal(
    victim: dict[str, Any], budgets: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> ApiError:
    with pytest.raises(ApiError) as info:
        check_eviction(victim, budgets, pods)
    return info.value


def test_min_available_blocks_the_eviction_that_would_go_below_it() -> None:
    pods = [pod("a"), pod("b")]
    err = refusal(pods[0], [pdb(minAvailable=2)], pods)
    assert (err.code, err.reason) == (429, "TooManyRequests")
    assert err.message == "Cannot evict pod as it would violate the pod's disruption budget."
    (cause,) = err.causes
    assert cause.reason == "DisruptionBudget"
    assert cause.message == "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
    check_eviction(pods[0], [pdb(minAvailable=1)], pods)  # one may go


def test_max_unavailable_and_percentages() -> None:
    pods = [pod(n) for n in "abcd"]
    check_eviction(pods[0], [pdb(maxUnavailable=1)], pods)
    assert refusal(pods[0], [pdb(maxUnavailable=0)], pods).code == 429
    assert refusal(pods[0], [pdb(minAvailable="100%")], pods).code == 429
    check_eviction(pods[0], [pdb(minAvailable="75%")], pods)  # needs 3 of 4
    # 25% of 4 rounds to 1 unavailable: one is already not ready, so none may go.
    pods[3] = pod("d", ready=False)
    assert refusal(pods[0], [pdb(maxUnavailable="25%")], pods).code == 429


def test_an_unready_pod_may_go_while_the_budget_is_met_or_always_with_always_allow() -> None:
    pods = [pod("a"), pod("b", ready=False)]
    check_eviction(pods[1], [pdb(minAvailable=1)], pods)  # 1 healthy of 1 needed
    assert refusal(pods[1], [pdb(minAvailable=2)], pods).code == 429
    check_eviction(pods[1], [pdb(minAvailable=2, unhealthyPodEvictionPolicy="AlwaysAllow")], pods)


def test_terminal_and_pending_pods_may_always_go_and_unselected_ones_are_free() -> None:
    budgets = [pdb(minAvailable=5)]
    check_eviction(pod("a", phase="Succeeded"), budgets, [])
    check_eviction(pod("a", phase="Pending"), budgets, [])
    check_eviction(pod("x", app="batch"), budgets, [pod("x", app="batch")])


def test_a_pod_under_two_budgets_is_refused_as_the_real_server_does() -> None:
    pods = [pod("a"), pod("b")]
    err = refusal(pods[0], [pdb("one", minAvailable=0), pdb("two", minAvailable=0)], pods)
    assert err.code == 500
    assert "more than one PodDisruptionBudget" in err.message


def test_label_selectors() -> None:
    labels = {"app": "web", "tier": "gpu"}
    assert selects({}, labels)  # policy/v1: an empty selector selects every pod
    assert selects(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, labels
    )
    assert not selects(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, labels
    )
    assert selects({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, labels)
    assert not selects({"matchLabels": {"app": "db"}}, labels)
