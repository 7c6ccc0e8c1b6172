"""Contract tests: golden messages still decode, schemas match, the evolution rule holds."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

import seedance.events
from seedance.events import DecodeError, decode, encode, event_types, new_event_id, schemas
from seedance.events.allocation import MESSAGE_TYPES
from seedance.events.jobs import JobSubmitted, ResourceRequest
from seedance.events.subjects import (
    CONSUMERS,
    STREAMS,
    TRUSTED_FAMILIES,
    StreamSpec,
    SubjectShapeError,
    costs,
    jobs,
    owner_of,
    slicing,
    subject_tenant,
)
from seedance.events.tokens import InvalidToken

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / "proto" / "golden"
#: Events, and the request/reply messages (never stored in a stream, versioned all the same).
TYPES = {t.__struct_config__.tag: t for t in (*event_types(), *MESSAGE_TYPES)}
TAGS = list(TYPES)


@pytest.mark.parametrize("tag", TAGS)
def test_every_event_version_has_a_golden_message_that_decodes(tag: str) -> None:
    raw = (GOLDEN / f"{tag}.json").read_bytes()
    event = decode(raw, TYPES[tag])
    assert event.__struct_config__.tag == tag
    assert decode(msgspec.json.encode(event), TYPES[tag]) == event
    # Every field of the golden message is a field of the type (none silently ignored).
    assert set(json.loads(raw)) - {"type"} <= set(type(event).__struct_fields__)


def test_no_golden_message_without_an_event_type() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(TAGS)


def test_unknown_fields_are_tolerated() -> None:
    raw = json.loads((GOLDEN / "job.submitted.v1.json").read_text())
    raw["added_in_a_later_release"] = {"anything": [1, 2]}
    event = decode(json.dumps(raw).encode())
    assert isinstance(event, JobSubmitted)


def test_a_new_required_field_breaks_old_messages() -> None:
    """Why the rule says 'a new field gets a default': without one, old messages stop decoding."""

    class JobSubmittedWithRequiredField(JobSubmitted, frozen=True, kw_only=True, tag="x.v1"):
        cost_center: str

    raw = json.loads((GOLDEN / "job.submitted.v1.json").read_text())
    raw["type"] = "x.v1"
    with pytest.raises(msgspec.ValidationError, match="cost_center"):
        msgspec.json.decode(json.dumps(raw).encode(), type=JobSubmittedWithRequiredField)


def test_schemas_match_the_code() -> None:
    existing = {p.name: p.read_text() for p in (REPO / "proto" / "schemas").glob("*.json")}
    assert schemas.drift(existing) == [], "schemas out of date: run `make schemas`"
    assert set(existing) == {f"{tag}.json" for tag in TAGS}


def test_schema_drift_names_a_stale_a_missing_and_an_orphan_file() -> None:
    files = schemas.render()
    stale, missing = TAGS[0] + ".json", TAGS[1] + ".json"
    existing = {**files, stale: files[stale] + " ", "job.gone.v0.json": "{}"}
    del existing[missing]
    assert schemas.drift(existing) == [*sorted([stale, missing]), "job.gone.v0.json"]


def test_decode_errors_name_the_field() -> None:
    raw = json.loads((GOLDEN / "job.submitted.v1.json").read_text())
    raw["request"]["gpus"] = "two"
    with pytest.raises(DecodeError, match=r"\$\.request\.gpus"):
        decode(json.dumps(raw).encode())


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"gpus": 2, "gpu_milli": 500}, "shared-GPU request takes one GPU"),
        ({"gpus": 2, "mig_profile": "1g.10gb"}, "MIG request takes one instance"),
        ({"gpus": -1}, r"\$\.request\.gpus"),
        ({"gpu_milli": 1001}, r"\$\.request\.gpu_milli"),
    ],
)
def test_invalid_requests_are_refused(request_fields: dict[str, int], message: str) -> None:
    raw = json.loads((GOLDEN / "job.submitted.v1.json").read_text())
    raw["request"] = request_fields
    with pytest.raises(DecodeError, match=message):
        decode(json.dumps(raw).encode())


@pytest.mark.parametrize("tenant", ["a.b", "a*", ">", "", "A", "x" * 64, "has space"])
def test_tenants_that_would_break_subjects_are_refused(tenant: str) -> None:
    raw = json.loads((GOLDEN / "job.submitted.v1.json").read_text())
    raw["tenant"] = tenant
    with pytest.raises(DecodeError, match=r"\$\.tenant"):
        decode(json.dumps(raw).encode())
    with pytest.raises(InvalidToken, match="tenant"):
        jobs.subject(tenant, "submitted")


def test_subject_tenant_and_node_subjects_cannot_collide() -> None:
    assert subject_tenant(costs.subject("acme", "entry")) == "acme"
    assert subject_tenant(jobs.subject("globex", "finished")) == "globex"
    assert subject_tenant("seedance.telemetry.node-1.sample") is None
    # A node called "placement" must not look like a tenant's placement subject.
    plan = slicing.mig_plan("placement")
    assert subject_tenant(plan) is None
    assert len(plan.split(".")) != len(slicing.PLACEMENTS.split("."))
    # A pool's capacity plans belong to no tenant, and only they: a tenant named "pool" keeps
    # its own subjects, and another kind under a pool is refused.
    assert owner_of(slicing.capacity("placement"), None) is None
    assert subject_tenant(slicing.subject("pool", "placement")) == "pool"
    with pytest.raises(SubjectShapeError, match="5 tokens"):
        owner_of("seedance.slicing.pool.p1.placement", None)


def _covers(pattern: str, subject: str) -> bool:
    """Whether the NATS pattern ``pattern`` takes in every subject the pattern ``subject`` does."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or s[i] == ">" or token not in ("*", s[i]):
            return False
    return len(p) == len(s)


def _carried(stream: StreamSpec) -> set[str]:
    """The subjects a stream with none of its own holds: its sources' filters, or what its
    mirror's filter takes of its origin's (a mirror of a sourced stream, transitively)."""
    if stream.mirror is None:
        return {src.filter_subject for src in stream.sources}
    origin = next(s for s in STREAMS if s.name == stream.mirror.stream)
    if origin.subjects:
        return {stream.mirror.filter_subject}
    return {f for f in _carried(origin) if _covers(stream.mirror.filter_subject, f)}


def test_subjects_and_catalogue() -> None:
    assert costs.subject("acme", "entry") == "seedance.costs.acme.entry"
    assert jobs.tenant_wildcard("acme") == "seedance.jobs.acme.*"
    assert "seedance.jobs.acme.finished" in jobs.tenant_subjects("acme")
    assert all(len(s.split(".")) == 4 for s in jobs.tenant_subjects("acme"))
    stream_names = {s.name for s in STREAMS}
    for spec in CONSUMERS.values():
        assert spec.stream in stream_names, spec
        stream = next(s for s in STREAMS if s.name == spec.stream)
        if not stream.subjects:  # a stream sourced from others, or a mirror of one
            copied = (stream.mirror,) if stream.mirror else stream.sources
            assert copied, stream
            # Its readers take it all (the ledger), or filter on what its sources bring in
            # (the autosize loop reads the decisions and pod shares, not the fleet's samples).
            assert _carried(stream), stream
            assert set(spec.filter_subjects) <= _carried(stream), spec
            assert {src.stream for src in copied} <= stream_names
            continue
        roots = [s.removesuffix(">") for s in stream.subjects]
        assert all(any(f.startswith(r) for r in roots) for f in spec.filter_subjects), spec


def test_the_ledger_reads_no_tenant_event() -> None:
    """Its merged input holds trusted facts only (the slicer's, the collector's)."""
    (ledger_in,) = (s for s in STREAMS if s.name == "SEEDANCE_LEDGER_IN")
    for src in ledger_in.sources:
        assert src.filter_subject.split(".")[1] in TRUSTED_FAMILIES, src


@pytest.mark.parametrize(
    ("subject", "why"),
    [
        ("seedance.jobs.globex.finished.x", "5 tokens"),
        ("seedance.jobs.globex", "3 tokens"),
        ("seedance.jobs.globex.exploded", "not a kind"),
        ("seedance.jobs.Globex.finished", "not a valid tenant"),
        ("seedance.costs.acme.entry.more", "5 tokens"),
    ],
)
def test_tenant_subjects_of_another_shape_are_refused(subject: str, why: str) -> None:
    with pytest.raises(SubjectShapeError, match=why.split()[-1]):
        owner_of(subject, "globex")
    assert subject_tenant(subject) is None


def test_the_payload_tenant_must_be_the_subjects() -> None:
    assert owner_of(jobs.subject("acme", "finished"), "acme") == "acme"
    with pytest.raises(SubjectShapeError, match="event says tenant 'acme'"):
        owner_of(jobs.subject("globex", "finished"), "acme")
    assert owner_of("seedance.telemetry.node-1.sample", None) is None
    assert owner_of(slicing.mig_plan("n1"), None) is None


def test_a_kind_outside_the_family_is_not_built() -> None:
    with pytest.raises(SubjectShapeError, match="not a kind"):
        jobs.subject("acme", "finished.x")


def test_a_naive_datetime_is_refused_at_decode() -> None:
    raw = json.loads((GOLDEN / "job.finished.v1.json").read_text())
    raw["at"] = "2026-01-01T00:00:00"
    with pytest.raises(DecodeError, match="timezone"):
        decode(json.dumps(raw).encode())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("priority",), 2**63),
        (("priority",), 2**31),
        (("request", "gpus"), 2**63),
        (("request", "gang_size"), 10**6),
        (("request", "memory_mib"), 2**62),
        (("expected_duration_s",), 1e12),
        (("restart_s",), -1.0),
        (("restart_s",), 1e9),
        (("movable",), "yes"),
        (("request", "mig_profile"), "x" * 100),
        (("labels",), {f"k{i}": "v" for i in range(100)}),
    ],
)
def test_requests_outside_the_declared_bounds_are_refused(
    path: tuple[str, ...], value: object
) -> None:
    raw = json.loads((GOLDEN / "job.submitted.v1.json").read_text())
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(DecodeError, match=r"\$\." + r"\.".join(path)):
        decode(json.dumps(raw).encode())


def test_event_ids_are_uuid7_and_time_ordered() -> None:
    ids = [new_event_id(unix_ms=1_700_000_000_000 + i) for i in range(100)]
    assert ids == sorted(ids)
    assert all(i[14] == "7" for i in ids)
    assert len(set(ids)) == 100


def test_an_event_id_takes_its_time_from_the_event() -> None:
    at = datetime(2026, 3, 4, 5, 6, 7, 890_000, tzinfo=UTC)
    assert uuid.UUID(new_event_id(at=at)).int >> 80 == int(at.timestamp() * 1000)
    assert uuid.UUID(new_event_id()).int >> 80 == 0  # no time given: none read


def test_round_trip_keeps_every_field() -> None:
    ev = JobSubmitted(
        id=new_event_id(),
        at=datetime(2026, 1, 1, tzinfo=UTC),
        job_id="j",
        tenant="acme",
        request=ResourceRequest(gpus=1, gpu_milli=250, gpu_models=["T4"]),
        labels={"team": "search"},
    )
    assert decode(encode(ev)) == ev


def test_public_surface_is_pinned() -> None:
    assert sorted(seedance.events.__all__) == [
        "DecodeError", "Event", "EventId", "decode", "derived_event_id", "encode",
        "event_types", "new_event_id",
    ]  # fmt: skip


def test_a_stored_v1_cost_entry_reads_as_v2_with_its_exact_quantities() -> None:
    """cost.entry.v2 retired v1's float twins; a reader of a stream that still holds v1 entries
    sees them as v2, from their exact fields or, in the earliest entries, from the floats."""
    from seedance.events.cost import CostEntry, CostEntryV1, current

    old = decode((GOLDEN / "cost.entry.v1.json").read_bytes())
    assert isinstance(old, CostEntryV1)
    new = current(old)
    assert isinstance(new, CostEntry)
    assert new.id == old.id
    assert new.gpu_hours_micro == 2_000_000  # the golden v1 has only the float 2.0
    assert new.cost_micro_usd == old.cost_micro_usd
    assert "gpu_hours" not in CostEntry.__struct_fields__
    assert "energy_j" not in CostEntry.__struct_fields__


def test_the_schedulers_share_reader_starts_at_its_creation() -> None:
    """Share changes are commands to the scheduler: the first leader after the upgrade that
    added `slicer-shares` must not apply the 30 days of them SEEDANCE_SLICING keeps."""
    assert CONSUMERS["slicer-shares"].deliver_new
    assert not CONSUMERS["slicer-jobs"].deliver_new  # the job stream is state: read it all
