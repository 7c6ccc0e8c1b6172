"""What crosses from Seedance's account to the tenants' (``seedance.events.accounts``), checked
against the tenants' permissions and the rendered config.

A tenant is a user of ``TENANTS``; a subject it may publish on reaches Seedance's services and
JetStream only through a service ``SEEDANCE`` exports and ``TENANTS`` imports. A permission
with no export behind it is a verb the tenant is granted and cannot use (its request lands in
``TENANTS``, where nobody answers); an export with no permission behind it is a door no tenant
was meant to have. The server-side proof is tests/integration/deploy/test_tenant_account.py.
"""

from __future__ import annotations

import inspect
import re

import pytest

from seedance.core.consumer import PullConsumer
from seedance.core.principals import account_of
from seedance.core.reader import PullReader
from seedance.core.tenant_registry import node_key
from seedance.events import nats_config
from seedance.events.accounts import (
    ACCOUNTS,
    DELIVERIES,
    NODES_ACCOUNT,
    PULL_RESPONSE_THRESHOLD,
    RESPONSE_THRESHOLD,
    SEEDANCE_ACCOUNT,
    TENANTS_ACCOUNT,
    covers,
    node_flow_control,
    node_pulls,
    node_services,
    node_streams,
    tenant_flow_control,
    tenant_services,
)
from seedance.events.node_permissions import (
    FLEET_REPLAYER,
    NODE_AGENTS,
    NODE_USER_PREFIX,
    TELEMETRY_REPLAYER,
    fleet_replayer_user,
    node_user,
    shared_node_user,
    telemetry_replayer_user,
)
from seedance.events.permissions import User, tenant_permissions
from seedance.testing.servers import with_fleet_replayer
from tests.unit.deploy.declared import REPO, auth_choices

#: A short id, one with the tokens' own words in it, and the longest id there may be (63).
TENANTS = ["acme", "seedance-jobs-costs", "t" + "-0123456789" * 5 + "-abcdez"]


def test_the_matcher_is_nats_matching() -> None:
    assert covers("a.*.c", "a.b.c")
    assert covers("a.*.c", "a.*.c")
    assert covers("a.>", "a.b.*.>")
    assert not covers("a.>", "a")
    assert not covers("a.b.c", "a.*.c")
    assert not covers("a.*", "a.>")
    assert not covers("a.*", "a.b.c")
    assert not covers("a.*.c", "a.b")


def test_the_longest_tenant_id_is_one() -> None:
    assert len(TENANTS[-1]) == 63
    tenant_permissions(TENANTS[-1])  # valid: raises otherwise


@pytest.mark.parametrize("tenant", TENANTS, ids=lambda t: f"len{len(t)}")
def test_every_subject_a_tenant_may_publish_on_is_exported_to_the_tenants(tenant: str) -> None:
    allowed = tenant_permissions(tenant).publish_allow
    services = tenant_services() + tenant_flow_control()
    assert [s for s in allowed if not any(covers(e, s) for e in services)] == []
    # and nothing is exported that no tenant may publish on
    assert [e for e in services if not any(covers(e, s) for s in allowed)] == []


def test_an_export_names_no_tenant_and_no_consumer_of_one() -> None:
    for subject in tenant_services():
        assert "anytenant" not in subject, subject
        assert not any(t in subject.split(".") for t in TENANTS), subject
        assert not subject.startswith(("_INBOX", DELIVERIES[:-2])), subject


def block(text: str, opening: str, indent: str) -> list[str]:
    """The lines inside the one block that opens with the line ``opening`` and closes at the
    first line that is ``indent`` followed by a closing bracket."""
    lines = text.split("\n")
    assert lines.count(opening) == 1, opening
    start = lines.index(opening) + 1
    end = next(i for i in range(start, len(lines)) if re.fullmatch(rf"{indent}[}}\]]", lines[i]))
    return lines[start:end]


def lines_of(text: str, account: str, kind: str) -> list[str]:
    return block("\n".join(block(text, f"  {account} {{", "  ")), f"    {kind} = [", "    ")


def test_flow_control_is_no_service() -> None:
    """Flow control is answered by nothing: as a service each of a tenant's publishes with a
    reply left the server an entry for minutes (review of 2026-12-07, ~33 MiB per 100,000)."""
    assert tenant_flow_control()
    assert all(s.startswith("$JS.FC.") for s in tenant_flow_control())
    assert not any(s.startswith("$JS.FC.") for s in tenant_services())


EXPORT = re.compile(r'      \{(service|stream): "([^"]+)", accounts: \[([A-Z, ]+)\](.*)\}')
IMPORT = re.compile(r'      \{(service|stream): \{account: ([A-Z]+), subject: "([^"]+)"\}\}')


def crossings(text: str, account: str) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """An account's exports (kind, subject, importers, terms) and imports (kind, exporter,
    subject); every line of the blocks is one of these forms."""
    exported = [EXPORT.fullmatch(x) for x in lines_of(text, account, "exports")]
    imported = [IMPORT.fullmatch(x) for x in lines_of(text, account, "imports")]
    assert None not in exported + imported
    return [m.groups() for m in exported if m], [m.groups() for m in imported if m]


@pytest.mark.parametrize("rel", nats_config.RENDERED_FILES)
def test_the_rendered_config_exports_and_imports_exactly_the_tenant_services(rel: str) -> None:
    text = (REPO / rel).read_text()
    assert text.count("exports = [") == text.count("imports = [") == 3
    threshold = f", response_threshold: {RESPONSE_THRESHOLD}"
    exported, taken = crossings(text, SEEDANCE_ACCOUNT)
    back, imported = crossings(text, TENANTS_ACCOUNT)
    to_tenants = [(k, s, t) for k, s, i, t in exported if TENANTS_ACCOUNT in i.split(", ")]
    wanted = [("service", s) for s in tenant_services()] + [("stream", DELIVERIES)]
    assert [(k, s) for k, s, _ in to_tenants] == wanted
    assert imported == [(k, SEEDANCE_ACCOUNT, s) for k, s in wanted]
    # every service answers within the threshold, or its entry goes; a stream has none
    assert [t for _, _, t in to_tenants] == [threshold] * len(tenant_services()) + [""]
    fc = list(tenant_flow_control())
    assert back == [("stream", s, SEEDANCE_ACCOUNT, "") for s in fc]
    assert [s for _, a, s in taken if a == TENANTS_ACCOUNT] == fc
    assert DELIVERIES == "_DELIVER.>"


@pytest.mark.parametrize("rel", nats_config.RENDERED_FILES)
def test_the_rendered_config_exports_and_imports_exactly_the_node_services(rel: str) -> None:
    """``SEEDANCE`` exports to ``NODES`` exactly what node-side users publish (services, a
    pull's answers as a stream of responses) and the MIG plans they subscribe to (a stream)."""
    text = (REPO / rel).read_text()
    exported, taken = crossings(text, SEEDANCE_ACCOUNT)
    back, imported = crossings(text, NODES_ACCOUNT)
    once = f", response_threshold: {RESPONSE_THRESHOLD}"
    pull = f", response_type: stream, response_threshold: {PULL_RESPONSE_THRESHOLD}"
    to_nodes = [(k, s, t) for k, s, i, t in exported if NODES_ACCOUNT in i.split(", ")]
    wanted = (
        [("service", s, once) for s in node_services()]
        + [("service", s, pull) for s in node_pulls()]
        + [("stream", s, "") for s in node_streams()]
    )
    assert sorted(to_nodes) == sorted(wanted)
    assert sorted(imported) == sorted((k, SEEDANCE_ACCOUNT, s) for k, s, _ in wanted)
    assert node_flow_control() == ()  # no node-side push consumer
    assert back == []
    assert [s for _, a, s in taken if a == NODES_ACCOUNT] == []
    # each subject is exported once (a second export of it would replace the first)
    assert len({s for _, s, _, _ in exported}) == len(exported)


def node_side_users() -> list[User]:
    return [
        *(shared_node_user(a) for a in NODE_AGENTS),
        node_user("n1"),
        node_user("gpu-node-7:example:com"),
        telemetry_replayer_user(["n1", "n2"]),
        fleet_replayer_user(),
    ]


@pytest.mark.parametrize("user", node_side_users(), ids=lambda u: u.name)
def test_every_subject_a_node_side_user_may_publish_on_is_exported_to_the_nodes(
    user: User,
) -> None:
    services = node_services() + node_pulls() + node_flow_control()
    allowed = user.permissions.publish_allow
    assert [s for s in allowed if not any(covers(e, s) for e in services)] == []
    subscribed = [s for s in user.permissions.subscribe_allow if s != "_INBOX.>"]
    assert [s for s in subscribed if not any(covers(e, s) for e in node_streams())] == []


def test_nothing_is_exported_to_the_nodes_that_no_node_side_user_may_publish() -> None:
    """Node tokens made ``*`` in ``anynode``'s permissions (``n1`` is the same user shape); no
    export names a node, and no export another one covers (it would cross twice)."""
    allowed = [s for u in node_side_users() for s in u.permissions.publish_allow]
    exported = node_services() + node_pulls()
    assert [e for e in exported if not any(covers(e, s) for s in allowed)] == []
    assert not any(t in ("n1", "anynode") for e in exported for t in e.split("."))
    assert [(a, b) for a in exported for b in exported if a != b and covers(a, b)] == []
    # No node-side user core-subscribes to anything but its inbox (the node agent reads its MIG
    # plans through its own reader on their stream): nothing crosses as a stream.
    assert node_streams() == ()


def test_pulls_are_a_stream_of_answers_that_outlive_the_longest_pull() -> None:
    """A pull is answered by a batch of messages, then its expiry: as a single-answer service
    the first message closed the reply mapping and the rest were dropped; a threshold shorter
    than the pull's ``expires`` dropped a batch delivered late."""
    assert node_pulls()
    assert all(s.startswith("$JS.API.CONSUMER.MSG.NEXT.") for s in node_pulls())
    assert not any("MSG.NEXT" in s for s in node_services())
    acks = [s for s in node_services() if s.startswith("$JS.ACK.")]
    assert acks == ["$JS.ACK.SEEDANCE_NODE_DECISIONS.collector-placements.>"]  # ack_sync answered
    reader = inspect.signature(PullReader).parameters["expires_s"].default
    fetch = inspect.signature(PullConsumer).parameters["fetch_timeout_s"].default
    assert seconds(PULL_RESPONSE_THRESHOLD) > max(reader, fetch) + 1.0


def seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    assert duration[:-1].isdigit(), duration
    return float(duration[:-1])


def test_listed_tenants_are_users_of_the_tenants_account_only() -> None:
    text = (REPO / nats_config.RENDERED_FILES[0]).read_text()
    user = re.compile(r'\s+user: "([^"]+)"')
    in_tenants = [
        m[1] for line in block(text, f"  {TENANTS_ACCOUNT} {{", "  ") if (m := user.fullmatch(line))
    ]
    in_seedance = [
        m[1]
        for line in block(text, f"  {SEEDANCE_ACCOUNT} {{", "  ")
        if (m := user.fullmatch(line))
    ]
    listed = [u.name for u in auth_choices().users() if u.name.startswith("tenant-")]
    assert listed
    assert in_tenants == listed
    assert not any(u.startswith("tenant-") for u in in_seedance)


def test_node_side_users_are_users_of_the_nodes_account_only() -> None:
    text = (REPO / nats_config.RENDERED_FILES[0]).read_text()
    user = re.compile(r'\s+user: "([^"]+)"')
    by_account = {
        a: [m[1] for line in block(text, f"  {a} {{", "  ") if (m := user.fullmatch(line))]
        for a in ACCOUNTS
    }
    node_side = [
        u.name
        for u in auth_choices().users()
        if u.name in (*NODE_AGENTS, TELEMETRY_REPLAYER, FLEET_REPLAYER)
        or u.name.startswith(NODE_USER_PREFIX)
    ]
    assert set(node_side) >= {*NODE_AGENTS, TELEMETRY_REPLAYER}
    assert by_account[NODES_ACCOUNT] == node_side
    # the fleet's replaying collector, where a server adds it (the demo's, benches', tests')
    replaying = block(with_fleet_replayer(text), f"  {NODES_ACCOUNT} {{", "  ")
    assert f'        user: "{FLEET_REPLAYER}"' in replaying
    assert not set(node_side) & {*by_account[SEEDANCE_ACCOUNT], *by_account[TENANTS_ACCOUNT]}
    # and those the auth callout admits
    assert account_of(node_key("gpu-node-7.example.com")) == NODES_ACCOUNT
    assert account_of("acme") == TENANTS_ACCOUNT
