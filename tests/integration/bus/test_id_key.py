"""`seedance.core.id_key.derived_id_key` against a real nats-server, as the shipped users of the
services that key their ids (the graph-compiler, the k8s-bridge, the slicer) in their own
buckets: replicas racing to create the key converge on one, and a restart reads that same one
back, so every replica derives the same ids (docs/security.md, "Nats-Msg-Id"); no node or
tenant reads the slicer's."""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import Bus
from seedance.core.id_key import KEY_BYTES, KEY_NAME, derived_id_key
from seedance.core.kv import ensure_bucket
from seedance.events.subjects import inbox_prefix
from seedance.testing.identities import as_user
from tests.integration.deploy.refusals import connect_shipped

REPLICAS = 4


@pytest.mark.parametrize(
    ("user", "bucket"),
    [
        ("graph-compiler", "seedance-graph-results"),
        ("k8s-bridge", "seedance-k8s-bridge-jobs"),
        ("slicer", "seedance-slicer-state"),
    ],
)
async def test_replicas_racing_to_create_the_key_converge_and_a_restart_reads_it(
    auth_url: str, admin: Bus, user: str, bucket: str
) -> None:
    await (await ensure_bucket(admin, bucket)).delete(KEY_NAME)  # none yet: a delete marker
    replicas = [
        await Bus.connect(as_user(auth_url, user, name=f"{user}-{i}")) for i in range(REPLICAS)
    ]
    try:
        kvs = [await ensure_bucket(b, bucket) for b in replicas]
        keys = await asyncio.gather(*(derived_id_key(kv) for kv in kvs))
    finally:
        for b in replicas:
            await b.close()
    assert len(set(keys)) == 1, "the replicas derive their ids under different keys"
    assert len(keys[0]) == KEY_BYTES
    restarted = await Bus.connect(as_user(auth_url, user, name=f"{user}-restarted"))
    try:
        assert await derived_id_key(await ensure_bucket(restarted, bucket)) == keys[0]
    finally:
        await restarted.close()


async def test_a_key_older_than_the_refresh_age_is_put_again_the_same(
    auth_url: str, admin: Bus
) -> None:
    """The compiler's bucket has a TTL: a key in use is put again, the same bytes, once it is
    ``refresh_after_s`` old (here 0: any stored key is), so it never ages out; replicas racing
    the refresh keep the one value. One younger than that is left as it is."""
    bucket = "seedance-graph-results"
    await (await ensure_bucket(admin, bucket)).delete(KEY_NAME)
    replicas = [
        await Bus.connect(as_user(auth_url, "graph-compiler", name=f"gc-{i}"))
        for i in range(REPLICAS)
    ]
    try:
        kv = await ensure_bucket(replicas[0], bucket)
        key = await derived_id_key(kv)
        made = (await kv.get(KEY_NAME)).revision
        assert await derived_id_key(kv, refresh_after_s=3600.0) == key
        assert (await kv.get(KEY_NAME)).revision == made, "a young key was put again"
        kvs = [await ensure_bucket(b, bucket) for b in replicas]
        keys = await asyncio.gather(*(derived_id_key(k, refresh_after_s=0.0) for k in kvs))
        entry = await kv.get(KEY_NAME)
    finally:
        for b in replicas:
            await b.close()
    assert set(keys) == {key}
    assert entry.value == key
    assert made is not None
    assert entry.revision is not None
    assert entry.revision > made, "the key was not put again"


@pytest.mark.parametrize(
    ("user", "inbox"), [("node-agent", "_INBOX"), ("tenant-acme", inbox_prefix("acme"))]
)
async def test_no_node_or_tenant_reads_the_slicers_key(
    auth_url: str, admin: Bus, user: str, inbox: str
) -> None:
    """The slicer's key is in its own bucket (`seedance-slicer-state`): a node's or a tenant's
    user asking for it, directly or through the stream API, is refused by the server."""
    await derived_id_key(await ensure_bucket(admin, "seedance-slicer-state"))
    other = await connect_shipped(auth_url, user, inbox_prefix=inbox)
    try:
        stream, subject = "KV_seedance-slicer-state", f"$KV.seedance-slicer-state.{KEY_NAME}"
        for ask in (f"$JS.API.DIRECT.GET.{stream}.{subject}", f"$JS.API.STREAM.MSG.GET.{stream}"):
            assert await other.refused(ask, f'{{"last_by_subj": "{subject}"}}'.encode()), ask
    finally:
        await other.nc.close()
