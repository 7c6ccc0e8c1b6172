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
onto Seedance's subjects, then has the operator (Seedance's account) send the same request with
its reply on a control key: once the control's answer is stored, the tenant's (sent and flushed
before) have been answered too, and none of them may have landed. The control is the positive
case: on the old single-account config every forged target below changed the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats.js.errors
import pytest
import pytest_asyncio

from seedance.core import Bus
from seedance.events.stores import POLICY_BUCKET, QUOTA_POLICY_KEY
from seedance.events.subjects import graph, inbox_prefix, jobs, models
from seedance.testing.waits import eventually
from tests.integration.deploy.refusals import ShippedUser, connect_shipped

TENANT, OTHER = "acme", "globex"
LEASES = "seedance-leases"
#: Where the operator's control answers land (a key no service reads).
CONTROL = "control"

#: (stream, subject) of what a forged reply aimed at: the slicer's lease, its journal, the quota
#: policy, the tenant registry, another tenant's request subject and the whole JOBS stream.
TARGETS = [
    (f"KV_{LEASES}", f"$KV.{LEASES}.slicer.default"),
    ("KV_seedance-slicer-state", "$KV.seedance-slicer-state.default"),
    (f"KV_{POLICY_BUCKET}", f"$KV.{POLICY_BUCKET}.{QUOTA_POLICY_KEY}"),
    ("KV_seedance-tenants", f"$KV.seedance-tenants.{OTHER}"),
    ("SEEDANCE_JOBS", jobs.subject(OTHER, "submitted")),
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


async def stored(admin: Bus, stream: str, subject: str) -> int:
    """The sequence of the last message stored on ``subject`` (0: none): a KV bucket keeps one
    message per key, so a count would not see an overwrite."""
    try:
        return int((await admin.js.get_last_msg(stream, subject)).seq)
    except nats.js.errors.NotFoundError:
        return 0


@pytest.mark.parametrize("request_subject", REQUESTS)
async def test_a_forged_reply_lands_on_no_subject_of_seedance(
    admin: Bus, acme: ShippedUser, request_subject: str
) -> None:
    await admin.js.key_value(LEASES)  # provisioned
    before = {t: await stored(admin, *t) for t in TARGETS}
    for _, target in TARGETS:
        await acme.nc.publish(request_subject, b"{}", reply=target)
    await acme.nc.flush()
    # the control: the same request from Seedance's account, its reply on a lease key
    control = f"$KV.{LEASES}.{CONTROL}"
    was = await stored(admin, f"KV_{LEASES}", control)
    await admin.nc.publish(request_subject, b"{}", reply=control)
    await admin.nc.flush()

    async def control_landed() -> bool:
        return await stored(admin, f"KV_{LEASES}", control) > was

    await eventually(control_landed, 10.0)
    after = {t: await stored(admin, *t) for t in TARGETS}
    assert after == before
    assert not acme.errors, acme.errors  # every request was the tenant's to send


async def test_the_tenants_own_answers_still_reach_it(acme: ShippedUser) -> None:
    """The positive case of the tenant: its ack and its API answer come back to its inbox."""
    js = acme.nc.jetstream(timeout=5.0)
    ack = await js.publish(jobs.subject(TENANT, "submitted"), b"{}")
    assert ack.stream == "SEEDANCE_JOBS"
    reply = await acme.nc.request("$JS.API.INFO", b"", timeout=5)
    assert b"account_info_response" in reply.data
    assert not acme.errors, acme.errors
