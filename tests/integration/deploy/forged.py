"""A forged reply subject's probe, shared by the account tests (test_tenant_account,
test_node_account): a user of another account sends a request with its reply forged onto
Seedance's subjects, then the operator (Seedance's account) sends the same request with its reply
on a control key. Once the control's answer is stored, the forged ones (sent and flushed before)
were answered too, and none may have landed: the control is the positive case, the server's
answer landing where a reply in Seedance's own account points.
"""

from __future__ import annotations

from collections.abc import Sequence

import nats.js.errors

from seedance.core import Bus
from seedance.core.barrier import flushed
from seedance.testing.waits import eventually
from tests.integration.deploy.refusals import ShippedUser

LEASES = "seedance-leases"
#: Where the operator's control answers land (a key no service reads).
CONTROL = f"$KV.{LEASES}.control"


async def last_stored(admin: Bus, stream: str, subject: str) -> int:
    """The sequence of the last message stored on ``subject`` (0: none): a KV bucket keeps one
    message per key, so a count would not see an overwrite."""
    try:
        return int((await admin.js.get_last_msg(stream, subject)).seq)
    except nats.js.errors.NotFoundError:
        return 0


async def assert_lands_nowhere(
    admin: Bus,
    user: ShippedUser,
    subject: str,
    body: bytes,
    targets: Sequence[tuple[str, str]],
) -> None:
    """``user`` sends ``subject`` once per (stream, subject) of ``targets`` with its reply forged
    onto it; after the operator's control has landed, no target holds anything new."""
    before = {t: await last_stored(admin, *t) for t in targets}
    for _, target in targets:
        await user.nc.publish(subject, body, reply=target)
    await flushed(user.nc)
    was = await last_stored(admin, f"KV_{LEASES}", CONTROL)
    await admin.nc.publish(subject, body, reply=CONTROL)
    await flushed(admin.nc)

    async def control_landed() -> bool:
        return await last_stored(admin, f"KV_{LEASES}", CONTROL) > was

    await eventually(control_landed, 10.0, what=f"the control answer to {subject}")
    after = {t: await last_stored(admin, *t) for t in targets}
    assert after == before, subject
