"""One replica planner per router fleet: every gateway reports, the lease holder plans.

Owns the bus side of the fleet's planning. Every gateway publishes what it observed per model
and per planning bin (`plan_observations`) on ``seedance.routing.<model>.observed``. The
gateway holding the lease ``router-plan.<fleet>`` (``seedance-leases``) reads every gateway's
reports with its own ``router-plan-<fleet>-<gateway>`` consumer (on ``SEEDANCE_ROUTING_PLAN``,
the router's own mirror of the reports, where its user can touch no other service's consumer;
checked against its origin before it is read, `plan_mirror`), merges them (`ObservationMerge`)
into the planner's estimators and outcome tally, and the service plans on that merged view; the
other gateways only route. After each plan the leader commits what the
plan changed of the planner's state (`plan_state`: each model's `PlanState` and
`EstimatorState`, the merge, the stream sequence they reflect) to a
`seedance.core.state_store.StateStore` under ``<fleet>.plan`` in ``seedance-router-plan``,
then each model's count to ``<fleet>.replicas`` (what the other gateways follow); a new leader
(a standby, or the same router restarted) loads the store and replays the reports published
since, so neither a handover nor a restart forgets the learnt capacity factor, any of the
arrivals the planner held, or starts the fleet's count afresh. A store still empty beside an
older planner's one-value snapshot (key ``<fleet>``) starts from that, written as the store's
first base; the old key is then deleted.

Must not decide (the planner does) nor route. A leader whose commit is refused (`StateConflict`:
another wrote since) is superseded: that decision is neither published nor followed, and it
gives the lease up, leading again only once it holds it afresh (restored from the other's
state). Each leader reads with a consumer of its own name, so two leaders of a split brain
never delete each other's reader (binding re-creates the consumer). A report this router
cannot decode is dead-lettered (``decode_error``), like one naming another fleet.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Callable, Sequence

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from seedance.core import TRANSIENT_BUS_ERRORS, Bus, Clock, DeadLetters
from seedance.core.id_key import derived_id_key
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.reader import PullReader, ReaderInterrupted
from seedance.core.state_store import CorruptState, StateConflict, StateStore, StoreStats
from seedance.events.codec import DecodeError, decode
from seedance.events.routing import PlanObservations
from seedance.events.specs import ConsumerSpec
from seedance.events.subjects import fleet_plan_consumer, routing
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_mirror import OPERATOR_FIX, MirrorDiverged, divergence, ensure_mirror
from seedance.router.plan_observations import (
    ArrivalLog,
    MergeState,
    ObservationMerge,
    bin_end_s,
    observation_events,
    split_to_fit,
)
from seedance.router.plan_state import (
    STORE_COMPACT_RECORDS,
    STORE_SLOTS,
    ModelSnapshot,
    PlanEntries,
    PlanSnapshot,
    counts_key,
    legacy_key,
    state_prefix,
)
from seedance.router.planner_feed import OutcomesByArrival

__all__ = ["PLAN_BUCKET", "FleetPlanner", "gateway_name"]

log = get_logger(__name__)

# What stops a leader reading (it unbinds and tries again at the next interval): the bus, or
# `StateConflict` when another writer moved the store's head while this one read its base (a
# deposed leader compacting).
_READ_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_BUS_ERRORS, StateConflict)
_counts_enc = msgspec.msgpack.Encoder()
_counts_dec = msgspec.msgpack.Decoder(dict[str, int])

PLAN_BUCKET = "seedance-router-plan"
LEASES_BUCKET = "seedance-leases"
# The leases bucket's TTL (`seedance.events.stores`): the lease is refreshed every third of it.
_LEASE_TTL_S = 10.0
# Reports not yet published (the bus away) kept for the next attempt while their bin ended
# within this many seconds; older ones are dropped (logged, counted): a bin lost is traffic the
# planner does not see, a backlog without bound is worse. Below the stream's 120 s duplicate
# window, so the stream drops a retry of a bin that did land; the planner's merge skips any
# that get by.
_UNSENT_S = 90.0
# The catch-up target is read from the stream the gateways publish to, not from the router's
# mirror its readers bind (`routing.PLAN_STREAM`): the mirror may not hold a report yet that
# the stream acknowledged; the mirror keeps the stream's sequences, so the target is the same.
_ROUTING_STREAM = routing.STREAM
# Room left in a message for its headers (the id, the trace context).
_HEADERS_BYTES = 4096
# How long a catch-up waits for the reports the stream holds.
_CATCH_UP_S = 5.0
_CATCH_UP_POLL_S = 0.5


def gateway_name(configured: str = "") -> str:
    """This gateway's name in its reports: the setting, else the host name (the pod's), as a
    subject token."""
    name = configured or socket.gethostname()
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:64] or "gateway"


class FleetPlanner:
    """Reports this gateway's observations; while holding the fleet's lease, merges every
    gateway's reports into `plans` / `estimators` (the service's dicts, updated in place)."""

    def __init__(
        self,
        *,
        fleet: str,
        gateway: str,
        models: Sequence[str],
        bin_s: float,
        clock: Clock,
        now_s: Callable[[], float],
        outcomes: OutcomesByArrival,
        plans: dict[str, PlanState],
        estimators: dict[str, LoadEstimator],
        on_leading: Callable[[bool], None] = lambda _: None,
        on_dropped: Callable[[str, int], None] = lambda _reason, _n: None,
        on_diverged: Callable[[bool], None] = lambda _: None,
        on_refused: Callable[[bool], None] = lambda _: None,
    ) -> None:
        self.fleet, self.gateway = fleet, gateway
        self._models = tuple(models)
        self._bin_s = bin_s
        self._clock = clock
        self._now_s = now_s
        self._outcomes = outcomes
        self.plans, self.estimators = plans, estimators
        self._initial_plans = dict(plans)
        self._on_leading = on_leading
        self._on_dropped = on_dropped  # (reason, per-model reports): the service's counter
        self._on_diverged = on_diverged  # True while it refuses to plan on a diverged mirror
        self._on_refused = on_refused  # True while its stored state does not decode
        self.arrivals = ArrivalLog()
        self.merge = ObservationMerge(estimators, bin_s, now_s=now_s)
        self.seq = 0
        self.planned_s: float | None = None
        self._bus: Bus | None = None
        self._kv: KeyValue | None = None
        self._store: StateStore | None = None
        self._entries = PlanEntries(bin_s)
        self.lease: Lease | None = None
        self._reader: PullReader | None = None
        self._letters: DeadLetters | None = None
        self._reported_until_s: float | None = None
        self._unsent: list[list[tuple[str, PlanObservations]]] = []

    def now_s(self) -> float:
        """This gateway's clock (epoch seconds that never go back), the reports' time base."""
        return self._now_s()

    @property
    def store_stats(self) -> StoreStats:
        """What the state's last commit and last base cost (`StateStore.stats`)."""
        assert self._store is not None
        return self._store.stats

    @property
    def leading(self) -> bool:
        return self._reader is not None and self.lease is not None and self.lease.held

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._kv = await ensure_bucket(bus, PLAN_BUCKET)
        # Every gateway's letter for one report is the same (the leader's successor sends it
        # again), keyed with the router's secret in its plan bucket: nodes write to SEEDANCE_DLQ.
        self._letters = DeadLetters(bus, "router", id_key=await derived_id_key(self._kv))
        self._store = StateStore(
            self._kv,
            state_prefix(self.fleet),
            slots=STORE_SLOTS,
            compact_records=STORE_COMPACT_RECORDS,
        )
        leases = await ensure_bucket(bus, LEASES_BUCKET)
        self.lease = Lease(
            leases, f"router-plan.{self.fleet}", self.gateway, self._clock, _LEASE_TTL_S
        )

    async def keep_lease(self) -> None:
        assert self.lease is not None
        await self.lease.keep()

    async def close(self) -> None:
        """Stop: the last partial bin and every unsent one published (marked leaving: the
        planner stops waiting for this gateway at once), the reader and the lease released."""
        if self._bus is not None and self._reported_until_s is not None:
            await self.report(self._now_s(), leaving=True)
        await self._stand_down()
        if self.lease is not None:
            await self.lease.release()

    # -- every gateway: reports --------------------------------------------------------------

    async def report_loop(self) -> None:
        while True:
            await self._clock.sleep(max(0.0, bin_end_s(self._now_s(), self._bin_s) - self._now_s()))
            await self.report(self._now_s())

    async def report(self, now_s: float, *, leaving: bool = False) -> None:
        """Publish the bins ended by `now_s` (one per model, empty ones too); `leaving`: the
        gateway stops, its last bin ends at `now_s` and says so."""
        assert self._bus is not None
        until_s = now_s if leaving else bin_end_s(now_s, self._bin_s) - self._bin_s
        since_s = (
            self._reported_until_s if self._reported_until_s is not None else until_s - self._bin_s
        )
        if since_s > until_s or (since_s == until_s and not leaving):
            return
        self._reported_until_s = until_s
        self._unsent.append(
            self._fitting_reports(
                observation_events(
                    fleet=self.fleet,
                    gateway=self.gateway,
                    models=self._models,
                    since_s=since_s,
                    until_s=until_s,
                    arrivals=self.arrivals.take(until_s),
                    outcomes=self._outcomes.take(),
                    at=self._clock.now(),
                    leaving=leaving,
                )
            )
        )
        while self._unsent and (
            not self._unsent[0] or self._unsent[0][-1][1].until_s < now_s - _UNSENT_S
        ):
            self._drop_head("backlog")
        while self._unsent:
            try:
                await self._bus.publish_many(self._unsent[0])
            except nats.errors.MaxPayloadError as exc:
                # Permanent for these messages (a retry is as large): dropped, not retried, so
                # the bins after it are not held up behind it.
                log.error("plan_observations_too_large", error=repr(exc))
                self._drop_head("too_large")
                continue
            except TRANSIENT_BUS_ERRORS as exc:  # kept; the same ids make a retry a duplicate
                log.warning("plan_observations_publish_failed", error=repr(exc))
                return
            del self._unsent[0]

    def _fitting_reports(
        self, reports: list[tuple[str, PlanObservations]]
    ) -> list[tuple[str, PlanObservations]]:
        """Each model's report split into parts that fit one message (`split_to_fit`); one that
        cannot be split to fit is dropped (logged, counted)."""
        assert self._bus is not None
        limit = self._bus.nc.max_payload - _HEADERS_BYTES
        out: list[tuple[str, PlanObservations]] = []
        for subject, event in reports:
            parts = split_to_fit(self.fleet, event, limit)
            if not parts:
                log.error(
                    "plan_observations_too_large",
                    model=event.model,
                    until_s=event.until_s,
                    arrivals=len(event.arrivals),
                )
                self._on_dropped("too_large", 1)
            out += [(subject, part) for part in parts]
        return out

    def _drop_head(self, reason: str) -> None:
        dropped = self._unsent.pop(0)
        log.warning(
            "plan_observations_dropped",
            reason=reason,
            until_s=dropped[-1][1].until_s if dropped else None,
        )
        self._on_dropped(reason, len(dropped))

    # -- the lease holder: merge and snapshot ------------------------------------------------

    async def ready(self) -> float | None:
        """While this gateway holds the lease: every report published so far merged, and the
        time the merged view is complete up to, if newer than the last plan's (else None)."""
        if self.lease is None or not self.lease.held:
            await self._stand_down()
            self._on_diverged(False)  # not this gateway's to plan (the holder's gauge says)
            self._on_refused(False)
            return None
        try:
            if self._reader is None:
                await self._restore()
                self._on_refused(False)
                await self._bind()
            await self._catch_up()
        except CorruptState as exc:
            # A key of the plan's state that is not the store's write (a tenant once had the
            # server write a publish ack over the head: review-reply p17, every gateway that
            # took the lease exited 78). Only planning stops: the gateway routes on, holding
            # the lease so no other gateway restores it too, and restores again every
            # interval, so planning resumes once an operator restores or removes the key.
            log.error("plan_state_refused", fleet=self.fleet, reason=str(exc))
            self._on_refused(True)
            await self._stand_down()
            return None
        except MirrorDiverged as exc:
            # Stale reports merged, new ones never seen: no plan until the operator deletes the
            # mirror (this user may not), checked again at every interval.
            log.error("plan_mirror_diverged", fleet=self.fleet, reason=str(exc), fix=OPERATOR_FIX)
            self._on_diverged(True)
            await self._stand_down()
            return None
        except _READ_ERRORS as exc:
            log.warning("plan_observations_read_failed", error=repr(exc))
            await self._stand_down()
            return None
        as_of = self.merge.release()
        if as_of is None or (self.planned_s is not None and as_of <= self.planned_s):
            return None
        self.planned_s = as_of
        return as_of

    async def fleet_target(self) -> int | None:
        """The largest count the fleet's planner last committed over this gateway's models
        (None: none yet): what a gateway that does not plan follows."""
        assert self._kv is not None
        try:
            entry = await self._kv.get(counts_key(self.fleet))
            counts = _counts_dec.decode(entry.value or b"")
        except (KeyNotFoundError, msgspec.DecodeError):
            return None
        except TRANSIENT_BUS_ERRORS as exc:  # the next interval reads it again
            log.warning("plan_counts_read_failed", error=repr(exc))
            return None
        known = [counts[m] for m in self._models if m in counts]
        return max(known) if known else None

    async def save(self) -> bool:
        """Commit what the plan changed of the planner's state (after a plan): what a new
        leader resumes from. False: superseded (another leader wrote since), so the decision
        must not be acted on; this gateway then stops leading and gives the lease up until it
        holds it again."""
        assert self._store is not None
        snapshot = PlanSnapshot(
            seq=self.seq,
            planned_s=self.planned_s,
            models={
                m: ModelSnapshot(plan=self.plans[m], estimator=self.estimators[m].state())
                for m in self._models
            },
            merge=self.merge.state(),
        )
        try:
            await self._store.commit(self._entries.changes(snapshot))
        except StateConflict as exc:
            # Another leader committed since this one loaded (or a commit of this one's that
            # the bus did not acknowledge landed after all: standing down is then a handover
            # to whoever takes the lease, restored from the store, never a lost write).
            log.warning("plan_snapshot_superseded", fleet=self.fleet, error=str(exc))
            await self._stand_down()  # another leader wrote it: restore before leading again
            if self.lease is not None:
                # Until it is held afresh (the lease's loop re-creates the key if none holds
                # it): a lease still held would restore and lead again at the next interval.
                await self.lease.release()
            return False
        except TRANSIENT_BUS_ERRORS as exc:
            # It may or may not have landed (a reply lost): the next interval restores what
            # the store holds before committing again. Committing on instead rewrote the first
            # records of a commit whose last one had landed (review2: a restore read a mixture
            # of two commits, 22,500 arrivals lost).
            log.warning("plan_snapshot_failed", error=repr(exc))
            await self._stand_down()
            return True
        self._entries.committed()
        await self._write_counts(snapshot)
        return True

    async def _write_counts(self, snapshot: PlanSnapshot) -> None:
        """Each model's committed count under `counts_key`, after every commit (the other
        gateways read it every interval, which the whole store would make costly). A plain
        put, written even when unchanged: a deposed leader's put that lands late (a client
        reconnecting flushes it) holds only until the leader's next commit, one interval.
        Skipped when unchanged, it held for as long as the leader's count stayed the same
        (review2: followers at 4 while the leader planned 8)."""
        assert self._kv is not None
        value = _counts_enc.encode({m: s.plan.replicas for m, s in snapshot.models.items()})
        try:
            await self._kv.put(counts_key(self.fleet), value)
        except TRANSIENT_BUS_ERRORS as exc:  # written at the next commit
            log.warning("plan_counts_failed", error=repr(exc))

    async def _restore(self) -> None:
        assert self._store is not None
        assert self._bus is not None
        found = await self._store.load()
        # Also when nothing is stored (a purged bucket): the committed view starts empty.
        snapshot = self._entries.restore(self._store.entries)
        legacy = await self._store.take_legacy(legacy_key(self.fleet))
        if not found and legacy is not None:
            snapshot = await self._migrate(legacy)
        elif legacy is not None:  # a migration that stopped short of deleting it
            await self._store.drop_legacy(legacy_key(self.fleet))
        self.plans.clear()
        self.plans.update(self._initial_plans)
        fresh = {m: LoadEstimator(self.estimators[m].cfg) for m in self._models}
        if snapshot is None:
            info = await self._bus.stream_info(_ROUTING_STREAM)
            # No state: from the reports published from now on (a day of history is not
            # replayed into an empty planner).
            self.seq = info.state.last_seq if info is not None else 0
            self.planned_s = None
            merge_state = MergeState()
        else:
            self.seq, self.planned_s = snapshot.seq, snapshot.planned_s
            if self.planned_s is not None and self.planned_s > self._now_s():
                # Planned as of a skewed gateway's future (an older version): not waited for.
                log.warning("plan_snapshot_ahead", fleet=self.fleet, planned_s=self.planned_s)
                self.planned_s = None
            for m, saved in snapshot.models.items():
                if m in self.plans:
                    self.plans[m] = saved.plan
                    fresh[m] = LoadEstimator.restore(saved.estimator, self.estimators[m].cfg)
            merge_state = snapshot.merge
        self.estimators.clear()
        self.estimators.update(fresh)
        self.merge = ObservationMerge(self.estimators, self._bin_s, merge_state, now_s=self._now_s)
        log.info(
            "plan_state_restored",
            fleet=self.fleet,
            seq=self.seq,
            found=snapshot is not None,
            arrivals=sum(len(m.estimator.arrivals) for m in snapshot.models.values())
            if snapshot is not None
            else 0,
            journal_records=self._store.stats.journal_records,
            factors={m: p.capacity_factor for m, p in self.plans.items()},
        )

    async def _migrate(self, legacy: bytes) -> PlanSnapshot | None:
        """An older planner's one-value snapshot as the store's first base (its key then
        deleted); None when this version cannot read it (logged, deleted: the store is the
        state from now on)."""
        assert self._store is not None
        snapshot: PlanSnapshot | None = None
        try:
            snapshot = msgspec.msgpack.decode(legacy, type=PlanSnapshot)
        except msgspec.DecodeError as exc:
            log.warning("plan_snapshot_unreadable", fleet=self.fleet, error=str(exc))
        else:
            await self._store.install(self._entries.entries(snapshot))
            self._entries.committed()
            log.info("plan_snapshot_migrated", fleet=self.fleet, seq=snapshot.seq)
        await self._store.drop_legacy(legacy_key(self.fleet))
        return snapshot

    def _consumer(self, start_seq: int = 0) -> ConsumerSpec:
        """This gateway's own reader: binding deletes and re-creates it (a new start), which
        must never remove another leader's (review2 finding 9: a shared name did)."""
        return fleet_plan_consumer(self.fleet, self.gateway, start_seq)

    async def _verify(self) -> bool:
        """The planner's position and its mirror checked against the origin (review1 findings
        5, 7): True when the position was moved back (the origin was created again: its
        sequences restarted below the position, whose reports would otherwise be skipped until
        it passed it). The mirror is created if it is gone; `MirrorDiverged` when it holds
        what the origin does not."""
        assert self._bus is not None
        # The mirror first: read after the origin, it may hold a report published in between,
        # past the origin's last sequence as read, which would look diverged.
        mirror = await ensure_mirror(self._bus)
        origin = await self._bus.stream_info(_ROUTING_STREAM)
        rewound = origin is not None and self.seq > origin.state.last_seq
        if origin is not None and rewound:
            # Every report of the new origin is read (a report the planner did merge, from the
            # old one, is skipped by the merge as a duplicate of its bin).
            seq, self.seq = self.seq, max(0, origin.state.first_seq - 1)
            log.warning(
                "plan_origin_rewound",
                fleet=self.fleet,
                seq=seq,
                origin_last_seq=origin.state.last_seq,
                replay_from=self.seq + 1,
            )
        reason = await divergence(self._bus, origin, mirror)
        if reason is not None:
            raise MirrorDiverged(reason)
        self._on_diverged(False)
        return rewound

    async def _bind(self) -> None:
        assert self._bus is not None
        await self._verify()
        spec = self._consumer(start_seq=self.seq + 1)
        await self._bus.ensure_consumer(spec)
        reader = PullReader(self._bus.nc, spec.stream, spec.durable, batch=500)
        await reader.start()
        self._reader = reader
        self._on_leading(True)

    async def _stand_down(self) -> None:
        """Stop leading until `ready` restores from the store: the reader closed and a base
        being written stopped (a deposed leader's base must not go on after another loaded)."""
        await self._unbind()
        if self._store is not None:
            await self._store.close()

    async def _unbind(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            with contextlib.suppress(*TRANSIENT_BUS_ERRORS):
                await reader.close()
            self._on_leading(False)

    async def _catch_up(self) -> None:
        """Apply every report of this fleet the stream holds now.

        The target is the stream's own last message on the fleet's subjects (a get by subject,
        answered by the stream leader after every publish it has acknowledged), not the
        consumer's pending count: the server counts a message as pending a moment after it
        acknowledged its publish, so a plan right after a report found it not yet pending (3
        in 200 under load) and planned an interval late or skipped a decision."""
        assert self._bus is not None
        assert self._reader is not None
        if await self._verify():  # the reader starts past the position now: again from it
            await self._unbind()
            await self._bind()
        try:
            last = await self._bus.js.get_last_msg(
                _ROUTING_STREAM, routing.fleet_observed(self.fleet)
            )
        except NotFoundError:  # no report of this fleet in the stream (yet, or any more)
            return
        target = last.seq or 0
        waited_s = 0.0
        # The bound holds only for a consumer that does not deliver what the stream holds.
        while self.seq < target and waited_s < _CATCH_UP_S:
            try:
                msgs = await self._reader.next_batch(timeout_s=_CATCH_UP_POLL_S)
            except ReaderInterrupted as exc:
                log.warning("plan_observations_rebind", reason=str(exc), seq=self.seq)
                await self._unbind()
                await self._bind()
                msgs = []
            waited_s += 0.0 if msgs else _CATCH_UP_POLL_S
            for msg in msgs:
                await self._apply(msg)
        if self.seq < target:  # planned on what came; the next plan reads on
            log.warning("plan_observations_behind", seq=self.seq, target=target)

    async def _apply(self, msg: Msg) -> None:
        """Merge one report, or dead-letter it (the letter's id is derived from the report's:
        a leader replaying it within the duplicate window publishes no second letter). A
        letter that cannot be sent raises the bus's error before the sequence moves on, so
        the report is read again."""
        assert self._letters is not None
        try:
            event = decode(msg.data, PlanObservations)
        except DecodeError as exc:  # a newer version this router does not know, or garbage
            reason = f"not a PlanObservations this router can decode: {exc}"
            await self._letters.send(msg, "decode_error", reason)
        else:
            fleet = routing.observed_fleet(msg.subject)
            if event.fleet != fleet:
                # Another fleet's report on this one's subject (or one naming none): never
                # merged.
                reason = f"fleet {event.fleet!r} disagrees with the subject's {fleet!r}"
                await self._letters.send(msg, "fleet_mismatch", reason)
            else:
                self.merge.apply(event)
        self.seq = msg.metadata.sequence.stream
