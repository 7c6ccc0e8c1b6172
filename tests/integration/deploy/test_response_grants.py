"""What bounds a response of the shipped ``cost-ledger`` user (``allow_responses``).

The ledger answers allocation requests on each request's own reply subject, which its publish
allow list cannot name (a tenant's inbox is ``_INBOX_<t>``). nats-server lets a user with
``allow_responses`` publish once on the reply subject of any request it received, and (pinned
2.15.1, measured here) its publish *deny* list does not bound that response: the server checks
allow, then deny, and only where the publish is refused looks up the reply it may send. So no
permission can stop the ledger answering wherever a request's reply points; the ledger itself
answers only under the asker's own inbox (``api.reply_prefix``, docs/security.md). If this
test fails, the server has started to apply deny to responses: add the deny rules then.
"""

from __future__ import annotations

from seedance.core import Bus
from seedance.events.permissions import service_user
from seedance.events.subjects import api, inbox_prefix
from tests.integration.deploy.refusals import connect_shipped

#: In the ledger user's publish deny list: the slicer's budget-pause reader.
DENIED = "$JS.API.CONSUMER.INFO.SEEDANCE_COSTS.slicer-pauses"


async def test_the_ledger_s_publish_deny_does_not_bound_its_responses(
    auth_url: str, admin: Bus
) -> None:
    assert DENIED in service_user("cost-ledger").permissions.publish_deny
    ledger = await connect_shipped(auth_url, "cost-ledger")
    acme = await connect_shipped(auth_url, "tenant-acme", inbox_prefix=inbox_prefix("acme"))
    try:
        assert await ledger.refused(DENIED)  # a plain publish there is refused by name

        async def answer(msg: object) -> None:
            await msg.respond(b"a response")  # type: ignore[attr-defined]

        await ledger.nc.subscribe(api.allocation("acme"), cb=answer)
        await ledger.nc.flush()
        seen = await admin.nc.subscribe(DENIED)
        await admin.nc.flush()
        await acme.nc.publish(api.allocation("acme"), b"{}", reply=DENIED)
        got = await seen.next_msg(timeout=10)
    finally:
        await ledger.nc.close()
        await acme.nc.close()
    assert got.data == b"a response"
