"""The cost-ledger's settings (``SEEDANCE_COST_LEDGER_*``) and the budgets file they name."""

from __future__ import annotations

import socket
from datetime import datetime
from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from seedance.cost_ledger import core
from seedance.events.tokens import check_tenant, check_token

__all__ = ["LedgerSettings", "load_budgets", "parse_budgets", "replica_name"]


class LedgerSettings(msgspec.Struct, frozen=True, kw_only=True):
    http_port: int = 9404
    #: The address ``/metrics``, ``/healthz`` and ``/readyz`` bind: this host alone unless set
    #: (compose and the k8s manifests set 0.0.0.0, where Prometheus and the probes reach it).
    http_host: str = "127.0.0.1"
    #: This replica's name (its consumer is ``ledger-in-<replica>``); the host name if empty.
    replica: str = ""
    #: Messages per fetch from the merged input stream.
    batch: int = 1000
    #: A price book file (TOML, see core/default_price_book.toml); the bundled book if empty.
    price_book: str = ""
    #: The checkpoint's KV key (``checkpoint.<state_key>``), shared by the replicas.
    state_key: str = "default"
    #: Without a checkpoint: replay the whole retained input stream (True) or start after it.
    from_start: bool = True
    checkpoint_every_events: int = 20_000
    checkpoint_every_s: float = 5.0
    #: Charge window (also the interval of running jobs' entries) and allowed lateness.
    window_s: int = 300
    lateness_s: int = 60
    #: Closed windows kept open to late facts; older ones are sealed (bounds the checkpoint).
    retention_windows: int = 288
    #: How long the telemetry may be silent on the server's clock before slicing inputs move
    #: the ledger's clock, to their time less this (``LedgerReplica.clock_ms``).
    source_skew_s: int = 900
    #: How far an input's ``at`` may lead the stream timestamp of its message (the server's
    #: clock) before it is dead-lettered: no input moves the ledger's clock past the server's
    #: time by more. A replay in virtual time ahead of the wall clock (the demo) sets more.
    max_ahead_s: Annotated[int, msgspec.Meta(ge=0)] = 300
    #: The same bound for a node's own facts (samples, inventory, pod shares), stamped by the
    #: node's clock a moment before the server gets them: a few seconds. A replay whose
    #: virtual time runs ahead of the wall clock (the demo's closing batch) sets more.
    telemetry_ahead_s: Annotated[int, msgspec.Meta(ge=0)] = 10
    #: A budgets file (YAML, see ``parse_budgets``); no guard if empty.
    budgets: str = ""
    #: Known tenants, comma-separated; inputs naming another tenant are dead-lettered. Empty:
    #: any valid tenant id.
    tenants: str = ""

    def ledger_config(self) -> core.LedgerConfig:
        return core.LedgerConfig(
            window_s=self.window_s,
            lateness_s=self.lateness_s,
            retention_windows=self.retention_windows or None,
            source_skew_s=self.source_skew_s,
        )

    def tenant_set(self) -> frozenset[str]:
        return frozenset(check_tenant(t.strip()) for t in self.tenants.split(",") if t.strip())


def replica_name(settings: LedgerSettings) -> str:
    name = settings.replica or socket.gethostname().split(".")[0]
    return check_token("replica", name)


def parse_budgets(text: str) -> list[core.Budget]:
    """Budgets from YAML::

    budgets:
      - tenant: acme
        period_start: 2026-03-01T00:00:00Z
        period_end: 2026-04-01T00:00:00Z
        amount_usd: 12000
        threshold_pct: 5        # optional, default 5
        lookback_h: 1           # optional, burn-rate lookback, default 1
    """
    doc = yaml.safe_load(text) or {}
    out = []
    for i, b in enumerate(doc.get("budgets", [])):
        try:
            start, end = (_instant(b[k]) for k in ("period_start", "period_end"))
            out.append(
                core.Budget(
                    tenant=check_tenant(str(b["tenant"])),
                    period_start_ms=start,
                    period_end_ms=end,
                    amount_usd_micro=core.micro_from_usd(str(b["amount_usd"])),
                    threshold_ppm=round(float(b.get("threshold_pct", 5)) * 10_000),
                    lookback_ms=round(float(b.get("lookback_h", 1)) * 3_600_000),
                )
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"budgets[{i}]: {exc!r}") from None
    return out


def load_budgets(path: str) -> list[core.Budget]:
    return parse_budgets(Path(path).read_text()) if path else []


def _instant(value: object) -> int:
    t = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return core.epoch_ms(t)
