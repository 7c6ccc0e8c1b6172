"""A reader's consumer where no one answers its JetStream requests (503 without a code, or no
responders): not a refusal, unless the stream's info is answered and the delete of the old
consumer is not (the account's imports lack the request: a NATS config older than the release,
tests/integration/deploy/test_plans_upgrade.py, which stays ``ConsumerRefused``).

Here the bus asks a JetStream no server serves (an API prefix no one answers), as a restarted
server's JetStream before it is up: every request goes unanswered, the stream's info too. The
error is raised as it is, for the caller to retry (the node agent's plans reader, the ledger's
replicas: their rebinds retry it). Before, it was ``ConsumerRefused``, which ends the agent at
once and which their rebinds do not retry."""

from __future__ import annotations

import nats
import nats.errors
import nats.js.errors
import pytest

from seedance.core import Bus, BusSettings
from seedance.core.errors import ConsumerRefused
from seedance.events.node_permissions import node_plan_reader

pytestmark = pytest.mark.integration


async def test_a_delete_no_one_answers_with_the_stream_info_unanswered_too_is_transient(
    nats_url: str,
) -> None:
    bus = await Bus.connect(BusSettings(url=nats_url, name="unanswered"))
    try:
        bus.js = bus.nc.jetstream(prefix="$JS.UNSERVED.API")
        with pytest.raises(
            (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError, ConsumerRefused)
        ) as raised:
            await bus.ensure_consumer(node_plan_reader("gpu-unanswered-1"))
    finally:
        await bus.close()
    assert not isinstance(raised.value, ConsumerRefused), str(raised.value)
