"""The auth callout under login floods, on a real nats-server running the shipped config.

The server runs deploy/auth/nats-auth.conf (auth callout on); the callout runs in-process as
its shipped ``auth-callout`` user with the issuer the server trusts; tenants are registered at
run time by the shipped ``admin``. The floods are the bench's (`seedance.bench.callout_flood`):
raw-protocol logins from the same address as the legitimate client. What is asserted is never
a duration: a legitimate login succeeds (the server gives the callout its auth timeout, 2 s),
and the callout's own counters say which attempts cost a scrypt hash.

Before the login gate, 100 concurrent wrong passwords for a tenant's user made that tenant's
own login fail (each attempt one hash, answered one after another); a password of 100,000
characters was registered and could never log in (nats-server refuses a CONNECT line over
4 KiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import nkeys
import pytest
import pytest_asyncio
from nats.js.errors import KeyNotFoundError

from seedance.bench.callout_flood import FloodCounts, flood, timed_logins
from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import (
    PASSWORD_RULE,
    AuthCallout,
    PasswordRefused,
    TenantRegistry,
)
from seedance.core.xkeys import CurveKeyPair
from seedance.events.permissions import CALLOUT_USER, tenant_user_name
from seedance.events.tokens import InvalidToken
from seedance.testing.servers import SHIPPED_AUTH, NatsServer, auth_server
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.slow,
]

ATTACKERS = 100


class Callout:
    def __init__(self, service: AuthCallout, registry: TenantRegistry, url: str) -> None:
        self.service = service
        self.registry = registry
        self.url = url

    def count(self, result: str, reason: str) -> float:
        return self.service.metrics.answers_total.labels(result, reason)._value.get()

    @property
    def hashes(self) -> float:
        return self.service.metrics.hashes_total._value.get()


@pytest_asyncio.fixture(loop_scope="module")
async def callout(
    server: NatsServer, issuer: nkeys.KeyPair, xkey: CurveKeyPair
) -> AsyncIterator[Callout]:
    """A fresh callout (its own caches and counters) for each test."""
    own = await Bus.connect(
        BusSettings(url=server.url, user=CALLOUT_USER, password=shipped_password(CALLOUT_USER))
    )
    admin = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    try:
        async with AuthCallout(own, issuer, xkey=xkey) as service:
            yield Callout(service, await TenantRegistry.open(admin), server.url)
    finally:
        await admin.close()
        await own.close()


@contextlib.asynccontextmanager
async def flooding(url: str, kind: str, victim_user: str) -> AsyncIterator[list[FloodCounts]]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        flood(url, kind, victim_user=victim_user, concurrency=ATTACKERS, stop=stop)
    )
    done: list[FloodCounts] = []
    try:
        yield done
    finally:
        stop.set()
        done.append(await task)


async def logins(url: str, tenant: str, password: str, count: int) -> Any:
    return await timed_logins(url, tenant_user_name(tenant), password, count=count)


async def logins_as(url: str, user: str, password: str) -> Any:
    return await timed_logins(url, user, password, count=1)


async def test_wrong_passwords_flooding_a_tenants_own_user_leave_its_login_working(
    callout: Callout,
) -> None:
    password = await callout.registry.add("victim")
    assert (await logins(callout.url, "victim", password, 1)).failed == 0  # it had logged in
    assert callout.hashes == 1
    async with flooding(callout.url, "wrong-passwords", "tenant-victim") as counts:
        # not the password its record accepted: refused without a hash (and no backoff)
        await eventually(lambda: callout.count("refused", "not_the_known") >= 3 * ATTACKERS, 120)
        during = await logins(callout.url, "victim", password, 5)
    assert (during.failed, during.errors) == (0, [])
    assert callout.count("granted", "known") == 5
    refused = callout.count("refused", "not_the_known")
    assert counts[0].attempts >= refused >= 3 * ATTACKERS  # answers of the last wave pending
    assert callout.count("refused", "backoff") == callout.count("refused", "wrong_password") == 0
    assert callout.hashes == 1  # its own first login; none for the flood (before: 5 + probes)


async def test_random_users_flooding_cost_no_hash_and_a_new_tenant_still_logs_in(
    callout: Callout,
) -> None:
    password = await callout.registry.add("newcomer")
    async with flooding(callout.url, "random-users", "tenant-newcomer") as counts:
        await eventually(lambda: callout.count("refused", "not_registered") >= ATTACKERS, 120)
        first = await logins(callout.url, "newcomer", password, 1)  # never logged in before
        again = await logins(callout.url, "newcomer", password, 3)
    assert (first.failed, again.failed, first.errors) == (0, 0, [])
    assert callout.hashes == 1  # the newcomer's first login; none for the flood
    assert callout.count("granted", "hashed") == 1
    assert callout.count("granted", "known") == 3
    assert counts[0].attempts >= callout.count("refused", "not_registered") >= ATTACKERS


async def test_a_wrong_password_checked_once_is_refused_without_a_hash_again(
    callout: Callout,
) -> None:
    await callout.registry.add("typo")
    for _ in range(3):
        wrong = await logins(callout.url, "typo", "the-same-wrong-password", 1)
        assert wrong.failed == 1
        assert "Authorization Violation" in wrong.errors[0]
    assert callout.hashes == 1
    assert callout.count("refused", "known_wrong") == 2


async def test_a_password_too_long_to_ever_log_in_is_refused_at_registration(
    callout: Callout,
) -> None:
    # Why: the server refuses a CONNECT line over its max_control_line before any callout.
    overlong = await logins(callout.url, "nobody", "x" * 100_000, 1)
    assert overlong.failed == 1
    with pytest.raises(PasswordRefused, match="100000 characters") as err:
        await callout.registry.add("overlong", "x" * 100_000)
    assert PASSWORD_RULE in str(err.value)
    assert await callout.registry.get("overlong") is None  # nothing written
    # the longest the rule allows (256 characters, 2 bytes each in UTF-8) logs in
    longest = "é" * 256
    await callout.registry.add("longest", longest)
    ok = await logins(callout.url, "longest", longest, 1)
    assert (ok.failed, ok.errors) == (0, [])


async def test_a_tenant_id_with_a_trailing_newline_is_refused_naming_it(
    callout: Callout,
) -> None:
    # check_tenant once accepted "evil\n" (Python's $ matches before a final newline): the
    # registry got as far as the NATS client, which failed with "invalid subject".
    with pytest.raises(InvalidToken, match=r"tenant 'evil\\n' is not a valid tenant id"):
        await callout.registry.add("evil\n", "a-long-enough-password")
    refused = await logins_as(callout.url, "tenant-evil\n", "a-long-enough-password")
    assert refused.failed == 1
    assert callout.count("refused", "not_tenant") == 1


async def test_a_registry_that_does_not_answer_is_a_busy_refusal_answered_at_once(
    callout: Callout,
) -> None:
    # A flood of connections that never wait saturated the server: the callout's registry
    # reads timed out, escaped its handler, and left the login unanswered (it failed at the
    # server's auth timeout) with a traceback per attempt. Now it is refused as busy.
    password = "a-registered-password-123"
    await callout.registry.add("umbrella", password)
    service = callout.service
    assert service._registry is not None
    real_get = service._registry.get

    async def times_out(tenant: str) -> Any:
        raise TimeoutError("nats: timeout")

    service._registry.get = times_out  # type: ignore[method-assign]
    try:
        times = await logins(callout.url, "umbrella", password, 1)
        assert times.failed == 1
        assert callout.count("refused", "registry_busy") == 1
    finally:
        service._registry.get = real_get  # type: ignore[method-assign]
    assert (await logins(callout.url, "umbrella", password, 1)).failed == 0


async def test_a_registered_tenant_and_an_unregistered_name_need_no_registry_read(
    callout: Callout,
) -> None:
    """The callout's mirror of the registry (seedance.core.tenant_mirror) answers both: a
    login's path has no round trip through the server, and a flood of random user names costs
    the server no JetStream read."""
    mirror = callout.service.mirror
    assert mirror is not None
    assert mirror.complete
    password = await callout.registry.add("regular")
    assert (await logins(callout.url, "regular", password, 1)).failed == 0  # written: one read
    reads = mirror.answered["read"]
    async with flooding(callout.url, "random-users", "tenant-regular") as counts:
        await eventually(lambda: callout.count("refused", "not_registered") >= ATTACKERS, 120)
        again = await logins(callout.url, "regular", password, 3)
    assert (again.failed, again.errors) == (0, [])
    assert mirror.answered["read"] == reads
    # the probe that proved the subscription (refused by the stream) was never stored
    with pytest.raises(KeyNotFoundError):
        await callout.registry._kv.get(mirror._probe)
    refused = callout.count("refused", "not_registered")
    assert counts[0].attempts >= refused >= ATTACKERS
    assert mirror.answered["memory"] >= refused + 3  # each flood attempt, each login


async def test_a_removal_or_a_new_password_counts_for_the_very_next_login(
    callout: Callout,
) -> None:
    """The bucket's writes reach the callout on its own connection before any login started
    after the write returned (core subscription, one connection, in order): no window where a
    removed tenant or a replaced password still logs in from the mirror, and none where a
    tenant just added is refused. Repeated: the order holds every time, not by luck."""
    for i in range(10):
        first = await callout.registry.add("rotating")
        assert (await logins(callout.url, "rotating", first, 1)).failed == 0, i
        second = await callout.registry.add("rotating")  # a new password
        assert (await logins(callout.url, "rotating", first, 1)).failed == 1, i
        assert (await logins(callout.url, "rotating", second, 1)).failed == 0, i
        await callout.registry.remove("rotating")
        gone = await logins(callout.url, "rotating", second, 1)
        assert gone.failed == 1, i
        assert "Authorization Violation" in gone.errors[0]


async def test_under_a_config_rendered_before_the_mirror_every_login_reads_the_registry(
    issuer: nkeys.KeyPair, xkey: CurveKeyPair
) -> None:
    """A server whose config predates the callout's subscription to the bucket's writes
    refuses it: the callout must then read the registry for every login (a mirror that never
    hears of a removal would let a removed tenant in), and say so."""
    # the callout user's subscribe grant, at whatever depth the accounts block nests it
    granted = re.compile(r'("\$SYS\.REQ\.USER\.AUTH")\n *"\$KV\.seedance-tenants\.>"')
    text, found = granted.subn(r"\1", SHIPPED_AUTH.read_text())
    assert found == 1
    with auth_server(text, shipped_password, issuer=issuer, xkey=xkey) as server:
        own = await Bus.connect(
            BusSettings(url=server.url, user=CALLOUT_USER, password=shipped_password(CALLOUT_USER))
        )
        try:
            admin = await Bus.connect(
                BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
            )
            try:
                async with AuthCallout(own, issuer, xkey=xkey) as service:
                    mirror = service.mirror
                    assert mirror is not None
                    assert not mirror.permitted
                    registry = await TenantRegistry.open(admin)
                    password = await registry.add("legacy")
                    assert (await logins(server.url, "legacy", password, 2)).failed == 0
                    await registry.remove("legacy")
                    assert (await logins(server.url, "legacy", password, 1)).failed == 1
                    assert mirror.answered["memory"] == 0
                    assert mirror.answered["read"] == 3
            finally:
                await admin.close()
        finally:
            await own.close()
