"""deploy/auth: the declarations in seedance.events.permissions are the code's, and the rendered
NATS config is exactly what they give.

The server-side proof (every verb a tenant could try is refused) is
tests/integration/deploy/test_tenant_verbs.py; here: every catalogue name is declared by the
identity whose code uses it, and by no other; tenants' grants have no tails and name no one
else; the renderer, the thin tool and the password rule.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from seedance.events import nats_config, permissions
from seedance.events.permissions import IDENTITIES, SERVICES, Declaration, PermissionsError
from seedance.events.subjects import (
    BUCKETS,
    CONSUMERS,
    OBJECT_STORES,
    STREAMS,
    TENANT_KINDS,
    costs,
    inbox_prefix,
    jobs,
    slicing,
)
from seedance.testing.servers import nats_server_binary
from tests.unit.deploy.declared import DEPLOY, REPO, auth_users, load_tool, services

gen = load_tool("gen_nats_auth")


def source_of(name: str) -> str:
    return "\n".join(p.read_text() for p in (REPO / "services" / name / "src").rglob("*.py"))


def test_rendered_configs_have_not_drifted() -> None:
    text = gen.render_source()
    for out in gen.OUTPUTS:
        assert out.read_text() == text, f"{out.relative_to(REPO)} is stale: run `make nats-auth`"
    assert (DEPLOY / "k8s" / "base" / "nats" / "auth.conf") in gen.OUTPUTS


def test_every_workspace_service_is_declared() -> None:
    assert set(SERVICES) == set(services())
    assert set(SERVICES) <= set(IDENTITIES)


def test_every_catalogue_durable_is_declared_by_exactly_one_identity() -> None:
    owners = {d: [i.name for i in IDENTITIES.values() if d in i.consumes] for d in CONSUMERS}
    assert {d: o for d, o in owners.items() if len(o) != 1} == {}


def test_every_bucket_and_object_store_is_declared_by_someone() -> None:
    used = {b for i in IDENTITIES.values() for b in i.buckets}
    assert used == set(BUCKETS)
    assert {o for i in IDENTITIES.values() for o in i.object_stores} == set(OBJECT_STORES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_catalogue_name_in_a_services_code_is_in_its_declaration(name: str) -> None:
    """Each durable, bucket or store whose name a service's source spells is one it declares
    (a name is a string literal in the code: the catalogue's names are unique words)."""
    src = source_of(name)
    decl = IDENTITIES[name]
    for names, declared in (
        (CONSUMERS, decl.consumes),
        (BUCKETS, decl.buckets),
        (OBJECT_STORES, decl.object_stores),
    ):
        spelled = {n for n in names if re.search(rf"[\"']{re.escape(n)}[\"']", src)}
        assert spelled <= set(declared), f"{name} uses {spelled - set(declared)} undeclared"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_publishes_only_the_families_it_declares(name: str) -> None:
    user = permissions.service_user(name)
    data = [s for s in user.permissions.publish_allow if s.startswith("seedance.")]
    declared = {permissions.FAMILIES[f] for f in IDENTITIES[name].publishes}
    assert set(data) == declared | {f"seedance.dlq.{name}"}


def test_only_trusted_observers_publish_observed_events_and_no_tenant_a_trusted_family() -> None:
    observed = [i.name for i in IDENTITIES.values() if "observed" in i.publishes]
    assert sorted(observed) == ["k8s-bridge", "replayer"]
    user = permissions.tenant_user("acme")
    for s in user.permissions.publish_allow:
        family = s.split(".")[1] if s.startswith("seedance.") else None
        assert family is None or family == "jobs", s


def test_tenant_publishes_exactly_its_request_subjects() -> None:
    p = permissions.tenant_permissions("acme")
    data = [s for s in p.publish_allow if not s.startswith("$")]
    assert tuple(data) == jobs.tenant_subjects("acme")
    assert len(data) == len(TENANT_KINDS["jobs"])
    assert not any(s.endswith(">") for s in p.publish_allow if not s.startswith("$JS.FC."))
    assert not any("globex" in s for s in p.publish_allow + p.publish_deny)
    assert p.subscribe_allow == (f"{inbox_prefix('acme')}.>",)


def test_tenant_consumers_are_confined_to_its_own_costs_and_decisions() -> None:
    p = permissions.tenant_permissions("acme")
    creates = [s for s in p.publish_allow if ".CONSUMER.CREATE." in s]
    assert creates == [
        f"$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.*.{costs.tenant_wildcard('acme')}",
        f"$JS.API.CONSUMER.CREATE.SEEDANCE_SLICING.*.{slicing.tenant_wildcard('acme')}",
    ]
    assert not [s for s in p.publish_allow if ".MSG.NEXT." in s or "DURABLE" in s]


@pytest.mark.parametrize("durable", sorted(CONSUMERS))
def test_every_catalogue_durable_on_a_tenant_stream_is_denied_every_verb(durable: str) -> None:
    c = CONSUMERS[durable]
    p = permissions.tenant_permissions("acme")
    if c.stream not in {s for s, _ in permissions.TENANT_READS}:
        assert not [s for s in p.publish_allow if c.stream in s]
        return
    for verb in ("CREATE", "DURABLE.CREATE", "DELETE", "INFO", "MSG.NEXT"):
        assert f"$JS.API.CONSUMER.{verb}.{c.stream}.{durable}" in p.publish_deny
    # the old config denied DELETE and INFO but let a tenant re-create it with its own filter
    assert f"$JS.API.CONSUMER.CREATE.{c.stream}.{durable}.>" in p.publish_deny


def test_a_per_replica_consumer_on_a_tenant_stream_fails_the_render(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replica = CONSUMERS["ledger-in"]
    monkeypatch.setitem(
        CONSUMERS, "bad-in", type(replica)("bad-in", "SEEDANCE_COSTS", (), acked=False)
    )
    with pytest.raises(PermissionsError, match="per-replica names on SEEDANCE_COSTS"):
        permissions.tenant_permissions("acme")


def test_unknown_catalogue_names_fail_the_declaration() -> None:
    with pytest.raises(PermissionsError, match="no consumer 'no-such-durable'"):
        Declaration("x", consumes=("no-such-durable",))
    with pytest.raises(PermissionsError, match="unknown subject family 'nope'"):
        Declaration("x", publishes=("nope",))
    with pytest.raises(PermissionsError, match="no KV bucket 'nope'"):
        Declaration("x", buckets=("nope",))
    with pytest.raises(PermissionsError, match="no declaration for 'nobody'"):
        permissions.service_user("nobody")


def test_a_reserved_or_invalid_tenant_is_refused_with_the_reason() -> None:
    with pytest.raises(PermissionsError, match="reserved"):
        permissions.tenant_permissions("node")
    with pytest.raises(ValueError, match="not a valid tenant id"):
        permissions.tenant_permissions("a.>")


def test_every_service_provisions_every_stream() -> None:
    for name in SERVICES:
        allow = permissions.service_user(name).permissions.publish_allow
        for s in STREAMS:
            assert f"$JS.API.STREAM.CREATE.{s.name}" in allow


def test_users_yaml_lists_only_deployment_choices() -> None:
    assert set(auth_users()) <= {"tenants", "operators", "auth_callout"}
    names = [u.name for u in gen.users_from(auth_users())]
    assert set(IDENTITIES) <= set(names)
    assert {f"tenant-{t}" for t in auth_users()["tenants"]} <= set(names)


def test_the_callout_lists_every_static_user_as_bypassing_it() -> None:
    text = gen.render_source()
    block = text.split("auth_callout {", 1)[1]
    listed = re.findall(r'^\s+"([^"]+)"$', block.split("]", 1)[0], re.M)
    assert listed == [u.name for u in gen.users_from(auth_users())]
    assert f"issuer: ${nats_config.CALLOUT_ISSUER_VAR}" in block


# --- passwords ------------------------------------------------------------------------------

BREAKS_THE_SERVER = ["12345678", "true", "-abcdef12", "2024-01-01", "abc def", "x;yyyyyyy"]
ACCEPTED = ["e2024-01-01", "Yes-but-no", "true-value", "dev-slicer", "n_12345678", "aBCDEFGH"]


def _server_accepts(password: str, tmp_path: object) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "t.conf"  # type: ignore[operator]
    conf.write_text("authorization { users = [ { user: a, password: $NATS_PASSWORD_A } ] }\n")
    return subprocess.run(
        [nats_server_binary(), "-c", str(conf), "-t"],
        env={"NATS_PASSWORD_A": password},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("value", BREAKS_THE_SERVER)
def test_a_password_the_server_would_misparse_is_refused_naming_the_variable(
    value: str, tmp_path: object
) -> None:
    done = _server_accepts(value, tmp_path)  # the pinned server itself: why the rule exists
    assert done.returncode != 0 or "valid" not in done.stderr + done.stdout
    with pytest.raises(nats_config.PasswordError, match="NATS_PASSWORD_A") as err:
        nats_config.check_server_password("NATS_PASSWORD_A", value)
    assert value not in str(err.value) or value.isalpha()  # never echoes the secret


@pytest.mark.parametrize("value", [*ACCEPTED, *(nats_config.new_password() for _ in range(5))])
def test_a_password_the_rule_accepts_starts_the_server(value: str, tmp_path: object) -> None:
    nats_config.check_server_password("NATS_PASSWORD_A", value)
    done = _server_accepts(value, tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout


def test_env_example_names_every_variable_the_config_needs_and_the_rule() -> None:
    example = (DEPLOY / "compose" / ".env.example").read_text()
    wanted = {nats_config.password_var(u.name) for u in gen.users_from(auth_users())}
    keys = {line.split("=")[0] for line in example.splitlines() if "=" in line and line[0] != "#"}
    assert wanted | {nats_config.CALLOUT_ISSUER_VAR} <= keys
    assert "gen_nats_auth.py --new-password" in example
    assert "letter" in example


def test_check_env_names_each_bad_or_missing_password() -> None:
    values = {
        nats_config.password_var(u.name): "a-good-password" for u in gen.users_from(auth_users())
    }
    assert gen.check_env(values) == []
    values["NATS_PASSWORD_SLICER"] = "12345678"
    del values["NATS_PASSWORD_ADMIN"]
    problems = gen.check_env(values)
    assert len(problems) == 2
    assert any(p.startswith("NATS_PASSWORD_SLICER does not follow the rule") for p in problems)
    assert "NATS_PASSWORD_ADMIN is not set" in problems
