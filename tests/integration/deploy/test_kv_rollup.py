"""A writer confined to its own keys cannot purge a shared KV bucket (review-grants F1), under
the shipped users (deploy/auth) on a real nats-server.

The server honours ``Nats-Rollup: all`` on a data publish to any subject the publisher may
write, and purges the whole stream: with nats-py's buckets (rollups on) the slicer, granted only
``$KV.seedance-leases.slicer.*``, wiped the router's planner lease, and with its
``usage.*`` keys the bridge's quota and slicing policy. The catalogue's buckets have rollups
off; a bucket made before (an older release) is reported loudly and converged by provision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from nats.js import api as js_api
from nats.js.errors import APIError
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings
from seedance.core.kv import ensure_bucket, provision
from seedance.events.subjects import BUCKETS
from seedance.testing.servers import shipped_auth_server
from tests.integration.conftest import shipped_password

ROLLUP_ALL = {"Nats-Rollup": "all"}


async def _connect(url: str, user: str) -> Bus:
    return await Bus.connect(
        BusSettings(url=url, user=user, password=shipped_password(user), name=user)
    )


@pytest_asyncio.fixture
async def slicer(auth_url: str) -> AsyncIterator[Bus]:
    bus = await _connect(auth_url, "slicer")
    try:
        yield bus
    finally:
        await bus.close()


async def test_a_rollup_to_a_writer_s_own_key_is_refused_and_the_others_keys_stay(
    admin: Bus, slicer: Bus, unique: str
) -> None:
    """review-grants q1_rollup as a test: the slicer's ``Nats-Rollup: all`` to its own lease
    and usage keys is refused; the router's planner lease and the bridge's policy stay."""
    leases = await ensure_bucket(admin, "seedance-leases")
    policy = await ensure_bucket(admin, "seedance-policy")
    await leases.put(f"router-plan.f{unique}", b"router-holds-it")
    await policy.put("quota", b"bridge-policy")
    own = await ensure_bucket(slicer, "seedance-leases")
    await own.put(f"slicer.p{unique}", b"slicer-0")  # its own key: a plain write is granted
    for subject in (
        f"$KV.seedance-leases.slicer.p{unique}",
        f"$KV.seedance-policy.usage.u{unique}",
    ):
        with pytest.raises(APIError, match=r"(?i)rollup"):
            await slicer.js.publish(subject, b"", headers=ROLLUP_ALL)
    assert (await leases.get(f"router-plan.f{unique}")).value == b"router-holds-it"
    assert (await policy.get("quota")).value == b"bridge-policy"
    assert (await leases.get(f"slicer.p{unique}")).value == b"slicer-0"


@pytest.fixture
def own_url() -> Iterator[str]:
    """A server of its own: the test re-makes a catalogue bucket as an older release did."""
    with shipped_auth_server(shipped_password) as server:
        yield server.url


async def test_provision_turns_rollups_off_on_a_bucket_made_with_them(own_url: str) -> None:
    """The leases bucket as releases before this one made it (nats-py's ``create_key_value``,
    rollups on): a service binding it logs the drift at error level naming the exposure and
    starts; provision turns rollups off and keeps the keys; then the slicer's rollup is
    refused and nothing is reported."""
    admin = await _connect(own_url, "admin")
    slicer = await _connect(own_url, "slicer")
    try:
        spec = BUCKETS["seedance-leases"]
        await admin.js.delete_stream(f"KV_{spec.name}")
        old = await admin.js.create_key_value(
            js_api.KeyValueConfig(
                bucket=spec.name,
                history=spec.history,
                ttl=spec.ttl_s or None,
                description=spec.description or None,
                replicas=1,
                direct=spec.direct or None,
            )
        )
        await old.put("router-plan.fleet-a", b"router-holds-it")
        with capture_logs() as logs:
            await ensure_bucket(slicer, spec.name)
        (line,) = [e for e in logs if e["event"] == "stream_config_drift"]
        assert (line["log_level"], line["fields"]) == ("error", ["allow_rollup_hdrs"])
        assert [x for x in line["exposed"] if x.startswith("allow_rollup_hdrs")], line

        assert [str(c) for c in await provision(admin)] == [
            f"updated: stream KV_{spec.name} (allow_rollup_hdrs)"
        ]
        assert not (await admin.js.stream_info(f"KV_{spec.name}")).config.allow_rollup_hdrs
        assert await provision(admin) == []
        with pytest.raises(APIError, match=r"(?i)rollup"):
            await slicer.js.publish(f"$KV.{spec.name}.slicer.p1", b"", headers=ROLLUP_ALL)
        assert (await old.get("router-plan.fleet-a")).value == b"router-holds-it"
        with capture_logs() as logs:
            await ensure_bucket(slicer, spec.name)
        assert [e for e in logs if e["event"] == "stream_config_drift"] == []
    finally:
        await slicer.close()
        await admin.close()
