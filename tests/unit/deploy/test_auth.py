"""deploy/auth: the rendered NATS config is the one users.yaml gives, and users.yaml the code's."""

from __future__ import annotations

import re

import pytest

from seedance.events import subjects
from tests.unit.deploy.declared import DEPLOY, REPO, auth_users, load_tool, services

gen = load_tool("gen_nats_auth")


def test_rendered_configs_have_not_drifted_from_users_yaml() -> None:
    text = gen.render_source()
    for out in gen.OUTPUTS:
        assert out.read_text() == text, f"{out.relative_to(REPO)} is stale: run `make nats-auth`"
    assert (DEPLOY / "k8s" / "base" / "nats" / "auth.conf") in gen.OUTPUTS


def test_every_workspace_service_has_a_user() -> None:
    assert set(auth_users()["services"]) == set(services())


@pytest.mark.parametrize("name", sorted(services()))
def test_users_yaml_covers_what_the_service_code_consumes_and_stores(name: str) -> None:
    src = "\n".join(p.read_text() for p in (REPO / "services" / name / "src").rglob("*.py"))
    consumed = set(re.findall(r"\.consume\(\s*\"([a-z0-9-]+)\"", src))
    buckets = set(re.findall(r"ensure_bucket\([^,]+,\s*\"([a-z0-9-]+)\"", src))
    spec = auth_users()["services"][name]
    assert consumed <= set(spec["consumes"]), consumed - set(spec["consumes"])
    assert buckets <= set(spec["buckets"]), buckets - set(spec["buckets"])


def test_unknown_catalogue_names_fail_the_render() -> None:
    with pytest.raises(KeyError, match="no-such-durable"):
        gen.service_user("slicer", {"consumes": ["no-such-durable"]})
    with pytest.raises(ValueError, match="unknown subject family"):
        gen.service_user("slicer", {"publishes": ["nope"]})


def test_tenant_permissions_name_only_its_own_subjects() -> None:
    user = gen.tenant_user("acme")
    assert subjects.jobs.tenant_wildcard("acme") in user.publish_allow
    assert not any("globex" in s or s == subjects.jobs.ALL for s in user.publish_allow)
    creates = [s for s in user.publish_allow if ".CONSUMER.CREATE." in s]
    assert creates == [
        "$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.*.seedance.costs.acme.*",
        "$JS.API.CONSUMER.CREATE.SEEDANCE_SLICING.*.seedance.slicing.acme.*",
    ]
    assert user.subscribe_allow == ("_INBOX_acme.>",)
    # the catalogue's durables on the cost stream cannot be deleted or inspected by a tenant
    protected = [c for c in subjects.CONSUMERS.values() if c.stream == "SEEDANCE_COSTS"]
    assert protected
    for c in protected:
        assert f"$JS.API.CONSUMER.DELETE.SEEDANCE_COSTS.{c.durable}" in user.publish_deny
