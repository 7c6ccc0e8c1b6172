"""The energy plausibility rule: a node cannot bill its tenants more energy than a GPU draws.

The energy billed is each GPU's NVML counter (mJ since the driver was loaded) differenced
between its readings, and a node's own credential publishes it. So each counter (``node/gpu``)
has a token bucket, ``(t_ms, credit_mJ)``, set at its last reading: at a reading at ``at`` the
counter may rise over its last reading by the credit plus ``MAX_GPU_POWER_W`` x (``at`` -
``t_ms``); a rise above that is refused whole (``implausible_energy``, never clamped, nothing
changes), and what is left after the rise is kept, capped at ``CREDIT_CAP_MJ``
(``ENERGY_SLACK_S`` of that power). A reset (the counter went back) bills nothing and adds no
credit beyond the time's. So over any span of ``s`` seconds a counter bills at most
``MAX_GPU_POWER_W x s`` + the cap, however often its node publishes or resets it, and what a
GPU read as idle banks is at most the cap.

The cap applies to what a reading leaves, not to the time until the next one: a counter not
read for a while (a telemetry outage, a GPU whose activity the collector could not read, so
its sample was skipped) may rise by 2 kW x that time, what it could have drawn. A bucket
capped across a gap would refuse every later reading of an honest GPU after any gap longer
than about a minute (its rise only grows, the credit not), and a refused batch is refused for
all its node's GPUs: the node's billing would stop for good. And so a refused reading is
never refused for ever: the allowance grows at 2 kW, an honest counter's rise more slowly.

Why a bucket and not a bound since the counter's first reading: with an anchor that restarts at
each reset, the slack came back every time (a node alternating 0 and 122 kJ billed 61 kW at
one batch a second), and headroom banked while idle could be spent at once (30 days at 100 W:
one reading 4.92 GJ higher was accepted). Why a cap of 60 s: a reading's value may be older than
its batch (the NVML collector reads the counter every ``COSTLY_INTERVAL_S``, 30 s, and carries
it in the batches between, so the counter stands still and then rises by 30 s of energy in one
second: 42 kJ at 1.4 kW), and a node's clock may step by up to ``telemetry_ahead_s`` (10 s): a
GPU drawing at most 2 kW whose readings are up to 60 s older than their batches is never
refused.

A counter with a last reading but no bucket comes from a checkpoint written before the buckets
were kept: its bucket is taken as full at its node's last energy time (the latest its last
reading can be). Replicas restored from different such checkpoints then decide alike wherever
the replayed one's bucket is full at that time too, as an honest GPU's is (its readings leave
the cap); a reading near the bound may still be decided differently (the CHANGELOG's upgrade
note: start every new replica from the one latest checkpoint). What it allows, once per counter
after the upgrade: 120 kJ plus 2 kW since its node's last energy reading. What it refuses: a
counter whose last reading is older than its node's (a GPU the collector skipped, having no
activity to report) may rise by more; its node's batches are refused until the allowance has
caught up, (rise - allowance) / (2 kW - its power): about 30 min for a 700 W GPU last read an
hour before. Taking it as full at an earlier time would let any node bill that much more at
the upgrade; re-basing such a counter unbilled instead made two replicas restored from
different checkpoints decide one reading differently (refused by the one whose bucket was
replayed, re-based by the other).

Pure: what a reading decides is a function of the state the stream's prefix left (the last
reading, the node's last energy time and the bucket), shared by the replica's step and
``recompute``'s ``ledger_inputs``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "CREDIT_CAP_MJ",
    "ENERGY_SLACK_S",
    "MAX_GPU_POWER_W",
    "Credit",
    "allowance",
    "energy_credits",
]

#: The most power one GPU is taken to draw, W: the largest GPUs' board power today is
#: 1,000-1,400 W (NVIDIA B200 1,000 W, GB200 up to 1,200 W per GPU, GB300 and AMD MI355X
#: 1,400 W); 2 kW leaves 43 % over the largest for power excursions.
MAX_GPU_POWER_W = 2_000
#: The most credit a reading leaves a counter, in seconds of ``MAX_GPU_POWER_W`` (the module's
#: docstring: a carried 30-s read and a 10-s clock step fit).
ENERGY_SLACK_S = 60
#: ... in mJ (W x s x 1000): 120 kJ.
CREDIT_CAP_MJ = MAX_GPU_POWER_W * ENERGY_SLACK_S * 1000
#: A counter's bucket: (time ms of its last reading, credit mJ left then, at most the cap).
Credit = tuple[int, int]


def allowance(bucket: Credit | None, at: int, node_at: int | None) -> int:
    """How much (mJ) a counter with ``bucket`` may rise over its last reading at ``at`` (ms):
    its credit plus ``MAX_GPU_POWER_W`` since its bucket's time. No bucket (a checkpoint from
    before them): full at ``node_at``, its node's last energy time (else at ``at``)."""
    t0, credit = bucket or ((at if node_at is None else node_at), CREDIT_CAP_MJ)
    return credit + MAX_GPU_POWER_W * max(0, at - t0)  # W x ms = mJ


def energy_credits(
    node: str,
    energy: Mapping[str, int],
    last_mj: Mapping[str, int],
    last_at: Mapping[str, int],
    credits: Mapping[str, Credit],
    at: int,
) -> dict[str, Credit]:
    """The buckets to keep once a batch of ``node`` at ``at`` whose counters read ``energy``
    (what ``facts_of`` returned: every rise billed fits its allowance) is applied, before
    ``last_mj`` / ``last_at`` take its readings: each counter read, at ``at``, with what its
    rise left of its allowance, capped (a first reading: full)."""
    node_at = last_at.get(node)
    out: dict[str, Credit] = {}
    for k, v in energy.items():
        last = last_mj.get(k)
        if last is None:
            out[k] = (at, CREDIT_CAP_MJ)
            continue
        left = allowance(credits.get(k), at, node_at) - max(0, v - last)
        out[k] = (at, min(CREDIT_CAP_MJ, left))
    return out
