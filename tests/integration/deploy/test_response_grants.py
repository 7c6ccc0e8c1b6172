"""What bounds a response of the shipped ``cost-ledger`` user (``allow_responses``).

The ledger answers allocation requests on each request's own reply subject, which its publish
allow list cannot name (a tenant's inbox is ``_INBOX_<t>``). nats-server lets a user with
``allow_responses`` publish once on the reply subject of any request it received, and (pinned
2.15.1, measured here) its publish *deny* list does not bound that response: the server checks
allow, then deny, and only where the publish is refused looks up the reply it may send. So no
permission can stop the ledger answering wherever a request's reply points; the ledger itself
answers only where ``api.reply_allowed`` says (docs/security.md). If this test fails, the server
has started to apply deny to responses: add the deny rules then.

A tenant's request crosses from the tenants' account (``seedance.events.accounts``): the server
rewrites its reply (``_R_.…``) and carries the answer back there, so a tenant's forged reply
no longer points the ledger's answer at a subject of Seedance's; an asker in Seedance's own
account (an operator, a service) still can.
"""

from __future__ import annotations

from seedance.core import Bus
from seedance.core.barrier import flushed
from seedance.events.accounts import IMPORTED_REPLY_PREFIX
from seedance.events.permissions import service_user
from seedance.events.subjects import api, inbox_prefix
from seedance.testing.waits import eventually
from tests.integration.deploy.refusals import connect_shipped

#: In the ledger user's publish deny list: the slicer's budget-pause reader.
DENIED = "$JS.API.CONSUMER.INFO.SEEDANCE_COSTS.slicer-pauses"


async def test_the_ledger_s_publish_deny_does_not_bound_its_responses(
    auth_url: str, admin: Bus
) -> None:
    assert DENIED in service_user("cost-ledger").permissions.publish_deny
    ledger = await connect_shipped(auth_url, "cost-ledger")
    acme = await connect_shipped(auth_url, "tenant-acme", inbox_prefix=inbox_prefix("acme"))
    asked: dict[bytes, str] = {}  # each request's body: the reply it reached the ledger with
    answered: list[bytes] = []
    try:
        assert await ledger.refused(DENIED)  # a plain publish there is refused by name

        async def answer(msg: object) -> None:
            asked[msg.data] = msg.reply  # type: ignore[attr-defined]
            await msg.respond(b"an answer to " + msg.data)  # type: ignore[attr-defined]
            answered.append(msg.data)  # type: ignore[attr-defined]

        await ledger.nc.subscribe(api.allocation("acme"), cb=answer)
        await flushed(ledger.nc)
        seen = await admin.nc.subscribe(DENIED)
        await flushed(admin.nc)
        # The same request, its reply forged onto DENIED, by a tenant and by an operator.
        await acme.nc.publish(api.allocation("acme"), b"the tenant", reply=DENIED)
        await admin.nc.publish(api.allocation("acme"), b"an operator", reply=DENIED)
        await eventually(lambda: len(answered) == 2, 10, what="both requests answered")
        # The tenant's crossed from the tenants' account: the server rewrote its reply.
        assert asked[b"the tenant"].startswith(IMPORTED_REPLY_PREFIX), asked
        assert asked[b"an operator"] == DENIED
        # Both answers are published once the ledger's flush returns, and whatever of them
        # reached the operator's subscription is queued there once the operator's does.
        await flushed(ledger.nc)
        await flushed(admin.nc)
        got = await seen.next_msg(timeout=10)
        left = seen.pending_msgs
    finally:
        await ledger.nc.close()
        await acme.nc.close()
    # The operator's answer landed on DENIED, the ledger's deny list notwithstanding; the
    # tenant's went back to the tenants' account, not onto DENIED.
    assert got.data == b"an answer to an operator"
    assert left == 0
    assert not acme.errors, acme.errors  # the tenant's request was its own to send
