"""The reconciler's status writes: a merge patch of what changed, nothing when nothing did."""

from seedance.k8s_bridge.core.policy import TENANT_QUOTA, reconcile
from seedance.k8s_bridge.core.status import merge_patch, status_patches
from seedance.testing.kube_api.patch import merge_patch as apply_merge_patch


def _cr(status: dict | None = None) -> dict:  # type: ignore[type-arg]
    cr = {
        "apiVersion": "seedance.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {
            "name": "team-a",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"tenant": "team-a", "namespaces": ["a"], "quota": {"gpus": 4}},
    }
    if status is not None:
        cr["status"] = status
    return cr


def test_the_patch_takes_the_old_status_to_the_new_one() -> None:
    old = {"usage": {"gpus": 2, "sharedGpus": 1}, "conditions": [{"type": "Ready"}], "x": 1}
    new = {"usage": {"gpus": 3}, "conditions": [{"type": "Ready"}, {"type": "Accepted"}]}
    patch = merge_patch(old, new)
    assert patch == {
        "usage": {"gpus": 3, "sharedGpus": None},
        "conditions": [{"type": "Ready"}, {"type": "Accepted"}],
        "x": None,
    }
    assert apply_merge_patch(old, patch) == new
    assert merge_patch(new, new) == {}


def test_a_status_already_written_is_not_written_again() -> None:
    out = reconcile([], [_cr()], usage={"team-a": {"gpus": 1}}, observed_at="2026-01-02T00:00:00Z")
    key = (TENANT_QUOTA, "team-a")
    (body,) = status_patches(out.statuses, {key: _cr()}).values()
    written = _cr(body["status"])
    later = reconcile(
        [], [written], usage={"team-a": {"gpus": 1}}, observed_at="2026-01-03T00:00:00Z"
    )
    assert status_patches(later.statuses, {key: written}) == {}  # transition times kept
    moved = reconcile([], [written], usage={}, observed_at="2026-01-03T00:00:00Z")
    assert status_patches(moved.statuses, {key: written}) == {
        key: {"status": {"usage": {"gpus": None}}}
    }


def test_a_field_the_reconciler_does_not_own_is_left_alone_and_a_gone_cr_skipped() -> None:
    out = reconcile([], [_cr()], observed_at="2026-01-02T00:00:00Z")
    key = (TENANT_QUOTA, "team-a")
    (body,) = status_patches(out.statuses, {key: _cr({"someoneElse": 1})}).values()
    assert "someoneElse" not in body["status"]
    assert status_patches(out.statuses, {}) == {}
