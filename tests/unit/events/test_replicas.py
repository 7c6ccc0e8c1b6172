"""seedance.events.replicas: the replica-set model its registrars write and gateways read."""

from __future__ import annotations

import pytest

from seedance.events import replicas
from seedance.events.replicas import RegistrationError, ReplicaRegistration
from seedance.events.routing import ReplicaRegistration as FromRouting
from seedance.events.subjects import routing
from seedance.events.tokens import InvalidToken

ME = "k8s-bridge/seedance-system/seedance-k8s-bridge"


def reg(
    replica: str, address: str = "10.0.0.1:8001", *, ready: bool = True, registrar: str = ""
) -> ReplicaRegistration:
    return ReplicaRegistration(
        model="echo", replica=replica, address=address, ready=ready, registrar=registrar
    )


def key(replica: str, fleet: str = "f") -> str:
    return routing.replica_key(fleet, "echo", replica)


def test_the_replica_set_name_is_the_prefix_of_its_members_keys() -> None:
    assert replicas.replica_set("f", "echo") == "f.echo"
    assert key("pod-1").startswith(replicas.replica_set("f", "echo") + ".")
    with pytest.raises(InvalidToken, match=r"model 'a\.b'"):
        replicas.replica_set("f", "a.b")


def test_a_value_round_trips_and_the_router_module_re_exports_the_type() -> None:
    r = reg("pod-1", ready=False, registrar=ME)
    assert replicas.decode("f", key("pod-1"), replicas.encode(r)) == r
    assert FromRouting is ReplicaRegistration
    # An older writer's value (no registrar) reads with the default.
    old = b'{"model":"echo","replica":"pod-1","address":"10.0.0.1:8001"}'
    assert replicas.decode("f", key("pod-1"), old) == reg("pod-1")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (b"not json", "not a replica registration"),
        (b'{"model":"echo","replica":"a.b","address":"x:1"}', "not a replica registration"),
        (b'{"model":"echo","address":"x:1"}', "replica"),
    ],
)
def test_an_unreadable_value_is_refused_naming_its_key(value: bytes, words: str) -> None:
    with pytest.raises(RegistrationError, match=words) as err:
        replicas.decode("f", key("pod-1"), value)
    assert key("pod-1") in str(err.value)


def test_a_registration_under_another_replicas_key_is_refused() -> None:
    with pytest.raises(RegistrationError, match=r"belongs under 'f\.echo\.pod-2'"):
        replicas.decode("f", key("pod-1"), replicas.encode(reg("pod-2")))
    with pytest.raises(RegistrationError, match="belongs under"):  # another fleet's key
        replicas.decode("g", key("pod-1"), replicas.encode(reg("pod-1")))


def test_changes_put_what_differs_and_delete_only_the_registrars_own_keys() -> None:
    current = {
        key("same"): reg("same", registrar=ME),
        key("moved"): reg("moved", "10.0.0.9:8001", registrar=ME),
        key("gone"): reg("gone", registrar=ME),
        key("operator"): reg("operator"),  # an operator's: never pruned
        key("other"): reg("other", registrar="k8s-bridge/x/y"),  # another cluster's bridge
    }
    desired = [("f", reg("same")), ("f", reg("moved")), ("f", reg("new", ready=False))]
    out = replicas.registration_changes(current, desired, registrar=ME)
    assert out.put == {
        key("moved"): reg("moved", registrar=ME),
        key("new"): reg("new", ready=False, registrar=ME),
    }
    assert out.delete == (key("gone"),)
    assert not out.empty
    # Once written, nothing more to do.
    after = {k: v for k, v in {**current, **out.put}.items() if k not in out.delete}
    assert replicas.registration_changes(after, desired, registrar=ME).empty


def test_one_replica_in_two_slices_keeps_the_ready_then_the_lowest_address() -> None:
    for order in (1, -1):
        desired = [
            ("f", reg("p", "10.0.0.2:8001", ready=False)),
            ("f", reg("p", "10.0.0.3:8001")),
            ("f", reg("p", "10.0.0.4:8001")),
        ][::order]
        out = replicas.registration_changes({}, desired, registrar=ME)
        assert out.put == {key("p"): reg("p", "10.0.0.3:8001", registrar=ME)}


def test_an_operators_key_that_the_slices_also_name_is_taken_over() -> None:
    current = {key("p"): reg("p")}
    out = replicas.registration_changes(current, [("f", reg("p"))], registrar=ME)
    assert out.put == {key("p"): reg("p", registrar=ME)}
    assert out.delete == ()


# --- owners: a tenant's replicas live under its own keys -----------------------------------


def owned(replica: str, owner: str = "acme") -> ReplicaRegistration:
    return ReplicaRegistration(model="echo", replica=replica, address="10.0.0.1:8001", owner=owner)


def test_a_tenants_replica_is_keyed_and_named_under_its_tenant() -> None:
    assert routing.replica_key("f", "echo", "p", "acme") == "f.acme.echo.p"
    assert replicas.replica_set("f", "echo", "acme") == "f.acme.echo"
    assert routing.replica_key("f", "echo", "p", "acme").startswith("f.acme.echo.")
    r = owned("p")
    assert replicas.decode("f", "f.acme.echo.p", replicas.encode(r)) == r
    with pytest.raises(InvalidToken, match="tenant 'Acme'"):
        routing.replica_key("f", "echo", "p", "Acme")


@pytest.mark.parametrize(
    ("key_", "value"),
    [
        ("f.globex.echo.p", owned("p")),  # acme's registration under globex's key
        ("f.echo.p", owned("p")),  # a tenant's posing as the shared pool's
        ("f.acme.echo.p", reg("p")),  # the shared pool's posing as a tenant's
    ],
)
def test_a_registration_under_another_owners_key_is_refused(
    key_: str, value: ReplicaRegistration
) -> None:
    with pytest.raises(RegistrationError, match="belongs under"):
        replicas.decode("f", key_, replicas.encode(value))


def test_an_owner_that_is_no_tenant_id_is_refused() -> None:
    value = b'{"model":"echo","replica":"p","address":"x:1","owner":"a.b"}'
    with pytest.raises(RegistrationError, match=r"owner: tenant 'a\.b'"):
        replicas.decode("f", "f.a.b.echo.p", value)


def test_changes_key_each_registration_under_its_owner() -> None:
    changes = replicas.registration_changes(
        {}, [("f", owned("p")), ("f", owned("p", "globex")), ("f", reg("p"))], registrar=ME
    )
    assert sorted(changes.put) == ["f.acme.echo.p", "f.echo.p", "f.globex.echo.p"]
