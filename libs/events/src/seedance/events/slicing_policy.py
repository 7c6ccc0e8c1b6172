"""The SlicingPolicy in force as the slicer reads it, and what the slicer says it follows.

Owns two documents of the KV bucket ``seedance-policy`` (`seedance.events.stores`):

- `SlicingPolicyDoc`, at key ``slicing``: the `default` SlicingPolicy CR's spec (the brief's
  ClusterPolicy: placement policy, MIG strategy and default profile, shared-GPU profiles per
  GPU model) in the slicer's names. The k8s-bridge writes it (`from_spec`); outside
  Kubernetes an operator writes the same JSON (``nats kv put seedance-policy slicing``) or
  names a file (``SEEDANCE_SLICER_SLICING_FILE``).
- `SlicingApplied`, inside each slicer's ``usage.<pool>`` document under ``"slicing"``: the
  digest of the document the pool's slicer applied and, per CR field it does not follow,
  why. The bridge writes the CR's status from it: `InForce` only when every pool that
  reported applied this very document and follows all of it; `PartiallyInForce` naming the
  fields otherwise; never "followed" before a slicer said so.

Frozen msgspec Structs, unknown fields tolerated on decode, a new field gets a default (as the
events). No I/O; it decides nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = [
    "SharedGpuProfile",
    "SlicingApplied",
    "SlicingPolicyDoc",
    "decode_policy",
    "digest",
    "encode_policy",
    "from_spec",
]


class SharedGpuProfile(msgspec.Struct, frozen=True, kw_only=True):
    """How GPUs of one model are shared: time-slicing or MPS, at most `replicas` sharers."""

    gpu_model: str
    mode: str = "time-slicing"
    replicas: int
    memory_mib_per_replica: int | None = None


class SlicingPolicyDoc(msgspec.Struct, frozen=True, kw_only=True):
    """The SlicingPolicy's spec in the slicer's names (CR field in each comment)."""

    #: spec.placementPolicy: ``seedance`` or ``first-fit``.
    placement_policy: str = "seedance"
    #: spec.mig.strategy: ``none``, ``single`` or ``mixed``.
    mig_strategy: str = "mixed"
    #: spec.mig.defaultProfile: the profile a request for "a MIG instance" gets.
    mig_default_profile: str | None = None
    #: spec.sharedGpu.
    shared_gpu: tuple[SharedGpuProfile, ...] = ()


class SlicingApplied(msgspec.Struct, frozen=True, kw_only=True):
    """What one pool's slicer did with the document of digest `digest`, read at KV key `key`
    (the bridge counts only the slicers that follow the key it writes)."""

    digest: str
    key: str = ""
    #: CR field path (``spec.mig.strategy``, ``spec.sharedGpu[0].replicas``) -> why it is not
    #: followed. Empty: the slicer follows every field.
    unhonoured: dict[str, str] = msgspec.field(default_factory=dict)


def from_spec(spec: Mapping[str, Any]) -> SlicingPolicyDoc:
    """A checked SlicingPolicy spec (the CRD's schema and the bridge's checks passed) as the
    document, the CRD's defaults filled in."""
    mig = spec.get("mig") or {}
    return SlicingPolicyDoc(
        placement_policy=spec.get("placementPolicy", "seedance"),
        mig_strategy=mig.get("strategy", "mixed"),
        mig_default_profile=mig.get("defaultProfile"),
        shared_gpu=tuple(
            SharedGpuProfile(
                gpu_model=s["gpuModel"],
                mode=s.get("mode", "time-slicing"),
                replicas=s["replicas"],
                memory_mib_per_replica=s.get("memoryMiBPerReplica"),
            )
            for s in spec.get("sharedGpu") or ()
        ),
    )


_ENCODER = msgspec.json.Encoder(order="sorted")
_DECODER = msgspec.json.Decoder(SlicingPolicyDoc)


def encode_policy(doc: SlicingPolicyDoc) -> bytes:
    """The document's bytes: keys sorted, so one policy is always the same bytes."""
    return _ENCODER.encode(doc)


def decode_policy(data: bytes) -> SlicingPolicyDoc:
    """The document from its bytes (msgspec.ValidationError / DecodeError on bad ones)."""
    return _DECODER.decode(data)


def digest(data: bytes) -> str:
    """What a slicer reports it applied: the document's bytes' SHA-256 (hex, 16 characters)."""
    return hashlib.sha256(data).hexdigest()[:16]
