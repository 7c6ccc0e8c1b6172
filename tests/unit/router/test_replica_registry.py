"""The pure replica decision: registrations first, the configured list as the fallback."""

from __future__ import annotations

from seedance.events.routing import ReplicaRegistration
from seedance.router.core.replica_registry import (
    ReplicaTarget,
    desired_replicas,
    replica_changes,
)

STATIC = {"s": "10.0.0.9:8001"}


def reg(model: str, replica: str, address: str, *, ready: bool = True) -> ReplicaRegistration:
    return ReplicaRegistration(model=model, replica=replica, address=address, ready=ready)


def test_no_registration_is_the_static_fallback_serving_every_model() -> None:
    assert desired_replicas([], STATIC) == {
        "s": ReplicaTarget(name="s", address="10.0.0.9:8001", models=None)
    }


def test_ready_registrations_replace_the_fallback_and_union_their_models() -> None:
    got = desired_replicas(
        [reg("echo", "p1", "10.0.0.1:8001"), reg("llama", "p1", "10.0.0.1:8001")], STATIC
    )
    assert got == {
        "p1": ReplicaTarget(name="p1", address="10.0.0.1:8001", models=frozenset({"echo", "llama"}))
    }


def test_unready_registrations_count_as_absent() -> None:
    assert desired_replicas([reg("echo", "p1", "10.0.0.1:8001", ready=False)], STATIC) == (
        desired_replicas([], STATIC)
    )
    got = desired_replicas(
        [reg("echo", "p1", "10.0.0.1:8001", ready=False), reg("echo", "p2", "10.0.0.2:8001")],
        STATIC,
    )
    assert set(got) == {"p2"}


def test_one_id_with_two_addresses_keeps_the_lowest_deterministically() -> None:
    regs = [reg("a", "p1", "10.0.0.2:8001"), reg("b", "p1", "10.0.0.1:8001")]
    for order in (regs, regs[::-1]):
        assert desired_replicas(order, {}) == {
            "p1": ReplicaTarget(name="p1", address="10.0.0.1:8001", models=frozenset({"b"}))
        }


def test_changes_add_new_remove_gone_and_replace_changed() -> None:
    old = {
        "keep": ReplicaTarget(name="keep", address="h:1", models=None),
        "gone": ReplicaTarget(name="gone", address="h:2", models=None),
        "moved": ReplicaTarget(name="moved", address="h:3", models=frozenset({"m"})),
    }
    new = {
        "keep": old["keep"],
        "moved": ReplicaTarget(name="moved", address="h:4", models=frozenset({"m"})),
        "new": ReplicaTarget(name="new", address="h:5", models=frozenset({"m"})),
    }
    change = replica_changes(old, new)
    assert change.remove == ("gone", "moved")
    assert change.add == (new["moved"], new["new"])
    assert replica_changes(new, new).add == replica_changes(new, new).remove == ()


def owned(replica: str, address: str, owner: str, model: str = "echo") -> ReplicaRegistration:
    return ReplicaRegistration(model=model, replica=replica, address=address, owner=owner)


def test_a_tenants_replicas_are_its_own_named_by_tenant_and_never_merged_with_others() -> None:
    got = desired_replicas(
        [
            owned("p1", "10.0.0.1:8001", "acme"),
            owned("p1", "10.0.0.2:8001", "globex"),  # the same replica id, another tenant
            reg("echo", "p1", "10.0.0.3:8001"),  # and the shared pool's
        ],
        STATIC,
    )
    assert got == {
        "acme/p1": ReplicaTarget(
            name="acme/p1", address="10.0.0.1:8001", models=frozenset({"echo"}), owner="acme"
        ),
        "globex/p1": ReplicaTarget(
            name="globex/p1", address="10.0.0.2:8001", models=frozenset({"echo"}), owner="globex"
        ),
        "p1": ReplicaTarget(name="p1", address="10.0.0.3:8001", models=frozenset({"echo"})),
    }


def test_a_tenants_registration_does_not_take_the_shared_fallback_away() -> None:
    got = desired_replicas([owned("p1", "10.0.0.1:8001", "globex")], STATIC)
    assert set(got) == {"s", "globex/p1"}
    assert got["s"] == ReplicaTarget(name="s", address="10.0.0.9:8001", models=None)
    # a shared registration does
    got = desired_replicas(
        [owned("p1", "10.0.0.1:8001", "globex"), reg("echo", "p2", "10.0.0.2:8001")], STATIC
    )
    assert set(got) == {"p2", "globex/p1"}
