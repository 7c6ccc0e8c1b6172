"""The slicer's side of the SlicingPolicy: follow the KV key, apply it to requests, say what it
follows.

Every replica watches the key ``slicing`` of bucket ``seedance-policy`` (``SEEDANCE_SLICER_
SLICING_KEY``; written by the k8s-bridge from the `default` SlicingPolicy CR, or by an operator
outside Kubernetes), so a standby that takes over knows the latest; without a document there
the file ``SEEDANCE_SLICER_SLICING_FILE`` (the same JSON) is in force, else none. A document
that does not decode is refused with its reason, logged once, and the previous one stays.
`synced` is set once the watch has delivered the key's history: the leader consumes only then,
so a restarted slicer never decides a request under no policy while one is in force.

`applied()` is what the leader writes into its ``usage.<pool>`` document (`SlicingApplied`:
the digest of the document in force and the fields it does not follow), which the bridge turns
into the CR's status. The decisions are `seedance.slicer.core.cluster_policy`'s.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from nats.js.kv import KeyValue

from seedance.core.kv import watching
from seedance.core.logs import get_logger
from seedance.events.slicing_policy import SlicingApplied, SlicingPolicyDoc, decode_policy, digest
from seedance.slicer.core.cluster_policy import unhonoured, with_default_profile
from seedance.slicer.core.inputs import JobSpec

__all__ = ["ClusterPolicy"]

log = get_logger(__name__)


class ClusterPolicy:
    """See the module docstring."""

    def __init__(self, placement_policy: str, *, key: str = "", file: str = "") -> None:
        self._placement_policy = placement_policy
        self._key = key
        self._file_doc = Path(file).read_bytes() if file else None
        self._file_policy = decode_policy(self._file_doc) if self._file_doc else None
        self._kv_doc: bytes | None = None
        self._kv_policy: SlicingPolicyDoc | None = None
        self._refused: bytes | None = None
        #: Why the latest KV document was refused (None once one is in force).
        self.refusal: str | None = None
        self.synced = asyncio.Event()
        if not key:
            self.synced.set()

    @property
    def policy(self) -> SlicingPolicyDoc | None:
        """The policy in force: the KV document's, else the file's, else none."""
        return self._kv_policy if self._kv_doc is not None else self._file_policy

    def resolve(self, job: JobSpec) -> JobSpec:
        """`job` as the policy in force has it (its default MIG profile filled in)."""
        return with_default_profile(job, self.policy)

    def applied(self) -> SlicingApplied | None:
        """What this slicer follows of the policy in force (None: there is none)."""
        doc = self._kv_doc if self._kv_doc is not None else self._file_doc
        policy = self.policy
        if doc is None or policy is None:
            return None
        return SlicingApplied(
            digest=digest(doc),
            key=self._key if self._kv_doc is not None else "",
            unhonoured=unhonoured(policy, self._placement_policy),
        )

    def seen(self, value: bytes | None) -> None:
        """The key's value changed (None: deleted)."""
        if value is None or not value:
            self._kv_doc, self._kv_policy, self.refusal = None, None, None
            return
        if value == self._refused:
            return
        try:
            policy = decode_policy(value)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._refused = value
            self.refusal = str(exc)[:1000]
            log.warning("slicer_slicing_policy_refused", reason=self.refusal)
            return
        self._kv_doc, self._kv_policy, self.refusal = value, policy, None
        log.info(
            "slicer_slicing_policy_applied",
            mig_default_profile=policy.mig_default_profile,
            unhonoured=sorted(unhonoured(policy, self._placement_policy)),
        )

    async def watch(self, kv: KeyValue) -> None:
        """Follow the key until cancelled."""
        try:
            async with watching(kv, self._key) as entries:
                async for entry in entries:
                    if entry is None:  # the key's current value is read: what is in force
                        self.synced.set()
                        continue
                    self.seen(None if entry.operation is not None else bytes(entry.value or b""))
        finally:
            self.synced.set()
