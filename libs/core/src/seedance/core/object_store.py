"""The catalogue's object stores: bound, created on first use where the user may, else waited
for provision, and checked for drift, never changed (`seedance.core.kv.ensure_bucket`'s
sibling; re-exported by `seedance.core.kv`)."""

from __future__ import annotations

from nats.js import api as js_api
from nats.js.errors import BucketNotFoundError
from nats.js.object_store import ObjectStore

from seedance.core.bus import Bus
from seedance.core.drift import check_drift, object_store_config
from seedance.events.subjects import OBJECT_STORES, ObjectStoreSpec

__all__ = ["create_object_store", "ensure_object_store"]


async def ensure_object_store(bus: Bus, name: str) -> ObjectStore:
    """Bind the catalogue's object store ``name``, creating it on first use where this user
    may, else waiting for provision; an existing one is never changed, only checked (as
    `ensure_bucket`)."""
    spec: ObjectStoreSpec = OBJECT_STORES[name]
    try:
        store = await bus.js.object_store(spec.name)
    except BucketNotFoundError:
        created = await bus.create_or_await(
            f"OBJ_{spec.name}", lambda: create_object_store(bus, spec)
        )
        if created is not None:
            return created
        store = await bus.js.object_store(spec.name)
    wanted = object_store_config(spec, bus._replicas())
    check_drift(wanted, (await bus.js.stream_info(wanted.name or "")).config)
    return store


async def create_object_store(bus: Bus, spec: ObjectStoreSpec) -> ObjectStore:
    """Create store ``spec`` as its service does (as `seedance.core.kv` creates a bucket)."""
    return await bus.js.create_object_store(
        spec.name,
        js_api.ObjectStoreConfig(
            description=spec.description or None,
            ttl=spec.ttl_s or None,
            max_bytes=spec.max_bytes,
            replicas=bus._replicas(),
        ),
    )
