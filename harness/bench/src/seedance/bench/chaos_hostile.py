"""What the hostile tenant of ``make chaos-tenants`` sends: every class of event that once
crashed, inflated, erased or reached another tenant's bill (issue 13), and property-based ones
from hypothesis (random tags, subjects, times, ids and sizes).

It builds bytes and subjects only; sending them, and judging what the services made of them, is
``seedance.bench.chaos_tenants``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from seedance.events import Event, derived_event_id, encode
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.subjects import jobs, observed

__all__ = ["HONEST", "HOSTILE", "Hostile", "crafted_hostile", "property_hostile"]

#: The honest tenants of the soak, and the hostile one (with its own tenant credentials).
HONEST = ("acme", "globex", "initech")
HOSTILE = "mallory"


def _id(seed: int, *parts: object) -> str:
    return derived_event_id(f"chaos-tenants:{seed}:" + ":".join(map(str, parts)), "replay")


@dataclass(frozen=True)
class Hostile:
    """One thing the hostile tenant tries: a raw publish (``subject``, ``data``), or a
    JetStream API request when ``api`` is set."""

    kind: str
    subject: str
    data: bytes
    api: bool = False


def _raw(ev: Event, **override: Any) -> bytes:
    doc = json.loads(encode(ev))
    doc.update(override)
    return json.dumps(doc).encode()


def crafted_hostile(seed: int, honest_jobs: int) -> list[Hostile]:
    """Every class of issue 13's defects, from the hostile tenant's own credentials."""
    m = HOSTILE
    now = datetime.now(UTC)
    out: list[Hostile] = []

    def submit(job: str, **kw: Any) -> JobSubmitted:
        request = kw.pop("request", ResourceRequest(gpus=1))
        return JobSubmitted(
            id=_id(seed, "h", job, len(out)), at=now, job_id=job, tenant=m, request=request, **kw
        )

    def finish(job: str, at: datetime = now, tenant: str = m) -> JobFinished:
        return JobFinished(id=_id(seed, "hf", job, len(out)), at=at, job_id=job, tenant=tenant)

    sub, fin = jobs.subject(m, "submitted"), jobs.subject(m, "finished")
    for i in range(3):
        victim = f"job-{i % max(1, honest_jobs)}"
        out += [
            # crash-looped the ledger: an `at` without a timezone
            Hostile("naive_at", sub, _raw(submit(f"naive-{i}"), at="2026-03-02T00:10:00")),
            # moved the ledger's clock forward two days and closed every window up to it
            Hostile("future_end", fin, encode(finish(f"ghost-{i}", now + timedelta(days=2)))),
            # ended, freed or billed another tenant's job: the payload names acme
            Hostile("spoofed_tenant", fin, encode(finish(victim, tenant=HONEST[0]))),
            # 5-token subjects once passed a 4-token tenant check
            Hostile("long_subject", fin + ".x", encode(finish(victim, tenant=HONEST[0]))),
            # another tenant's subject, an observer's, a decision's
            Hostile(
                "other_tenant",
                jobs.subject(HONEST[1], "finished"),
                encode(finish(victim, tenant=HONEST[1])),
            ),
            Hostile(
                "observed_subject", observed.subject(m, "submitted"), encode(submit(f"forged-{i}"))
            ),
            Hostile("decision_subject", f"seedance.slicing.{HONEST[0]}.released", b"{}"),
            # integers above 2^63 poisoned a slicer batch
            Hostile("huge_int", sub, _raw(submit(f"huge-{i}"), request={"gpus": 2**64})),
            Hostile("huge_priority", sub, _raw(submit(f"prio-{i}"), priority=2**63)),
            # a priority at the int32 bound: capped by the quota, never evicts anyone
            Hostile("max_priority", sub, encode(submit(f"max-prio-{i}", priority=2**31 - 1))),
            # a back-dated submit once jumped the FIFO queue
            Hostile("backdated_submit", sub, _raw(submit(f"early-{i}"), at="2020-01-01T00:00:00Z")),
            # duplicates and ends of nothing: answered with job.rejected.v1
            Hostile(
                "duplicate_submit",
                sub,
                encode(submit(f"early-{i}", request=ResourceRequest(gpus=2))),
            ),
            Hostile("unknown_end", fin, encode(finish(f"never-{i}"))),
            Hostile("backdated_end", fin, encode(finish(f"early-{i}", now - timedelta(days=300)))),
            Hostile("second_end", fin, encode(finish(f"early-{i}"))),
            Hostile(
                "oversized",
                sub,
                _raw(submit(f"big-{i}"), labels={f"k{j}": "v" * 300 for j in range(100)}),
            ),
            Hostile("not_json", sub, b"\xff\x00{not json"),
            # switching off budget pauses: re-creating the slicer's pause consumer
            Hostile(
                "pause_consumer",
                "$JS.API.CONSUMER.CREATE.SEEDANCE_COSTS.slicer-pauses.seedance.costs.mallory.*",
                json.dumps(
                    {
                        "stream_name": "SEEDANCE_COSTS",
                        "config": {
                            "durable_name": "slicer-pauses",
                            "ack_policy": "explicit",
                            "filter_subject": "seedance.costs.mallory.*",
                        },
                    }
                ).encode(),
                api=True,
            ),
            Hostile("purge_jobs", "$JS.API.STREAM.PURGE.SEEDANCE_JOBS", b"{}", api=True),
        ]
    return out


def property_hostile(seed: int, n: int) -> list[Hostile]:
    """``n`` events from hypothesis: random tags, subjects, times, ids and sizes."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from seedance.events import event_types

    tags = [t.__struct_config__.tag for t in event_types()]
    token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.*>", min_size=0, max_size=12)
    subject = st.one_of(
        st.builds(lambda k: jobs.subject(HOSTILE, k), st.sampled_from(sorted(jobs.KINDS))),
        st.builds(lambda t, k: f"seedance.jobs.{HOSTILE}.{t}.{k}", token, token),
        st.builds(lambda f, t, k: f"seedance.{f}.{t}.{k}", token, token, token),
    )
    when = st.one_of(
        st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
        st.datetimes().map(lambda d: d.isoformat()),  # naive
        st.text(max_size=30),
    )
    number = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.text())
    event = st.fixed_dictionaries(
        {
            "type": st.one_of(st.sampled_from(tags), st.text(max_size=20)),
            "id": st.one_of(st.uuids().map(str), st.text(max_size=80)),
            "at": when,
            "job_id": st.one_of(st.sampled_from(["job-0", "job-1", "x"]), st.text(max_size=200)),
            "tenant": st.sampled_from([HOSTILE, *HONEST, "", "MALLORY", "a.b"]),
        },
        optional={
            "priority": number,
            "request": st.fixed_dictionaries(
                {},
                optional={
                    "gpus": number,
                    "gpu_milli": number,
                    "gang_size": number,
                    "mig_profile": st.text(max_size=40),
                    "memory_mib": number,
                },
            ),
            "reason": st.text(max_size=2000),
        },
    )
    out: list[Hostile] = []

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(subject, event)
    def collect(subj: str, doc: dict[str, Any]) -> None:
        if len(out) < n:
            out.append(Hostile("property", subj, json.dumps(doc, default=str).encode()))

    collect()
    random.Random(seed).shuffle(out)
    return out
