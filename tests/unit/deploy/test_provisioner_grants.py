"""The provisioner's grants, as rendered into deploy/auth: exactly what `seedance admin
provision` calls, by catalogue name (the server's refusals of the rest:
tests/integration/deploy/test_provisioner.py)."""

from __future__ import annotations

from seedance.events.provision_permissions import (
    PROVISIONER,
    PROVISIONER_INBOX,
    provisioned_streams,
)
from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS, inbox_prefix
from tests.unit.deploy.declared import auth_choices


def _provisioner() -> tuple[tuple[str, ...], tuple[str, ...]]:
    (user,) = [u for u in auth_choices().users() if u.name == PROVISIONER]
    assert not user.unrestricted
    p = user.permissions
    assert (p.publish_deny, p.subscribe_deny, p.allow_responses) == ((), (), False)
    return p.publish_allow, p.subscribe_allow


def test_the_shipped_provisioner_converges_every_catalogue_stream_and_nothing_else() -> None:
    publish, _ = _provisioner()
    names = {s.name for s in STREAMS} | {f"KV_{b}" for b in BUCKETS}
    names |= {f"OBJ_{o}" for o in OBJECT_STORES}
    assert set(provisioned_streams()) == names
    mirrors = {s.name for s in STREAMS if s.mirror is not None}
    assert mirrors  # the router's plan mirror, the node agents' decisions
    assert set(publish) == {
        "$JS.API.INFO",
        *(f"$JS.API.STREAM.{v}.{n}" for v in ("INFO", "CREATE", "UPDATE") for n in names),
        *(f"$JS.API.STREAM.DELETE.{n}" for n in mirrors),
    }
    assert not [s for s in publish if "*" in s or ">" in s]  # every grant names its stream


def test_the_provisioner_listens_under_its_own_inbox_only() -> None:
    """Not the services' ``_INBOX.>`` (every service's fetched messages arrive under it), nor
    any tenant's ``_INBOX_<tenant>``."""
    _, subscribe = _provisioner()
    assert subscribe == (f"{PROVISIONER_INBOX}.>",)
    assert not PROVISIONER_INBOX.startswith("_INBOX.")
    assert inbox_prefix("provisioner") != PROVISIONER_INBOX


def test_every_harness_provisions_as_the_provisioner() -> None:
    """The demo, the local stack, the benches and the dev cluster provision a server as a
    deployment does (compose's one-shot, the Job): as ``provisioner``, never the operator, so
    that each run also proves the shipped grants suffice. Every ``provision(url, user, ...)``
    call (`seedance.testing.servers.provision`) outside the test servers' own, by its user."""
    import ast

    from seedance.testing.paths import REPO

    roots = [REPO / "harness", REPO / "libs" / "testing", REPO / "tests" / "e2e"]
    users: dict[str, str] = {}
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "provision"
                and len(node.args) >= 2
            ):
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                users[where] = ast.unparse(node.args[1])
    servers = "libs/testing/src/seedance/testing/servers.py"
    by = {w: u for w, u in users.items() if not w.startswith(servers)}
    assert len(by) >= 5, users  # the demo, local stack, two chaos benches, scale, dev cluster
    assert {w: u for w, u in by.items() if u != "PROVISIONER"} == {}
