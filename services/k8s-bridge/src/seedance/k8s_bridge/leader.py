"""Leader election with a ``coordination.k8s.io/v1`` Lease: one active bridge per cluster.

The protocol is client-go's ``leaderelection`` (as kube-scheduler runs it), on the injected
clock: the holder renews ``spec.renewTime`` every ``renew_s`` with an update at the Lease's
``resourceVersion`` (a conflict means someone else wrote it: we lost). A candidate takes the
Lease when it is free (no holder: released) or when the record has not changed for
``duration_s`` *as measured by the candidate's own clock from when it first saw that record*:
``renewTime`` is the holder's clock and is never compared with ours, so clock skew between
hosts cannot hand the lease over early. The holder stops acting once it could not renew for
2/3 of ``duration_s``, before any standby may take over: by the injected clock, whatever a call
in flight does (``held`` is False from that instant, whoever asks, and each call is bounded by
that deadline on the same clock, `seedance.core.tasks.before_deadline`, then cancelled until it
has ended). ``asyncio.wait_for`` ran on the loop's time, which a virtual clock (or a stepped
one) does not move, and a cancel the API client swallowed kept a hung renewal leading until it
returned. A renewal counts from when it was sent: the record changed no earlier, so a standby's
count started no earlier. On a clean stop the holder releases
the Lease (empty holder), so a standby takes over at its next try instead of after the
duration; that release is bounded like a renewal (a hung API server must not hang the stop).
``kubernetes_asyncio.leaderelection`` does the same on the wall clock with naive
datetimes, hence this small twin on Seedance's clock.

Must not know what the leader does.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import Any

from seedance.core import Clock
from seedance.core.logs import get_logger
from seedance.core.tasks import Late, before_deadline
from seedance.k8s_bridge.core.kube import k8s_time
from seedance.k8s_bridge.kube import ApiStatus, ApiUnavailable, KubeApi

__all__ = ["LeaseElector"]

log = get_logger(__name__)


class LeaseElector:
    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration_s: float,
        renew_s: float,
    ) -> None:
        self._api = api
        self._clock = clock
        self._ns = namespace
        self._name = name
        self.identity = identity
        self._duration_s = duration_s
        #: How long after a renewal was sent we may act as leader without another.
        self._keep_s = duration_s * 2 / 3
        self._renew_s = renew_s
        #: Set while we lead; cleared the moment we stop.
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self._lease: dict[str, Any] | None = None
        #: When the last renewal (or acquisition) that succeeded was sent (our monotonic clock).
        self._renewed_at = 0.0
        #: The other holder's record as we last saw it, and when (our monotonic clock).
        self._seen: tuple[str, str] | None = None
        self._seen_at = 0.0
        self.transitions = 0

    @property
    def held(self) -> bool:
        """Whether we lead now (`seedance.core.durable.Leadership`): False once 2/3 of the
        duration has passed since the last renewal that succeeded, by the injected clock,
        whatever a renewal in flight does; asking then steps down (``leading`` cleared,
        ``lost`` set)."""
        if self.leading.is_set() and self._clock.monotonic() >= self._renewed_at + self._keep_s:
            self._step_down("renewal_deadline_passed")
        return self.leading.is_set()

    @property
    def acquired(self) -> asyncio.Event:
        """Set while we lead (`seedance.core.durable.Leadership`)."""
        return self.leading

    async def keep(self) -> None:
        """Try to acquire, then renew, until cancelled (then release, bounded like a renewal)."""
        try:
            while True:
                await self._step()
                await self._clock.sleep(self._renew_s)
        finally:
            with contextlib.suppress(ApiStatus, ApiUnavailable):
                await asyncio.shield(self._release_in_time())

    async def _release_in_time(self) -> None:
        """`release`, bounded like a renewal by what is left of 2/3 of the duration since the
        last one, on the injected clock: a hung API server must not hang the shutdown, and past
        that bound we no longer lead anyway (a standby takes over once the Lease lapses)."""
        if not self.leading.is_set():
            return  # nothing to give up (release would return at once)
        result = await before_deadline(self.release(), self._clock, self._renewed_at + self._keep_s)
        if isinstance(result, Late):
            self.leading.clear()  # a release cancelled before its first step cleared nothing
            log.warning("lease_release_too_slow", lease=self._name, holder=self.identity)

    async def _step(self) -> None:
        # A call that hangs must not keep us leading past 2/3 of the duration, when a standby
        # may take over: a renewal is bounded by what is left of that since the last one, an
        # acquisition by as much from now (a reply after that holds nothing).
        leading = self.held
        deadline_s = (self._renewed_at if leading else self._clock.monotonic()) + self._keep_s
        try:
            result = await before_deadline(self._try(), self._clock, deadline_s)
        except (ApiStatus, ApiUnavailable) as exc:
            log.warning("lease_error", lease=self._name, error=str(exc))
            # Keep leading through a short outage, but not past 2/3 of the duration.
            result = self.held
        if isinstance(result, Late):
            log.warning("lease_renewal_too_slow", lease=self._name)
            result = False
        if result:
            if not self.leading.is_set():
                log.info("lease_acquired", lease=self._name, holder=self.identity)
                self.lost.clear()
                self.leading.set()
        elif self.leading.is_set():
            self._step_down("not_renewed")

    def _step_down(self, why: str) -> None:
        log.warning("lease_lost", lease=self._name, holder=self.identity, reason=why)
        self.leading.clear()
        self.lost.set()

    def _spec(self, now: datetime, *, acquire: bool, transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self._duration_s)),
            "renewTime": k8s_time(now, micro=True),
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = k8s_time(now, micro=True)
        elif self._lease is not None:
            spec["acquireTime"] = (self._lease.get("spec") or {}).get("acquireTime")
        return spec

    async def _try(self) -> bool:
        now, sent_s = self._clock.now(), self._clock.monotonic()
        lease = await self._api.get_lease(self._ns, self._name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._ns},
                "spec": self._spec(now, acquire=True, transitions=0),
            }
            try:
                self._lease = await self._api.create_lease(self._ns, body)
            except ApiStatus as exc:
                if exc.code == 409:
                    return False  # another candidate created it first
                raise
            self._renewed_at = sent_s
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self.identity:
            if holder and not self._expired(lease):
                return False
            transitions += 1
        body = {
            **lease,
            "spec": self._spec(now, acquire=holder != self.identity, transitions=transitions),
        }
        try:
            self._lease = await self._api.replace_lease(self._ns, self._name, body)
        except ApiStatus as exc:
            if exc.code == 409:
                return False  # written by someone else since we read it
            raise
        self._renewed_at = sent_s
        if holder != self.identity:
            self.transitions = transitions
        return True

    def _expired(self, lease: dict[str, Any]) -> bool:
        """Whether the other holder's record went unchanged for the duration, by our clock."""
        spec = lease.get("spec") or {}
        record = (str(spec.get("holderIdentity")), str(spec.get("renewTime")))
        now = self._clock.monotonic()
        if record != self._seen:
            self._seen, self._seen_at = record, now
            return False
        duration = float(spec.get("leaseDurationSeconds") or self._duration_s)
        return now - self._seen_at >= duration

    async def release(self) -> None:
        """Give the Lease up if we hold it (a standby takes over at its next try)."""
        was_leading = self.leading.is_set()
        self.leading.clear()
        if not was_leading or self._lease is None:
            return
        current = await self._api.get_lease(self._ns, self._name)
        if current is None or (current.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        spec = dict(current.get("spec") or {})
        spec["holderIdentity"] = ""
        spec["renewTime"] = k8s_time(self._clock.now(), micro=True)
        with contextlib.suppress(ApiStatus):
            await self._api.replace_lease(self._ns, self._name, {**current, "spec": spec})
        self._lease = None
        log.info("lease_released", lease=self._name, holder=self.identity)
