"""The auth callout's requests cross the bus sealed (``auth_callout { xkey }``), on a real
nats-server running the shipped config.

A review showed that whoever may update a stream's config (the provisioner, any operator tool)
can add ``$SYS.REQ.USER.AUTH`` to a stream's subjects and read every login request, each with
its password in clear. Now the server seals each request to the callout's curve key and the
callout seals its answer to the server's: the same capture holds no password, and a tenant
still logs in (the pinned server opened the callout's sealed answer: interop).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import nkeys
import pytest
import pytest_asyncio

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry
from seedance.core.xkeys import CurveKeyPair
from seedance.events.permissions import CALLOUT_SUBJECT, CALLOUT_USER, tenant_user_name
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

#: A catalogue stream the capture is added to, as the review did.
CAPTURING = "SEEDANCE_DLQ"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def admin(server: NatsServer) -> AsyncIterator[Bus]:
    bus = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    try:
        yield bus
    finally:
        await bus.close()


async def login(url: str, tenant: str, password: str) -> str | None:
    """None when the server lets ``tenant`` in, else the server's error."""
    nc = nats.NATS()
    try:
        await nc.connect(
            url, user=tenant_user_name(tenant), password=password, connect_timeout=5,
            allow_reconnect=False, max_reconnect_attempts=0,
        )  # fmt: skip
    except (nats.errors.Error, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        # nats-py leaves a refused connection's socket open: closing the client closes it
        # here, not the garbage collector in whichever test runs next (a ResourceWarning,
        # an error under filterwarnings=error, charged to that test).
        await nc.close()
    return None


def holds_in_clear(data: bytes, secret: str) -> bool:
    """Whether ``secret`` is in ``data`` as it is or in any base64url segment of it (a JWT)."""
    if secret.encode() in data:
        return True
    for part in data.split(b"."):
        try:
            if secret.encode() in base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4)):
                return True
        except ValueError:
            continue
    return False


async def test_a_stream_capturing_the_callout_subject_holds_no_password(
    server: NatsServer, admin: Bus, issuer: nkeys.KeyPair, xkey: CurveKeyPair
) -> None:
    password = await (await TenantRegistry.open(admin)).add("newco")
    info = await admin.js.stream_info(CAPTURING)
    spying = dataclasses.replace(
        info.config, subjects=[*(info.config.subjects or []), CALLOUT_SUBJECT], no_ack=True
    )
    await admin.js.update_stream(spying)
    captured: list[Any] = []

    async def stored() -> bool:
        try:
            captured.append(await admin.js.get_last_msg(CAPTURING, CALLOUT_SUBJECT))
        except nats.js.errors.NotFoundError:
            return False
        return True

    try:
        own = await Bus.connect(
            BusSettings(url=server.url, user=CALLOUT_USER, password=shipped_password(CALLOUT_USER))
        )
        try:
            async with AuthCallout(own, issuer, xkey=xkey, refusal_delay_s=0.0):
                # granted: the pinned server opened the callout's sealed answer
                assert await login(server.url, "newco", password) is None
                assert await login(server.url, "newco", password + "x") is not None
        finally:
            await own.close()
        await eventually(stored, 10, what="the capturing stream stored a login request")
    finally:
        await admin.js.update_stream(info.config)
    msg = captured[-1]
    assert not holds_in_clear(msg.data, password)
    assert not holds_in_clear(msg.data, tenant_user_name("newco"))
    assert msg.data.startswith(b"xkv1")  # the nkeys sealed-box format, to the callout's key
    server_xkey = (msg.headers or {}).get("Nats-Server-Xkey", "")
    assert server_xkey.startswith("X")
    # only the callout's key opens it, and inside is the server's signed request
    assert holds_in_clear(xkey.open(msg.data, server_xkey), password)


async def test_a_callout_without_the_xkey_cannot_answer_a_server_that_seals(
    server: NatsServer, admin: Bus, issuer: nkeys.KeyPair
) -> None:
    """The shipped config seals every request: a callout run without the curve seed (the old
    deployment) reads none of them, and no login passes through it."""
    password = await (await TenantRegistry.open(admin)).add("oldway")
    own = await Bus.connect(
        BusSettings(url=server.url, user=CALLOUT_USER, password=shipped_password(CALLOUT_USER))
    )
    try:
        async with AuthCallout(own, issuer, refusal_delay_s=0.0):
            error = await login(server.url, "oldway", password)
    finally:
        await own.close()
    assert error is not None
