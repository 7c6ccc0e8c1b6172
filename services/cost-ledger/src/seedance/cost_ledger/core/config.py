"""The ledger's configuration: charge window, lateness, retention, the sources' allowed skew.

Owns ``LedgerConfig`` only (it is part of every snapshot, so its fields and their order are the
checkpoint format's). Must not read the environment: the service's settings build it.
"""

from __future__ import annotations

import msgspec

from seedance.cost_ledger.core.pricebook import PricingTier

__all__ = ["LedgerConfig"]


class LedgerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Charge window (also the interval of running jobs' entries) and allowed lateness."""

    window_s: int = 300
    lateness_s: int = 60
    default_tier: PricingTier = "on_demand"
    # Closed windows kept re-computable for late facts; older ones are sealed and their
    # per-window state dropped, which bounds the snapshot. None keeps everything (exact for
    # any lateness); a fact for a sealed window is counted in ``late_facts``, never applied.
    retention_windows: int | None = None
    # How long the telemetry may be silent on the server's clock (no sample batch in the merged
    # stream for this long by its stream timestamps) before other inputs move the clock to
    # their time less this (see ``LedgerReplica.clock_ms``): a stalled collector delays
    # entries by at most this; a backlog, sourced in seconds, never closes windows early.
    source_skew_s: int = 900

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    @property
    def late_fact_bound_ms(self) -> int | None:
        """How far behind the time the ledger was last advanced to (``advance(now_ms)``) a fact
        may be dated and still be charged exactly, as in any order (None: any lateness).

        A fact's window is sealed when it lies ``retention_windows`` below the first window
        still open (``closable_until``, ``lateness`` behind the clock); a fact dated at most
        this far behind the clock lies in a window at or above that, whatever the windows'
        alignment. Later facts are counted in ``late_facts``, never charged."""
        if self.retention_windows is None:
            return None
        return self.retention_windows * self.window_ms + self.lateness_ms

    @property
    def source_skew_ms(self) -> int:
        return self.source_skew_s * 1000

    @property
    def lateness_ms(self) -> int:
        return self.lateness_s * 1000
