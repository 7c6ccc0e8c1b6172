"""Issue 27's classes for `make chaos-tenants`: a node agent speaking for another node, and a
tenant's claim-skew games. Kept apart from ``seedance.bench.chaos_hostile`` (issue 13's
classes) so each family of attacks is one module.

- ``node_hostile``: what a compromised GPU node tries with its own credentials
  (``node-<ROGUE_NODE>``, one identity per node): an honest node's inventory relabelled
  ``H100`` on the honest node's subject (the server refuses it) and on its own subject naming
  the honest node (the slicer and the ledger dead-letter it, ``subject_mismatch``), a sample
  and an inventory of its own dated 290 s ahead (``future_time``), and a sample naming the
  honest node. None may change an honest placement or bill.
- ``claim_skew_hostile``: the hostile tenant's submits claimed 4.9 s ahead and finishes 4.9 s
  back, and the finish of a running job back-dated past its own submit; once a lever on the
  decisions' times within a 5 s "skew", now claims move nothing.

Builds wire bytes only; the driver (``seedance.bench.chaos_tenants``) sends them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from seedance.bench.chaos_hostile import HOSTILE, Hostile
from seedance.events import derived_event_id, encode
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.subjects import jobs, telemetry
from seedance.events.telemetry import GpuSample, GpuSampleBatch, NodeInventory

__all__ = ["ROGUE_NODE", "claim_skew_hostile", "node_hostile"]

#: The compromised node: it has its own credentials and no inventory in the fleet.
ROGUE_NODE = "rogue-node"


def _id(seed: int, *parts: object) -> str:
    return derived_event_id(f"chaos-node:{seed}:" + ":".join(map(str, parts)), "replay")


def node_hostile(seed: int, inventories: list[NodeInventory]) -> list[Hostile]:
    """What node ``ROGUE_NODE`` tries against the honest nodes ``inventories``."""
    now = datetime.now(UTC)
    out: list[Hostile] = []
    for i, victim in enumerate(inventories[:3]):
        gpus = [msgspec.structs.replace(g, model="H100") for g in victim.gpus]
        forged = msgspec.structs.replace(victim, id=_id(seed, "inv", i), at=now, gpus=gpus)
        out += [
            # with the shared node user this once repriced everyone: refused by the server
            Hostile("node_other_subject", telemetry.inventory(victim.node), encode(forged)),
            # on its own subject, naming the victim: dead-lettered by the slicer and the ledger
            Hostile("node_names_another", telemetry.inventory(ROGUE_NODE), encode(forged)),
            Hostile(
                "node_sample_for_another",
                telemetry.sample(ROGUE_NODE),
                encode(
                    GpuSampleBatch(
                        id=_id(seed, "s", i),
                        at=now,
                        node=victim.node,
                        gpus=[GpuSample(index=0, sm_active=1.0)],
                    )
                ),
            ),
        ]
    ahead = now + timedelta(seconds=290)
    own = msgspec.structs.replace(
        inventories[0], id=_id(seed, "own"), at=ahead, node=ROGUE_NODE
    ) if inventories else None  # fmt: skip
    if own is not None:
        out.append(Hostile("node_future_inventory", telemetry.inventory(ROGUE_NODE), encode(own)))
    out.append(
        Hostile(
            "node_future_sample",
            telemetry.sample(ROGUE_NODE),
            encode(
                GpuSampleBatch(
                    id=_id(seed, "future"),
                    at=ahead,
                    node=ROGUE_NODE,
                    gpus=[GpuSample(index=0, sm_active=1.0)],
                )
            ),
        )
    )
    return out


def claim_skew_hostile(seed: int) -> list[Hostile]:
    """The hostile tenant's claim-skew games (its quota is zero: its jobs only wait)."""
    now = datetime.now(UTC)
    m = HOSTILE
    sub, fin = jobs.subject(m, "submitted"), jobs.subject(m, "finished")
    out: list[Hostile] = []
    for i in range(3):
        job = f"skew-{i}"
        ahead = JobSubmitted(
            id=_id(seed, "sub", i), at=now + timedelta(seconds=4.9), job_id=job, tenant=m,
            request=ResourceRequest(gpus=1),
        )  # fmt: skip
        back = JobFinished(
            id=_id(seed, "fin", i), at=now - timedelta(seconds=4.9), job_id=job, tenant=m
        )
        out += [
            Hostile("skew_submit_ahead", sub, encode(ahead)),
            Hostile("skew_end_back", fin, encode(back)),
        ]
    return out
