"""The nodes' measured readings the ledger bills from: GPU samples and per-pod shares.

Owns ``Readings``, the part of ``Facts`` that holds them per (node, window), each applied once
per what it measures: a GPU's sample once per (node, GPU, instant), a node's pod shares once
per (node, window start), whatever their ids. The node agents' and collectors' ids are random
(docs/security.md, "Nats-Msg-Id"), so a batch published again for an instant already read (a
restarted or replaying publisher) comes under a new id, and one reading under two ids would
weigh twice in a window's mean. An instant holds the smaller id's activity and memory and the
larger of its readings' energies (``add_reading``), not the first to arrive's: a function of
the set of readings, so stepwise application, ``recompute`` and ``merge`` agree in any order
(``Ledger.merge`` passes a held reading on even under an id already seen, since its energy may
be another id's). Only a node's own subject carries its samples and shares (the replica
checks), so no other node takes a place here; and a fact's id stays what its event's id makes
it (``<batch id>:<gpu index>``), which no other publisher can compute before the node
publishes. Must not price, emit, nor know the bus's events (``mapping``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seedance.cost_ledger.core.facts import PodShareReading

__all__ = ["Reading", "Readings", "SampleReadings"]

#: One sample: (activity ppm, energy mJ, at ms, used MiB).
Reading = tuple[int, int, int, int]
#: One GPU's samples in one window: {event id: reading}, one per instant.
SampleReadings = dict[str, Reading]


class Readings:
    """The samples and pod shares of unsealed windows, with the indexes attribution reads."""

    def __init__(self) -> None:
        # samples[(node, gpu, window)] = {event_id: (activity_ppm, energy_mj, at_ms, mem_mib)};
        # sample_at[(node, gpu, window)] = ({at_ms: the event id held for that instant}, the
        # same window's readings): one look-up on the hottest path finds both.
        self.samples: dict[tuple[str, int, int], SampleReadings] = {}
        self.sample_at: dict[tuple[str, int, int], tuple[dict[int, str], SampleReadings]] = {}
        self.sample_nodes: dict[int, set[str]] = defaultdict(set)
        self.sample_gpus: dict[tuple[str, int], set[int]] = defaultdict(set)
        # pod_shares[(node, window)] = {event_id: reading}; pod_share_of[(node, window start
        # ms)] = (window, event id) of the one reading applied for it.
        self.pod_shares: dict[tuple[str, int], dict[str, PodShareReading]] = {}
        self.pod_share_of: dict[tuple[str, int], tuple[int, str]] = {}

    def add_reading(self, node: str, gpu: int, w: int, event_id: str, reading: Reading) -> bool:
        """Record one sample in window ``w``, once per (node, GPU, instant); False where it
        changes nothing. The caller indexes ``sample_nodes`` (once per batch: the hottest
        path).

        Of two readings of one instant, the smaller id's activity and memory are held, and the
        larger of their energies: the energy is the replica's difference against the GPU's
        previous reading, so the same batch arriving again gets none (``mapping._samples``),
        and the instant's energy must not depend on which of the two came first."""
        key = (node, gpu, w)
        at = reading[2]
        slot = self.sample_at.get(key)
        if slot is None:  # the GPU's first reading in the window
            readings = {event_id: reading}
            self.sample_at[key] = ({at: event_id}, readings)
            self.samples[key] = readings
            self.sample_gpus[(node, w)].add(gpu)
            return True
        instants, readings = slot
        n = len(instants)
        held_id = instants.setdefault(at, event_id)
        if len(instants) > n:  # most readings: a new instant
            readings[event_id] = reading
            return True
        held = readings[held_id]
        mj = max(held[1], reading[1])
        if event_id < held_id:
            del readings[held_id]
            instants[at] = event_id
            readings[event_id] = (reading[0], mj, at, reading[3])
            return True
        if mj != held[1]:
            readings[held_id] = (held[0], mj, at, held[3])
            return True
        return False

    def add_pod_shares(self, e: PodShareReading, w: int) -> int | None:
        """Record ``e`` in window ``w``, unless the node's window starting where it does holds
        a reading under a smaller id; returns the window of the reading it replaced (``w``
        where none), None where ``e`` changes nothing.

        Once per (node, window start): a measured share is the mean over the node's readings,
        where one window under two ids would weigh twice (the module's docstring)."""
        if e.start_ms is None:
            self.pod_shares.setdefault((e.node, w), {})[e.event_id] = e
            return w
        key = (e.node, e.start_ms)
        held = self.pod_share_of.get(key)
        if held is not None and held[1] <= e.event_id:
            return None
        replaced = w
        if held is not None:
            replaced, old_id = held
            readings = self.pod_shares[(e.node, replaced)]
            del readings[old_id]
            if not readings:
                del self.pod_shares[(e.node, replaced)]
        self.pod_share_of[key] = (w, e.event_id)
        self.pod_shares.setdefault((e.node, w), {})[e.event_id] = e
        return replaced

    def drop_readings_before(self, until: int) -> None:
        """Forget the samples and pod shares of windows before ``until`` (found through the
        window indexes: no scan of every sample)."""
        for w in [w for w in self.sample_nodes if w < until]:
            for node in self.sample_nodes.pop(w):
                for g in self.sample_gpus.pop((node, w), ()):
                    self.samples.pop((node, g, w), None)
                    self.sample_at.pop((node, g, w), None)
        for key in [k for k in self.pod_shares if k[1] < until]:
            for r in self.pod_shares.pop(key).values():
                if r.start_ms is not None:
                    self.pod_share_of.pop((r.node, r.start_ms), None)
