"""Who may touch which reader of the ledger's merged input, as the catalogue declares it.

A consumer name is one subject token, so per-replica readers (``ledger-in-<replica>``,
``node-agent-in-<node>``) are granted as "any consumer of the stream". The node agents' and the
ledger's once shared ``SEEDANCE_LEDGER_IN``: each user could inspect, read and delete the
other's readers and the slicer's ``slicer-autosize``. The node agents now read their own mirror;
the ledger's user is denied the slicer's durable by name; and a render that puts two services'
per-replica readers on one stream fails.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from seedance.events import permissions
from seedance.events.node_permissions import node_permissions
from seedance.events.permissions import FLEET_REPLAYER, PermissionsError
from seedance.events.subjects import CONSUMERS, STREAMS, ledger, slicing

VERBS = ("CREATE", "DURABLE.CREATE", "INFO", "DELETE", "MSG.NEXT")


def _verbs_on(allow: tuple[str, ...], stream: str) -> list[str]:
    return [a for a in allow if any(f".CONSUMER.{v}.{stream}." in a for v in VERBS)]


def test_the_node_agents_read_the_decisions_from_their_own_mirror() -> None:
    reader = CONSUMERS["node-agent-in"]
    assert reader.stream == ledger.NODE_STREAM
    mirror = next(s for s in STREAMS if s.name == ledger.NODE_STREAM).mirror
    assert mirror is not None
    # the ledger's input brings in nothing of the slicer's but the decisions the agent reads
    assert (mirror.stream, mirror.filter_subject) == (ledger.IN_STREAM, slicing.ALL)
    (origin,) = (s for s in STREAMS if s.name == ledger.IN_STREAM)
    from_slicer = {s.filter_subject for s in origin.sources if s.stream == "SEEDANCE_SLICING"}
    assert from_slicer == set(reader.filter_subjects) == {*slicing.HOLDS, slicing.SHARES}


@pytest.mark.parametrize("user", ["node-agent", "node-n1"])
def test_a_node_agent_has_no_consumer_verb_on_the_ledger_s_input(user: str) -> None:
    if user == "node-agent":
        allow = permissions.service_user(user).permissions.publish_allow
    else:  # a node's own user (issue 27) has its agents' grants
        allow = node_permissions(("n1",)).publish_allow
    assert _verbs_on(allow, ledger.IN_STREAM) == []
    assert _verbs_on(allow, ledger.NODE_STREAM), "it reads its own mirror"


def test_only_the_node_agents_and_the_replaying_collector_read_their_mirror() -> None:
    """The replaying collector reads it by its durable's name alone (so it can touch no node
    agent's reader), and the node agents are denied that name (they cannot touch its)."""
    placements = "collector-placements"
    for name, d in permissions.IDENTITIES.items():
        p = permissions.declaration_permissions(d)
        on_mirror = _verbs_on(p.publish_allow, ledger.NODE_STREAM)
        assert bool(on_mirror) == (name in ("node-agent", FLEET_REPLAYER)), (name, on_mirror)
        if name == FLEET_REPLAYER:
            names = {s.split(f".{ledger.NODE_STREAM}.")[1].split(".")[0] for s in on_mirror}
            assert names == {placements}, on_mirror
        if name == "node-agent":
            for verb in VERBS:
                assert f"$JS.API.CONSUMER.{verb}.{ledger.NODE_STREAM}.{placements}" in (
                    p.publish_deny
                )


def test_the_ledger_is_denied_the_slicer_s_readers_by_name() -> None:
    p = permissions.service_user("cost-ledger").permissions
    assert f"$JS.API.CONSUMER.DELETE.{ledger.IN_STREAM}.*" in p.publish_allow  # its replicas'
    for stream, durable in (
        (ledger.IN_STREAM, "slicer-autosize"),
        ("SEEDANCE_COSTS", "slicer-pauses"),
    ):
        for verb in VERBS:
            assert f"$JS.API.CONSUMER.{verb}.{stream}.{durable}" in p.publish_deny
        assert f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>" in p.publish_deny
    # ... and the slicer holds its reader by name only: no ledger-in-<replica> of the ledger's
    slicer = permissions.service_user("slicer").permissions.publish_allow
    on_input = _verbs_on(slicer, ledger.IN_STREAM)
    assert on_input
    assert all(f"{ledger.IN_STREAM}.slicer-autosize" in a for a in on_input), on_input


def test_two_services_per_replica_readers_on_one_stream_fail_the_render(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the node agents' readers did on the ledger's input: the render refuses it."""
    monkeypatch.setitem(
        CONSUMERS, "node-agent-in", replace(CONSUMERS["node-agent-in"], stream=ledger.IN_STREAM)
    )
    for name in ("cost-ledger", "node-agent"):
        with pytest.raises(PermissionsError, match=f"any consumer of {ledger.IN_STREAM}"):
            permissions.service_user(name)
