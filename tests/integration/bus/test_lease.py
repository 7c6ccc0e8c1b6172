"""The leader lease on a real JetStream bucket: a holder that lets go frees the key at once."""

from __future__ import annotations

import uuid

import pytest
from nats.js.errors import KeyNotFoundError

from seedance.core import Bus, BusSettings, WallClock
from seedance.core.kv import Lease, ensure_bucket


@pytest.mark.parametrize("moved_by", ["own refresh", "another holder"])
async def test_release_after_a_refresh_that_landed_unseen(bus: Bus, moved_by: str) -> None:
    # A refresh cancelled in flight can land on the server after the lease stopped waiting
    # for it: the key is then one revision ahead of the one the lease knows. Releasing must
    # neither raise (that used to crash the slicer's shutdown) nor delete someone else's key.
    kv = await ensure_bucket(bus, "seedance-leases")
    key = f"test.{uuid.uuid4().hex[:8]}"
    lease = Lease(kv, key, "a", WallClock(), ttl_s=3.0)
    assert await lease.try_acquire()
    holder = b"a" if moved_by == "own refresh" else b"b"
    entry = await kv.get(key)
    await kv.update(key, holder, last=entry.revision)

    await lease.release()

    assert not lease.held
    if moved_by == "own refresh":
        with pytest.raises(KeyNotFoundError):
            await kv.get(key)
    else:
        assert (await kv.get(key)).value == b"b"


async def test_release_without_a_server_leaves_the_key_to_its_ttl(nats_url: str) -> None:
    # A service stopping after its server went away must stop cleanly (the lease task's
    # `finally` releases): the error is logged, not raised over the service's own shutdown.
    bus = await Bus.connect(BusSettings(url=nats_url, name="lease-test"))
    kv = await ensure_bucket(bus, "seedance-leases")
    lease = Lease(kv, f"test.{uuid.uuid4().hex[:8]}", "a", WallClock(), ttl_s=3.0)
    assert await lease.try_acquire()
    await bus.close()

    await lease.release()

    assert not lease.held
