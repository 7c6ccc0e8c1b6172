"""What crosses from Seedance's account to the tenants' (``seedance.events.accounts``), checked
against the tenants' permissions and the rendered config.

A tenant is a user of ``TENANTS``; a subject it may publish on reaches Seedance's services and
JetStream only through a service ``SEEDANCE`` exports and ``TENANTS`` imports. A permission
with no export behind it is a verb the tenant is granted and cannot use (its request lands in
``TENANTS``, where nobody answers); an export with no permission behind it is a door no tenant
was meant to have. The server-side proof is tests/integration/deploy/test_tenant_account.py.
"""

from __future__ import annotations

import re

import pytest

from seedance.events import nats_config
from seedance.events.accounts import (
    DELIVERIES,
    RESPONSE_THRESHOLD,
    SEEDANCE_ACCOUNT,
    TENANTS_ACCOUNT,
    tenant_flow_control,
    tenant_services,
)
from seedance.events.permissions import tenant_permissions
from tests.unit.deploy.declared import REPO, auth_choices

#: A short id, one with the tokens' own words in it, and the longest id there may be (63).
TENANTS = ["acme", "seedance-jobs-costs", "t" + "-0123456789" * 5 + "-abcdez"]


def covers(pattern: str, subject: str) -> bool:
    """Whether NATS pattern ``pattern`` matches every subject ``subject`` matches (``subject``
    may hold wildcards too: ``*`` is covered only by ``*`` or ``>``, ``>`` only by ``>``)."""
    have, want = pattern.split("."), subject.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return len(want) > i  # one or more tokens
        if i >= len(want) or want[i] == ">":
            return False
        if token != "*" and token != want[i]:
            return False
    return len(have) == len(want)


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


@pytest.mark.parametrize("rel", nats_config.RENDERED_FILES)
def test_the_rendered_config_exports_and_imports_exactly_the_tenant_services(rel: str) -> None:
    text = (REPO / rel).read_text()
    assert text.count("exports = [") == text.count("imports = [") == 2
    threshold = f", response_threshold: {RESPONSE_THRESHOLD}"
    to_tenants = rf'      \{{(service|stream): "([^"]+)", accounts: \[{TENANTS_ACCOUNT}\](.*)\}}'
    from_seedance = (
        rf'      \{{(service|stream): \{{account: {SEEDANCE_ACCOUNT}, subject: "([^"]+)"\}}\}}'
    )
    to_seedance = rf'      \{{stream: "([^"]+)", accounts: \[{SEEDANCE_ACCOUNT}\]\}}'
    from_tenants = rf'      \{{stream: \{{account: {TENANTS_ACCOUNT}, subject: "([^"]+)"\}}\}}'
    exported = [re.fullmatch(to_tenants, x) for x in lines_of(text, SEEDANCE_ACCOUNT, "exports")]
    imported = [re.fullmatch(from_seedance, x) for x in lines_of(text, TENANTS_ACCOUNT, "imports")]
    back = [re.fullmatch(to_seedance, x) for x in lines_of(text, TENANTS_ACCOUNT, "exports")]
    taken = [re.fullmatch(from_tenants, x) for x in lines_of(text, SEEDANCE_ACCOUNT, "imports")]
    # every line is one of these forms
    assert None not in exported + imported + back + taken
    wanted = [("service", s) for s in tenant_services()] + [("stream", DELIVERIES)]
    assert [m.groups()[:2] for m in exported if m] == wanted
    assert [m.groups() for m in imported if m] == wanted
    # every service answers within the threshold, or its entry goes; a stream has none
    assert [m[3] for m in exported if m] == [threshold] * len(tenant_services()) + [""]
    assert [m[1] for m in back if m] == list(tenant_flow_control())
    assert [m[1] for m in taken if m] == list(tenant_flow_control())
    assert DELIVERIES == "_DELIVER.>"


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
