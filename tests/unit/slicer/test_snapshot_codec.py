"""The slicer's KV snapshot codec: deflated so that a large pool fits the server's max_payload,
and snapshots written by older slicers (plain msgpack) still restore."""

from __future__ import annotations

import msgspec

from seedance.slicer.durable import LegacyState, pack_state, unpack_state


def _big() -> LegacyState:
    # About what 1,800 running jobs weigh: job ids, tenants, labels, node names repeat a lot.
    engine = b"".join(
        msgspec.msgpack.encode({"job": f"0192e4c1-{i:04x}-7000-8000-00000000{i:04x}",
                                "tenant": "openb", "node": f"openb-node-{i % 259:04d}",
                                "labels": {"seedance.io/namespace": "openb",
                                           "seedance.io/pod": f"openb-pod-{i:04d}"}})
        for i in range(8000)
    )  # fmt: skip
    return LegacyState(engine=engine, applied={"slicer-jobs": [1, 2, 3]}, floor={"slicer-jobs": 0})


def test_a_pool_over_one_mebibyte_is_written_under_it_and_reads_back() -> None:
    snap = _big()
    raw = msgspec.msgpack.encode(snap)
    assert len(raw) > 1024 * 1024
    packed = pack_state(snap)
    assert len(packed) < 1024 * 1024
    assert unpack_state(packed) == snap


def test_a_snapshot_written_by_an_older_slicer_still_restores() -> None:
    snap = LegacyState(engine=b"\x01\x02", outbox=[("seedance.slicing.acme.placement", b"x")])
    assert unpack_state(msgspec.msgpack.encode(snap)) == snap
