"""The telemetry events' bounds: every consumer's decoder refuses an impossible value, naming it.

A node-side credential (``node-<n>``, the collector, the node agent, the replayer) publishes
these; the ledger and the slicer store their integers in msgpack checkpoints. One sample batch
with ``energy_j: 2e16`` (finite, valid JSON) was applied by the ledger and then failed every
checkpoint (``OverflowError``): billing stopped for every tenant. Each case here decoded on the
code before the bounds (checked: the whole file fails there but for the in-range cases).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from seedance.events import DecodeError, decode, encode, new_event_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.telemetry import (
    MAX_ENERGY_J,
    MAX_GPU_MEM_MIB,
    MAX_GPU_MODEL_LEN,
    MAX_GPU_UUID_LEN,
    MAX_NODE_DEVICES,
    MAX_NODE_GPUS,
    GpuHealth,
    GpuInfo,
    GpuSample,
    GpuSampleBatch,
    NodeInventory,
    PodShare,
    PodShares,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MODEL = "NVIDIA A100-SXM4-80GB"
_ID = new_event_id(at=T0)


def _wire(obj: dict[str, Any]) -> bytes:
    """A message as a hostile node would put it on the wire: JSON, no client-side checks."""
    return msgspec.json.encode(obj)


def _batch(**gpu: Any) -> bytes:
    sample = msgspec.to_builtins(GpuSample(index=0, sm_active=0.5, energy_j=1.0))
    return _wire(
        {
            "type": "gpu.sample_batch.v1",
            "id": _ID,
            "at": T0.isoformat(),
            "node": "n1",
            "gpus": [sample | gpu],
        }
    )


def _inventory(node: dict[str, Any] | None = None, **gpu: Any) -> bytes:
    info = msgspec.to_builtins(GpuInfo(index=0, model=MODEL, mem_total_mib=81920))
    body = {
        "type": "node.inventory.v1",
        "id": _ID,
        "at": T0.isoformat(),
        "node": "n1",
        "cpu_milli": 64_000,
        "memory_mib": 512_000,
        "gpus": [info | gpu],
    }
    return _wire(body | (node or {}))


def _pod_shares(**share: Any) -> bytes:
    base = {"gpu_index": 0, "pod_uid": "u1", "sm_share": 0.5, "mem_share": 0.1}
    return _wire(
        {
            "type": "gpu.pod_share.v1",
            "id": _ID,
            "at": T0.isoformat(),
            "node": "n1",
            "window_start": T0.isoformat(),
            "shares": [base | share],
        }
    )


def _health(**fields: Any) -> bytes:
    body = {"type": "gpu.health.v1", "id": _ID, "at": T0.isoformat(), "node": "n1"}
    return _wire(body | {"gpu_index": 0, "healthy": False} | fields)


#: (message, the field the refusal must name): the probe's values and each bound's edge.
REFUSED = [
    (_batch(energy_j=2e16), "$.gpus[0].energy_j"),
    (_batch(energy_j=-1e16), "$.gpus[0].energy_j"),
    (_batch(energy_j=-1.0), "$.gpus[0].energy_j"),
    (_batch(energy_j=MAX_ENERGY_J * 1.01), "$.gpus[0].energy_j"),
    (_batch(index=2**64), "$.gpus[0].index"),
    (_batch(index=MAX_NODE_GPUS), "$.gpus[0].index"),
    (_batch(index=-1), "$.gpus[0].index"),
    (_batch(mem_used_mib=1e300), "$.gpus[0].mem_used_mib"),
    (_batch(mem_total_mib=MAX_GPU_MEM_MIB + 1), "$.gpus[0].mem_total_mib"),
    (_batch(mem_reserved_mib=-1.0), "$.gpus[0].mem_reserved_mib"),
    (_batch(throttle_reasons=2**64), "$.gpus[0].throttle_reasons"),
    (_inventory(index=2**64), "$.gpus[0].index"),
    (_inventory(index=MAX_NODE_DEVICES), "$.gpus[0].index"),
    (_inventory(mem_total_mib=2**64), "$.gpus[0].mem_total_mib"),
    (_inventory(mem_total_mib=-1), "$.gpus[0].mem_total_mib"),
    (_inventory({"cpu_milli": 2**63}), "$.cpu_milli"),
    (_inventory({"memory_mib": -1}), "$.memory_mib"),
    (_pod_shares(gpu_index=2**64), "$.shares[0].gpu_index"),
    (_pod_shares(mem_used_mib=1e300), "$.shares[0].mem_used_mib"),
    (_pod_shares(periods=2**64), "$.shares[0].periods"),
    (_health(gpu_index=2**64), "$.gpu_index"),
    (_health(xid=-1), "$.xid"),
    # Strings and maps (review: a 400,000-character model made the ledger's cost entry larger
    # than max_payload, and every replica failed there): each one past its bound by one.
    (_inventory(model="A" * 400_000), "$.gpus[0].model"),
    (_inventory(model="A" * (MAX_GPU_MODEL_LEN + 1)), "$.gpus[0].model"),
    (_inventory(uuid="G" * (MAX_GPU_UUID_LEN + 1)), "$.gpus[0].uuid"),
    (_inventory(nvlink_domain="d" * 193), "$.gpus[0].nvlink_domain"),
    (_inventory({"labels": {"k" * 318: "v"}}), "key` in `$.labels"),  # msgspec's words
    (_inventory({"labels": {"k": "v" * 64}}), "$.labels[...]"),
    (_inventory({"labels": {f"k{i}": "v" for i in range(65)}}), "$.labels"),
    (_batch(uuid="G" * (MAX_GPU_UUID_LEN + 1)), "$.gpus[0].uuid"),
    (_health(uuid="G" * (MAX_GPU_UUID_LEN + 1)), "$.uuid"),
    (_health(reason="r" * 257), "$.reason"),
    (_pod_shares(gpu_uuid="G" * (MAX_GPU_UUID_LEN + 1)), "$.shares[0].gpu_uuid"),
    (_pod_shares(pod_uid="u" * 254), "$.shares[0].pod_uid"),
    (_pod_shares(namespace="n" * 64), "$.shares[0].namespace"),
    (_pod_shares(pod="p" * 254), "$.shares[0].pod"),
    (_pod_shares(tenant="t" * 64), "$.shares[0].tenant"),
    (_pod_shares(job_id="j" * 129), "$.shares[0].job_id"),
]


@pytest.mark.parametrize(
    ("data", "field"), REFUSED, ids=[f"{i}:{f}" for i, (_, f) in enumerate(REFUSED)]
)
def test_decoder_refuses_an_out_of_range_field_naming_it(data: bytes, field: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(data)
    assert f"at `{field}`" in str(caught.value)


def test_too_many_gpus_for_one_node_are_refused() -> None:
    one = msgspec.to_builtins(GpuSample(index=0, sm_active=0.5))
    batch = {"type": "gpu.sample_batch.v1", "id": _ID, "at": T0.isoformat(), "node": "n1"}
    with pytest.raises(DecodeError, match=r"at `\$\.gpus`"):
        decode(_wire(batch | {"gpus": [one] * (MAX_NODE_GPUS + 1)}))
    info = msgspec.to_builtins(GpuInfo(index=0, model=MODEL, mem_total_mib=4864))
    inventory = msgspec.json.decode(_inventory())
    with pytest.raises(DecodeError, match=r"at `\$\.gpus`"):
        decode(_wire(inventory | {"gpus": [info] * (MAX_NODE_DEVICES + 1)}))
    assert len(decode(_wire(inventory | {"gpus": [info] * MAX_NODE_DEVICES})).gpus) == 128


@pytest.mark.parametrize(
    "data",
    [
        # The edges a real node reaches: its last GPU, a counter 10 years at 1.2 kW (3.8e11 J),
        # a 288 GB GPU's memory, a zero counter (a freshly loaded driver).
        _batch(index=MAX_NODE_GPUS - 1, energy_j=1200 * 10 * 365.25 * 86_400),
        _batch(energy_j=0.0, mem_used_mib=274_658.0, mem_total_mib=274_658.0),
        _inventory(index=MAX_NODE_GPUS - 1, mem_total_mib=274_658),
        # 16 GPUs as 7 MIG instances each, as Kubernetes counts them (`single` MIG strategy).
        _inventory(index=16 * 7 - 1, mem_total_mib=4864),
        # A 20-GPU PCIe server (T4s, one 4U box): review, 16 refused its last four.
        _batch(index=19, energy_j=1.0),
        _pod_shares(gpu_index=19),
        _health(gpu_index=19),
        _pod_shares(gpu_index=MAX_NODE_GPUS - 1, mem_used_mib=81_000.0, periods=600),
        _health(gpu_index=7, xid=79),
        # Every string at its bound: NVML's longest name and UUID, Kubernetes' longest names.
        _inventory(
            {"labels": {f"{'p' * 253}/{'n' * 61}{i:02}": "v" * 63 for i in range(64)}},
            model="M" * MAX_GPU_MODEL_LEN,
            uuid="G" * MAX_GPU_UUID_LEN,
            nvlink_domain="d" * 192,
        ),
        _batch(uuid="MIG-" + "G" * (MAX_GPU_UUID_LEN - 4)),
        _health(uuid="G" * MAX_GPU_UUID_LEN, reason="r" * 256),
        _pod_shares(
            gpu_uuid="G" * MAX_GPU_UUID_LEN,
            pod_uid="u" * 253,
            namespace="n" * 63,
            pod="p" * 253,
            tenant="t" * 63,
            job_id="j" * 128,
        ),
    ],
    ids=lambda data: f"{len(data)}B",  # stable (values hold random ids): xdist's workers agree
)
def test_real_values_decode(data: bytes) -> None:
    event = decode(data)
    assert isinstance(event, GpuSampleBatch | NodeInventory | PodShares | GpuHealth)
    assert decode(encode(event)) == event


def test_pod_share_struct_keeps_its_bound_on_its_own() -> None:
    # A PodShare decoded on its own (the node agent's reads) is held to the same bounds.
    raw = _wire({"gpu_index": 2**64, "pod_uid": "u", "sm_share": 0.1, "mem_share": 0.1})
    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.gpu_index`"):
        msgspec.json.decode(raw, type=PodShare)


def test_a_placement_is_bounded_as_the_inventories_it_copies() -> None:
    """The cost-ledger copies a placement's GPU model into each entry three times: unbounded, a
    360 KB model made a 1.08 MB entry and failed the replica's publish (`MaxPayloadError`)."""
    ok = Placement(
        id=_ID, at=T0, job_id="j1", tenant="acme", node="n1", gpu_model="m" * 128,
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0, uuid="u" * 96)],
    )  # fmt: skip
    assert decode(encode(ok)) == ok
    wire = msgspec.json.decode(encode(ok))
    for patch, field in [
        ({"gpu_model": "m" * 129}, "$.gpu_model"),
        ({"gpus": [{"index": 0, "uuid": "u" * 97}]}, "$.gpus[0].uuid"),
        ({"gpus": [{"index": 0, "mig_profile": "p" * 33}]}, "$.gpus[0].mig_profile"),
        ({"gpus": [{"index": 0}] * (MAX_NODE_DEVICES + 1)}, "$.gpus"),
    ]:
        with pytest.raises(DecodeError) as caught:
            decode(_wire(wire | patch))
        assert f"at `{field}`" in str(caught.value)
