"""A small synthetic fleet day for report tests: tenants, whole/shared/MIG jobs, samples."""

from __future__ import annotations

import random

from seedance.cost_ledger.core import GpuAllocation, GpuSample, JobEnded, NodeInfo

HOUR_MS = 3_600_000
DAY0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def fleet_day(seed: int = 3, hours: int = 24) -> tuple[list, int]:
    """Events of ``hours`` hours on 6 nodes (H100, A100, T4) and the instant to close them."""
    rng = random.Random(seed)
    nodes = [
        ("h100-a", "H100", 8, "reserved"),
        ("h100-b", "H100", 8, "on_demand"),
        ("a100-a", "A100", 8, "on_prem"),
        ("a100-b", "A100", 8, "spot"),
        ("t4-a", "T4", 4, "on_demand"),
        ("t4-b", "T4", 4, "on_prem"),
        ("g2-a", "G2", 8, "on_demand"),  # the trace's anonymised model: assumed price and peak
    ]
    tenants = ["search", "ads-ranking", "llm-serving", "research"]
    events: list = [
        NodeInfo(
            event_id=f"node:{n}", node=n, gpu_model=m, gpu_count=c, at_ms=DAY0_MS, pricing_tier=t
        )
        for n, m, c, t in nodes
    ]
    end_ms = DAY0_MS + hours * HOUR_MS
    j = 0
    for name, model, count, _ in nodes:
        t = DAY0_MS
        for g in range(count):
            t = DAY0_MS + rng.randrange(0, 3 * HOUR_MS)
            while t < end_ms - HOUR_MS:
                tenant = rng.choice(tenants)
                duration = rng.randrange(HOUR_MS // 2, 6 * HOUR_MS)
                kind = "whole"
                extra: dict = {}
                if model == "T4" and rng.random() < 0.6:
                    kind, extra = "shared", {"gpu_milli": rng.choice([250, 500, 750])}
                elif model in ("A100", "H100") and rng.random() < 0.25:
                    kind, extra = "mig", {"mig_profile": rng.choice(["3g.40gb", "4g.40gb"])}
                events.append(
                    GpuAllocation(
                        event_id=f"place:{j}",
                        job_id=f"job-{j}",
                        tenant=tenant,
                        node=name,
                        gpu_model=model,
                        gpu_indices=(g,),
                        start_ms=t,
                        kind=kind,
                        **extra,
                    )
                )
                events.append(JobEnded(event_id=f"end:{j}", job_id=f"job-{j}", end_ms=t + duration))
                j += 1
                t += duration + rng.randrange(0, 2 * HOUR_MS)
        for g in range(count):
            for s in range(hours * 4):
                at = DAY0_MS + s * HOUR_MS // 4 + rng.randrange(0, 60_000)
                diurnal = 0.35 + 0.3 * abs(((s / 4) % 24) - 12) / 12
                events.append(
                    GpuSample(
                        event_id=f"sample:{name}:{g}:{s}",
                        node=name,
                        gpu_index=g,
                        at_ms=at,
                        activity=round(min(1.0, max(0.0, rng.gauss(diurnal, 0.15))), 3),
                        energy_mj=rng.randrange(150_000_000, 500_000_000),
                    )
                )
    return events, end_ms
