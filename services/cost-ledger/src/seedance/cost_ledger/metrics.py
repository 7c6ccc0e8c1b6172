"""The cost-ledger's metrics: one class on an injected registry (``seedance_cost_ledger_*``).

Owns the names, help texts and closed label sets; it must not count anything itself: the
service (`seedance.cost_ledger.service`) does.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge

__all__ = ["DEAD_LETTER_KINDS", "LedgerMetrics"]

#: The kinds an input is dead-lettered with (``InputRejected.kind``, and ``decode_error``).
DEAD_LETTER_KINDS = (
    "future_time", "subject_mismatch", "tenant_mismatch", "unknown_tenant", "invalid_input",
    "step_error", "decode_error", "implausible_energy",
)  # fmt: skip


class LedgerMetrics:
    def __init__(self, registry: Any) -> None:
        self.events_total = Counter(
            "seedance_cost_ledger_events_total", "Inputs stepped through.", registry=registry
        )
        self.published_total = Counter(
            "seedance_cost_ledger_outputs_total",
            "Outputs published, by whether the stream already had them (another replica).",
            ["duplicate"],
            registry=registry,
        )
        self.cost_usd_total = Counter(
            "seedance_cost_ledger_cost_usd_total",
            "Positive cost entries this replica published first, by tenant (the bill: the stream).",
            ["tenant"],
            registry=registry,
        )
        self.idle_cost_usd_total = Counter(
            "seedance_cost_ledger_idle_cost_usd_total",
            "Positive idle-capacity cost entries this replica published first, by node.",
            ["node"],
            registry=registry,
        )
        self.dead_letters_total = Counter(
            "seedance_cost_ledger_dead_letters_total",
            "Inputs dead-lettered, by kind (future_time: dated past the bound; subject_mismatch: a "
            "node's fact naming another node than its subject's; tenant_mismatch; invalid_input; "
            "step_error; decode_error; implausible_energy: a GPU's energy counter rose faster "
            "than any GPU draws).",
            ["kind"],
            registry=registry,
        )
        for kind in DEAD_LETTER_KINDS:  # each at 0 from the start: a rate, not "no data"
            self.dead_letters_total.labels(kind)
        self.rebinds_total = Counter(
            "seedance_cost_ledger_input_rebinds_total",
            "Attempts to re-create the input consumer after it went away, by result.",
            ["result"],
            registry=registry,
        )
        self.checkpoint_failures_total = Counter(
            "seedance_cost_ledger_checkpoint_failures_total",
            "Checkpoints that failed on a transient bus error (retried later).",
            registry=registry,
        )
        self.checkpoint_seq = Gauge(
            "seedance_cost_ledger_checkpoint_seq",
            "Input sequence of the last checkpoint this replica wrote.",
            registry=registry,
        )
        self.fallback_priced_total = Counter(
            "seedance_cost_ledger_fallback_priced_entries_total",
            "Cost entries this replica published first for a GPU model the price book could "
            "not price (billed at its fallback, flagged price_fallback), by line kind.",
            ["kind"],
            registry=registry,
        )
        self.fallback_models = Gauge(
            "seedance_cost_ledger_fallback_models",
            "GPU models this replica has billed at the price book's fallback (each logged once).",
            registry=registry,
        )
