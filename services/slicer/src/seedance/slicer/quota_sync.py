"""The quota policy from KV, put in force between batches, and the pool's usage written back.

Owns following the quota key (every replica: a standby that takes over knows the latest),
applying a new document as a durable change (`seedance.core.durable.DurableRuntime.transact`:
decided, saved with the policy, published), refusing an invalid one once with its reason, and
writing what each tenant holds in the pool (``usage.<pool>``, read by the k8s-bridge into the
TenantQuota statuses). It must not decide placements: `seedance.slicer.core.Scheduler.set_quota`
does, and `seedance.slicer.decider` maps its decisions to events.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.js.kv import KeyValue

from seedance.core import TRANSIENT_BUS_ERRORS, Clock
from seedance.core.durable import DurableRuntime
from seedance.core.kv import watching
from seedance.core.logs import get_logger
from seedance.events import Event
from seedance.events.base import derived_event_id
from seedance.events.subjects import quota_usage_key
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.core import QuotaError, QuotaPolicy
from seedance.slicer.decider import SlicerDecider
from seedance.slicer.durable import SlicerState, slicer_state
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.settings import SlicerSettings

__all__ = ["QuotaSync"]

log = get_logger(__name__)


class QuotaSync:
    def __init__(
        self,
        *,
        settings: SlicerSettings,
        clock: Clock,
        file_quota: QuotaPolicy | None,
        cluster_policy: ClusterPolicy,
        decider: SlicerDecider,
        metrics: SlicerMetrics,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._file_quota = file_quota
        self._cluster_policy = cluster_policy
        self._decider = decider
        self._metrics = metrics
        self._durable: DurableRuntime | None = None
        #: The policy bucket (None: neither a quota nor a SlicingPolicy key is followed).
        self.kv: KeyValue | None = None
        #: The quota key's latest value seen by the watch (None: deleted) and its revision;
        #: None before the watch reported. A refused document is remembered so that it is
        #: logged once, not at every poll.
        self._latest: tuple[bytes | None, int] | None = None
        self._refused_doc: bytes | None = None
        #: Why the latest quota document was refused (the parser's words); None once one is
        #: applied. Logged as `slicer_quota_refused` too.
        self.refusal: str | None = None
        #: The pool's quota usage as last written to KV (`usage.<pool>`).
        self.usage_written: bytes | None = None

    def bind(self, durable: DurableRuntime, kv: KeyValue | None) -> None:
        """The runtime whose state the policy goes into, and the policy bucket (None: none)."""
        self._durable, self.kv = durable, kv

    @property
    def _state(self) -> SlicerState:
        return slicer_state(self._durable)

    def saved(self, doc: bytes | None) -> QuotaPolicy | None:
        """The policy a snapshot was decided under (None document: the file's)."""
        if doc is None:
            return self._file_quota
        try:
            return QuotaPolicy.from_yaml(doc.decode())
        except (QuotaError, UnicodeDecodeError) as exc:  # it parsed when it was saved
            log.error("slicer_saved_quota_unreadable", error=str(exc))
            return self._file_quota

    async def watch(self) -> None:
        """Follow the quota key; the leader applies it between batches (`sync`)."""
        assert self.kv is not None
        assert self._durable is not None
        async with watching(self.kv, self._settings.quota_key) as entries:
            async for entry in entries:
                if entry is None:
                    continue  # the end of the current value
                deleted = entry.operation is not None  # DEL or PURGE
                self._latest = (None if deleted else bytes(entry.value or b""), entry.revision or 0)
                self._durable.wake()

    async def usage_loop(self, stopping: Any) -> None:
        """Every leader poll period, `publish_usage`: beside the batches and the leader loop,
        so a slow or refused write delays neither."""
        while not stopping.is_set():
            await self._clock.sleep(self._settings.lease_ttl_s / 6)
            await self.publish_usage()

    async def publish_usage(self) -> None:
        """Write what each tenant holds in this pool when it changed; off the batch path, so
        the figure lags by up to a poll period."""
        if self.kv is None or self._durable is None or not self._durable.leading:
            return
        doc: dict[str, Any] = {
            "revision": self._state.quota_revision,
            "tenants": self._state.scheduler.quota_usage(),
        }
        applied = self._cluster_policy.applied()
        if applied is not None:  # what it follows of the SlicingPolicy (the CR's status)
            doc["slicing"] = msgspec.to_builtins(applied)
        data = json.dumps(doc, sort_keys=True).encode()
        if data == self.usage_written:
            return
        try:
            await self.kv.put(quota_usage_key(self._settings.pool), data)
        except TRANSIENT_BUS_ERRORS as exc:
            log.warning("slicer_usage_not_written", error=repr(exc))
            return
        self.usage_written = data

    async def sync(self) -> None:
        """Put the latest KV quota policy in force when it is new (leader only, between
        batches). An invalid document, or one whose application raises, is refused with its
        reason, once; the old policy stays."""
        latest = self._latest
        if latest is None or self._durable is None or not self._durable.leading:
            return
        doc, revision = latest
        if doc == self._state.quota_doc or (doc is not None and doc == self._refused_doc):
            return
        try:
            policy = self._file_quota if doc is None else QuotaPolicy.from_yaml(doc.decode())
        except (QuotaError, UnicodeDecodeError) as exc:
            self._refuse(doc, revision, str(exc))
            return
        except Exception as exc:
            # The parser failed otherwise on this text (as a MemoryError, RecursionError, int
            # conversion or unorderable keys once did): raised, it would take the leader down,
            # and every next leader with it, on the same document. Refused, as in `_apply`.
            self._refuse(doc, revision, f"parsing it raised {type(exc).__name__}")
            return
        await self._apply(policy, doc, revision)

    def _refuse(self, doc: bytes | None, revision: int, reason: str) -> None:
        self._refused_doc = doc
        self.refusal = reason[:1000]
        self._metrics.quota_updates_total.labels("refused").inc()
        log.warning("slicer_quota_refused", revision=revision, reason=self.refusal)

    def _policy_time(self) -> datetime:
        """When a new policy takes effect: the slicer's own clock (a trusted service's
        decision), or "now" in a replayed fleet; never before the latest time decided at (a
        held job it admits is placed no earlier than its submit: `SlicerState.decide_at`)."""
        now_s = self._state.replay_now_s
        if self._settings.request_clock == "replay" and now_s is not None:
            return self._state.decide_at(datetime.fromtimestamp(now_s, UTC))
        return self._state.decide_at(self._clock.now())

    async def _apply(self, policy: QuotaPolicy | None, doc: bytes | None, rev: int) -> None:
        """As a batch: decide (held jobs a raised quota admits), save with the policy, publish.
        A failed save leaves the committed state; the next poll tries again."""
        assert self._durable is not None
        decisions: list[int] = []

        def change() -> list[tuple[str, Event]]:
            at = self._policy_time()
            cause = Event(
                id=derived_event_id(
                    f"quota/{self._settings.pool}/{rev}", "quota",
                    unix_ms=int(at.timestamp() * 1000),
                ),
                at=at,
            )  # fmt: skip
            st = self._state
            effects = st.scheduler.set_quota(policy, at.timestamp())
            out = self._decider.publishable(effects, cause, at)
            st.quota, st.quota_doc, st.quota_revision = policy, doc, rev
            decisions.append(len(out))
            return out

        try:
            saved = await self._durable.transact(change, what="quota", log_fields={"revision": rev})
        except Exception as exc:
            # Applying the document raised (a bug it meets in the scheduler): `transact` rolled
            # the state back. Raised, it would take the leader down, and every next leader
            # with it, on the same document: refused, as an invalid one is; the old stays.
            self._refuse(doc, rev, f"applying it raised {exc!r}")
            return
        if not saved:
            return
        self._metrics.quota_updates_total.labels("applied").inc()
        self.refusal = None
        self._metrics.quota_revision.set(rev if doc is not None else 0)
        self._decider.update_gauges()
        log.info(
            "slicer_quota_applied",
            revision=rev,
            source="kv" if doc is not None else "file",
            tenants=len(policy.tenants) if policy is not None else 0,
            decisions=decisions[0] if decisions else 0,
        )
