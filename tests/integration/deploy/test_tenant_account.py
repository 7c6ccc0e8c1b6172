"""A tenant's forged reply subject, on a real nats-server running the shipped config.

nats-server answers a request at the request's reply subject under no user's permissions: a
JetStream publish ack, a JetStream API answer. While tenants were users of the services'
account, tenant-acme publishing on its own subjects with the reply set to the slicer's lease had
the server store its ack there (review of 2026-12-06: the lease, the slicer's journal, the quota
policy, the tenant registry, other tenants' subjects). Tenants are now users of their own
account (``seedance.events.accounts``): each of their requests crosses a service import, the
server replaces its reply by one of its own (``_R_.…``) and carries the answer back into the
tenants' account only.

Each test sends, as the tenant, every kind of request a tenant may make with its reply forged
onto Seedance's subjects, and the operator's control after it (`forged.assert_lands_nowhere`):
on the old single-account config every forged target below changed as the control does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from seedance.core import Bus
from seedance.events.stores import POLICY_BUCKET, QUOTA_POLICY_KEY
from seedance.events.subjects import graph, inbox_prefix, jobs, models
from tests.integration.deploy.forged import LEASES, assert_lands_nowhere
from tests.integration.deploy.refusals import ShippedUser, connect_shipped

TENANT, OTHER = "acme", "globex"

#: (stream, subject) of what a forged reply aimed at: the slicer's lease, its journal, the quota
#: policy, the tenant registry, another tenant's request subject (its requests' stream, where a
#: publish lands at once; SEEDANCE_JOBS takes a copy later, so reading it proves nothing).
TARGETS = [
    (f"KV_{LEASES}", f"$KV.{LEASES}.slicer.default"),
    ("KV_seedance-slicer-state", "$KV.seedance-slicer-state.default"),
    (f"KV_{POLICY_BUCKET}", f"$KV.{POLICY_BUCKET}.{QUOTA_POLICY_KEY}"),
    ("KV_seedance-tenants", f"$KV.seedance-tenants.{OTHER}"),
    (jobs.STREAM, jobs.subject(OTHER, "submitted")),
]

#: Each kind of request a tenant may send whose answer comes from the server itself: its job
#: events and compile requests (publish acks), its model chunks (acks), the JetStream API.
REQUESTS = [
    pytest.param(jobs.subject(TENANT, "submitted"), id="job-event-ack"),
    pytest.param(graph.subject(TENANT, "request"), id="compile-request-ack"),
    pytest.param(f"{models.tenant_wildcard(TENANT, 'upload')[:-4]}.r1.0", id="model-chunk-ack"),
    pytest.param("$JS.API.INFO", id="jetstream-api-answer"),
]


@pytest_asyncio.fixture
async def acme(auth_url: str) -> AsyncIterator[ShippedUser]:
    user = await connect_shipped(auth_url, f"tenant-{TENANT}", inbox_prefix=inbox_prefix(TENANT))
    try:
        yield user
    finally:
        await user.nc.close()


@pytest.mark.parametrize("request_subject", REQUESTS)
async def test_a_forged_reply_lands_on_no_subject_of_seedance(
    admin: Bus, acme: ShippedUser, request_subject: str
) -> None:
    await admin.js.key_value(LEASES)  # provisioned
    await assert_lands_nowhere(admin, acme, request_subject, b"{}", TARGETS)
    assert not acme.errors, acme.errors  # every request was the tenant's to send


async def test_the_tenants_own_answers_still_reach_it(acme: ShippedUser) -> None:
    """The positive case of the tenant: its ack and its API answer come back to its inbox."""
    js = acme.nc.jetstream(timeout=5.0)
    ack = await js.publish(jobs.subject(TENANT, "submitted"), b"{}")
    assert ack.stream == jobs.STREAM
    reply = await acme.nc.request("$JS.API.INFO", b"", timeout=5)
    assert b"account_info_response" in reply.data
    assert not acme.errors, acme.errors
