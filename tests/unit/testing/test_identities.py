"""The identities tests connect as (``seedance.testing.identities``): each service as its own
shipped user and no other, test code as the operator, and the connz check of service processes."""

from __future__ import annotations

import pytest

from seedance.core import BusSettings
from seedance.events.node_permissions import FLEET_REPLAYER, TELEMETRY_REPLAYER
from seedance.testing import identities
from seedance.testing.identities import ADMIN, ForeignIdentity, connect_policy

URL = "nats://127.0.0.1:1"


def test_every_service_has_a_shipped_user_and_a_test_password() -> None:
    services = {"telemetry-collector", "slicer", "router", "graph-compiler", "cost-ledger"}
    services |= {"k8s-bridge", "node-agent", "auth-callout"}
    assert services <= {u for u in identities.users() if identities.service_user(u)}
    assert ADMIN in identities.users()
    assert identities.service_user(ADMIN) is None
    assert identities.service_user("tenant-acme") is None
    assert identities.service_user("loop-test") is None
    assert identities.password("slicer") != identities.password("router")


def test_a_service_that_names_no_user_connects_as_its_own() -> None:
    got = connect_policy(BusSettings(url=URL, name="x"), "cost-ledger")
    assert (got.user, got.password) == ("cost-ledger", identities.password("cost-ledger"))
    assert got.name == "x"


@pytest.mark.parametrize("user", ["admin", "slicer", "tenant-acme"])
def test_a_service_under_another_user_is_refused(user: str) -> None:
    with pytest.raises(ForeignIdentity, match=f"'cost-ledger' would connect as '{user}'"):
        connect_policy(identities.as_user(URL, user), "cost-ledger")


def test_a_service_under_a_credentials_file_is_refused() -> None:
    with pytest.raises(ForeignIdentity):
        connect_policy(BusSettings(url=URL, creds="/x.creds"), "slicer")


def test_its_own_user_passes_unchanged() -> None:
    own = identities.as_user(URL, "router")
    assert connect_policy(own, "router") is own


@pytest.mark.parametrize("service", [None, "loop-test", "seedance-auth"])
def test_anything_else_that_names_no_user_is_the_operator(service: str | None) -> None:
    got = connect_policy(BusSettings(url=URL), service)
    assert (got.user, got.password) == (ADMIN, identities.password(ADMIN))
    tenant = identities.as_user(URL, "tenant-acme")
    assert connect_policy(tenant, service) is tenant


def test_foreign_connections_names_a_service_process_under_another_user() -> None:
    conns = [
        {"cid": 1, "name": "seedance-slicer", "authorized_user": "slicer"},
        {"cid": 2, "name": "seedance-cost-ledger", "authorized_user": "admin"},
        {"cid": 3, "name": "seedance-sdk", "authorized_user": "admin"},
        {"cid": 4, "name": "test", "authorized_user": "admin"},
        {"cid": 5, "name": "seedance-router"},
    ]
    found = identities.foreign_connections(conns)
    assert len(found) == 2
    assert "connection 2 'seedance-cost-ledger' authorised as 'admin', not 'cost-ledger'" in found
    assert "connection 5 'seedance-router' authorised as None, not 'router'" in found


@pytest.mark.parametrize("service", ["telemetry-collector", "node-agent"])
def test_a_nodes_agents_may_run_as_a_nodes_own_user_and_no_other_service_may(
    service: str,
) -> None:
    """On Kubernetes with the per-node credentials the collector and the node agent connect as
    ``node-<their node>`` (docs/security.md, "One identity per node"): tests run them so."""
    node = BusSettings(url=URL, user="node-gpu-a.example", password="pw")
    assert connect_policy(node, service) is node
    with pytest.raises(ForeignIdentity):
        connect_policy(identities.as_user(URL, "admin"), service)
    with pytest.raises(ForeignIdentity):
        connect_policy(node, "slicer")
    conns = [
        {"cid": 1, "name": f"seedance-{service}", "authorized_user": "node-gpu-a.example"},
        {"cid": 2, "name": "seedance-slicer", "authorized_user": "node-gpu-a.example"},
        {"cid": 3, "name": f"seedance-{service}", "authorized_user": "admin"},
    ]
    found = identities.foreign_connections(conns)
    assert [f.split()[1] for f in found] == ["2", "3"]


@pytest.mark.parametrize("user", [FLEET_REPLAYER, TELEMETRY_REPLAYER])
def test_the_collector_replaying_a_fleet_may_run_as_a_replaying_user_and_no_other_may(
    user: str,
) -> None:
    """The shipped ``telemetry-collector`` (a real node's) reads no decision; a replay follows
    them as a replaying collector's user. No other service may take that user."""
    replaying = identities.as_user(URL, user)
    assert connect_policy(replaying, "telemetry-collector") is replaying
    for service in ("node-agent", "slicer"):
        with pytest.raises(ForeignIdentity):
            connect_policy(replaying, service)
