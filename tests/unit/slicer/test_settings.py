"""SEEDANCE_SLICER_* settings validated at load: the lease's TTL against its bucket's."""

import pytest

from seedance.core.durable import LEASE_BUCKET
from seedance.core.settings import SettingsError, load_settings
from seedance.events.stores import BUCKETS
from seedance.slicer.settings import SlicerSettings

BUCKET_TTL_S = BUCKETS[LEASE_BUCKET].ttl_s


@pytest.mark.parametrize("ttl", ["1.5", str(BUCKET_TTL_S)])
def test_a_lease_ttl_within_the_buckets_is_taken(ttl: str) -> None:
    s = load_settings(SlicerSettings, "slicer", {"SEEDANCE_SLICER_LEASE_TTL_S": ttl})
    assert s.lease_ttl_s == float(ttl)


@pytest.mark.parametrize("ttl", [BUCKET_TTL_S + 0.5, 3 * BUCKET_TTL_S, 0.0, -1.0])
def test_a_lease_ttl_past_the_buckets_is_refused_naming_both(ttl: float) -> None:
    """A leader counts its lease held for ``lease_ttl_s`` after its last refresh; the key is
    gone ``BUCKET_TTL_S`` after it. From 3x that on, the key expired between every two
    refreshes; above it, a standby could lead while the old leader still did."""
    with pytest.raises(SettingsError) as err:
        load_settings(SlicerSettings, "slicer", {"SEEDANCE_SLICER_LEASE_TTL_S": str(ttl)})
    assert f"SEEDANCE_SLICER_LEASE_TTL_S={ttl!r}" in str(err.value)
    assert f"'{LEASE_BUCKET}' ({BUCKET_TTL_S:g} s)" in str(err.value)
