"""A node agent of this release on the previous release's NATS config: its plans' reader is
refused at once, with what to do.

The previous config lacks the node-side grants of the plans' reader (the shared ``node-agent``
user's permissions, and the ``NODES`` account's imports of the consumer API on
``SEEDANCE_NODE_PLANS``). Before, the agent's start failed on the reader's first request, the
delete of an old one: the shared user's after a 5 s timeout (the permission violation comes
by the error callback, the request gets no answer), a node's own user with
``ServiceUnavailableError ... description='None'`` (no one in its account answers the
request). Both now raise ``ConsumerRefused`` naming the consumer and the request, and saying
to roll out the NATS config first (docs/deploy.md, "Upgrade order").
"""

from __future__ import annotations

from collections.abc import Iterator

import nkeys
import pytest

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry, new_issuer
from seedance.core.errors import ConsumerRefused
from seedance.core.xkeys import CurveKeyPair, new_curve_keys
from seedance.events.node_permissions import node_plan_reader
from seedance.events.permissions import CALLOUT_USER
from seedance.testing.identities import as_user
from seedance.testing.servers import SHIPPED_AUTH, NatsServer, auth_server
from tests.integration.conftest import shipped_password

pytestmark = pytest.mark.integration

NODE = "gpu-upgrade-1"


def previous_config() -> str:
    """The shipped config without the plans' reader's node-side grants, as the release before
    this one shipped it."""
    lines = SHIPPED_AUTH.read_text().splitlines()
    kept = [ln for ln in lines if not ("CONSUMER" in ln and "SEEDANCE_NODE_PLANS" in ln)]
    assert len(kept) < len(lines)
    return "\n".join(kept) + "\n"


@pytest.fixture(scope="module")
def keys() -> tuple[nkeys.KeyPair, CurveKeyPair]:
    return new_issuer(), new_curve_keys()


@pytest.fixture(scope="module")
def server(keys: tuple[nkeys.KeyPair, CurveKeyPair]) -> Iterator[NatsServer]:
    issuer, xkey = keys
    with auth_server(previous_config(), shipped_password, issuer=issuer, xkey=xkey) as s:
        yield s


@pytest.mark.parametrize("user", ["node-agent", f"node-{NODE}"])
async def test_the_plans_reader_on_the_previous_config_is_refused_with_the_roll_out_order(
    server: NatsServer, keys: tuple[nkeys.KeyPair, CurveKeyPair], user: str
) -> None:
    issuer, xkey = keys
    admin = await Bus.connect(as_user(server.url, "admin"))
    callout = await Bus.connect(as_user(server.url, CALLOUT_USER))
    try:
        node_password = await (await TenantRegistry.open(admin)).add_node(NODE)
        settings = (
            as_user(server.url, user)
            if user == "node-agent"
            else BusSettings(url=server.url, user=user, password=node_password)
        )
        async with AuthCallout(callout, issuer, xkey=xkey, refusal_delay_s=0.0):
            agent = await Bus.connect(settings)
            try:
                with pytest.raises(ConsumerRefused) as refused:
                    await agent.ensure_consumer(node_plan_reader(NODE))
            finally:
                await agent.close()
    finally:
        await callout.close()
        await admin.close()
    text = str(refused.value)
    assert f"consumer node-agent-plans-{NODE} of stream SEEDANCE_NODE_PLANS" in text
    assert "roll it out before the services" in text
