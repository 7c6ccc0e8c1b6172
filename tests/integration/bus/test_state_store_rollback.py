"""Review-3 finding 5 (the reviewer's proof, adapted): a first base cut short after its head
claim (a migration's `install` that met a bus error) must never read as a restored empty state
to the previous release (3abadc0d's StateStore with `DurableState.load`, which then drops the
legacy key as "a migration that stopped short": the slicer's whole state gone on rollback)."""

from __future__ import annotations

from typing import Any

import pytest

from seedance.core.errors import SeedanceError
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import StateStore
from tests.integration.bus import old_state_store_3abadc0d as old_release


class _ChunkFails:
    """The bucket, with every base chunk write failing as a bus error does."""

    def __init__(self, kv: Any) -> None:
        self._kv = kv

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if ".b." in key:
            raise ConnectionError("bus error under the first chunk")
        return int(await self._kv.update(key, value, last=last))


async def test_a_cut_short_install_never_reads_as_a_state_to_the_previous_release(
    bus: Any, unique: str
) -> None:
    kv = await ensure_bucket(bus, "seedance-slicer-state")
    prefix = f"pool{unique}"
    legacy = f"legacy{unique}"
    await kv.put(legacy, b"THE POOL'S WHOLE OLD STATE")
    new = StateStore(_ChunkFails(kv), prefix)
    assert not await new.load()
    with pytest.raises(ConnectionError):
        await new.install({"k": b"v"})  # the migration meets a bus error
    assert (await kv.get(f"{prefix}.head")).value  # the claim landed

    assert not await StateStore(kv, prefix).load()  # this release: empty, migrates again
    # The previous release: not a found (empty) state, so its DurableState.load neither
    # restores {} nor drops the legacy key; it fails to load instead.
    with pytest.raises(SeedanceError, match="chunk"):
        await old_release.StateStore(kv, prefix).load()
    assert (await kv.get(legacy)).value == b"THE POOL'S WHOLE OLD STATE"

    # This release finishes the migration; both releases then read the state.
    again = StateStore(kv, prefix)
    assert not await again.load()
    await again.install({"k": b"v"})
    for store in (StateStore(kv, prefix), old_release.StateStore(kv, prefix)):
        assert await store.load()
        assert store.entries == {"k": b"v"}
