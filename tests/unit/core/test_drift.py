"""The catalogue's stream configs against a server's: which fields differ and what is planted."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js import api as js_api
from structlog.testing import capture_logs

from seedance.core.drift import (
    bucket_config,
    check_drift,
    drift,
    object_store_config,
    stream_config,
)
from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS, StreamSpec, routing

SPECS = {s.name: s for s in STREAMS}


def _config(spec: StreamSpec) -> js_api.StreamConfig:
    return stream_config(spec, 1)


def test_a_stream_as_the_catalogue_makes_it_has_no_drift() -> None:
    for spec in STREAMS:
        assert drift(_config(spec), _config(spec)) is None
    for bucket in BUCKETS.values():
        assert drift(bucket_config(bucket, 1), bucket_config(bucket, 1)) is None


def test_limits_and_an_older_mirror_filter_are_drift_not_a_plant() -> None:
    plan = SPECS[routing.PLAN_STREAM]
    older = dataclasses.replace(
        plan,
        max_age_s=60.0,
        mirror=dataclasses.replace(plan.mirror, filter_subject="seedance.routing.>"),  # type: ignore[arg-type]
    )
    found = drift(_config(plan), _config(older))
    assert found is not None
    assert (found.fields, found.planted, found.mirror_changed) == (("mirror", "max_age"), (), True)


def test_another_origin_a_transform_or_a_subject_is_a_plant() -> None:
    wanted = _config(SPECS[routing.STREAM])
    transform = js_api.SubjectTransform(src="seedance.jobs.*.*.*", dest="seedance.routing.x")
    for sources, subjects, what in (
        ([js_api.StreamSource(name="SEEDANCE_JOBS")], None, "source SEEDANCE_JOBS"),
        (
            [js_api.StreamSource(name=routing.STREAM, subject_transforms=[transform])],
            None,
            f"source {routing.STREAM}",
        ),
        (None, [*(wanted.subjects or ()), "_INBOX.>"], "subject _INBOX.>"),
    ):
        actual = dataclasses.replace(wanted, sources=sources, subjects=subjects or wanted.subjects)
        found = drift(wanted, actual)
        assert found is not None
        assert [p for p in found.planted if p.startswith(what)], (what, found)


def test_a_ledger_source_with_another_filter_is_drift_not_a_plant() -> None:
    ledger = SPECS["SEEDANCE_LEDGER_IN"]
    wanted = _config(ledger)
    actual = dataclasses.replace(
        wanted, sources=[js_api.StreamSource(name="SEEDANCE_SLICING", filter_subject=">")]
    )
    found = drift(wanted, actual)
    assert found is not None
    assert (found.fields, found.planted) == (("sources",), ())


def test_every_field_of_the_config_is_compared() -> None:
    """Review-3 1c: limits, policies and flags the old comparison never read are drift."""
    wanted = _config(SPECS[routing.STREAM])
    for change in (
        {"retention": js_api.RetentionPolicy.WORK_QUEUE},
        {"storage": js_api.StorageType.MEMORY},
        {"max_msgs": 1},
        {"discard": js_api.DiscardPolicy.NEW},
        {"allow_rollup_hdrs": True},
        {"deny_delete": True},
        {"deny_purge": True},
        {"sealed": True},
        {"max_msg_size": 16},
        {"no_ack": True},
    ):
        found = drift(wanted, dataclasses.replace(wanted, **change))
        assert found is not None, change
        assert (found.fields, found.planted) == (tuple(change), ()), change


def test_a_republish_or_a_stream_transform_is_a_plant() -> None:
    """Review-3 1c: a republish leaks every stored message (tenants' job specs) to a subject of
    the creator's choice; a stream-wide transform files one node's report as another's."""
    wanted = _config(SPECS["SEEDANCE_JOBS"])
    leak = js_api.RePublish(src=">", dest="_INBOX.leak.>")
    forge = js_api.SubjectTransform(src="seedance.observed.n1.>", dest="seedance.observed.n2.>")
    for change, what in (
        ({"republish": leak}, "republish"),
        ({"subject_transform": forge}, "subject_transform"),
    ):
        found = drift(wanted, dataclasses.replace(wanted, **change))
        assert found is not None
        assert found.fields == (what,)
        assert [p for p in found.planted if p.startswith(what)], found


def test_what_the_server_fills_is_not_drift() -> None:
    """A config as the server returns it (limits as -1, its metadata, a default duplicate
    window, placement) against the catalogue's: no drift (a stream that leaves its message
    size to the server's max_payload; SEEDANCE_JOBS bounds it)."""
    wanted = _config(SPECS["SEEDANCE_COSTS"])
    served = dataclasses.replace(
        wanted,
        max_consumers=-1,
        max_msgs=-1,
        max_msg_size=-1,
        compression=js_api.StoreCompression.NONE,
        allow_direct=False,
        mirror_direct=False,
        metadata={"_nats.ver": "2.15.1"},
        consumer_limits=js_api.StreamConsumerLimits(),
        placement=js_api.Placement(cluster="c1"),
    )
    assert drift(wanted, served) is None


def test_a_bucket_the_nats_cli_made_with_defaults_is_drift_never_a_plant() -> None:
    """``nats kv add`` (nats.go's defaults: direct gets on, no TTL, other limits) before the
    service: drift that provision converges, never a refusal."""
    for spec in BUCKETS.values():
        wanted = bucket_config(spec, 1)
        cli = dataclasses.replace(
            wanted,
            allow_direct=True,
            max_age=0.0,
            duplicate_window=120.0,
            max_msgs_per_subject=1,
            allow_msg_ttl=False,
            compression=js_api.StoreCompression.NONE,
        )
        found = drift(wanted, cli)
        if found is not None:
            assert found.planted == (), (spec.name, found)


def test_a_released_catalogue_s_ledger_source_is_drift_not_a_plant() -> None:
    """Review-3 4: SEEDANCE_LEDGER_IN as 72244b73..570e0d8b created it sourced tenants' jobs;
    an upgraded fleet starts on it (drift) and provision removes it. Another filter on that
    origin is still a plant."""
    wanted = _config(SPECS["SEEDANCE_LEDGER_IN"])
    old = js_api.StreamSource(name="SEEDANCE_JOBS", filter_subject="seedance.jobs.>")
    found = drift(wanted, dataclasses.replace(wanted, sources=[old, *(wanted.sources or ())]))
    assert found is not None
    assert (found.fields, found.planted) == (("sources",), ())
    wider = js_api.StreamSource(name="SEEDANCE_JOBS", filter_subject=">")
    found = drift(wanted, dataclasses.replace(wanted, sources=[wider, *(wanted.sources or ())]))
    assert found is not None
    assert found.planted


def test_buckets_refuse_rollups_and_stores_keep_them() -> None:
    """review-grants F1: ``Nats-Rollup: all`` to a key its writer owns purged the whole bucket
    (others' leases and policy). Stores keep rollups: nats-py's meta put needs them and each
    store has one writer."""
    assert [b for b in BUCKETS.values() if bucket_config(b, 1).allow_rollup_hdrs] == []
    assert all(object_store_config(o, 1).allow_rollup_hdrs for o in OBJECT_STORES.values())


@pytest.mark.parametrize("name", sorted(BUCKETS))
def test_a_bucket_made_with_rollups_is_exposed_drift_reported_at_error(name: str) -> None:
    """A bucket an older release made (nats-py's rollups on): drift provision converges, never
    a refusal, but its line is an error naming what a writer can do."""
    wanted = bucket_config(BUCKETS[name], 1)
    old = dataclasses.replace(wanted, allow_rollup_hdrs=True)
    found = drift(wanted, old)
    assert found is not None
    assert (found.fields, found.planted) == (("allow_rollup_hdrs",), ())
    assert [x for x in found.exposed if x.startswith("allow_rollup_hdrs:")], found
    with capture_logs() as logs:
        check_drift(wanted, old)
    assert [(e["log_level"], e["exposed"]) for e in logs] == [("error", list(found.exposed))]


def test_a_flag_off_that_the_catalogue_has_on_exposes_nothing() -> None:
    """A store's stream with rollups off is drift (nats-py's meta put fails) but opens
    nothing: a plain warning."""
    for spec in OBJECT_STORES.values():
        wanted = object_store_config(spec, 1)
        found = drift(wanted, dataclasses.replace(wanted, allow_rollup_hdrs=False))
        assert found is not None
        assert (found.fields, found.exposed) == (("allow_rollup_hdrs",), ())
        with capture_logs() as logs:
            check_drift(wanted, dataclasses.replace(wanted, allow_rollup_hdrs=False))
        assert [e["log_level"] for e in logs] == ["warning"]


def test_a_planted_mirror_on_a_stream_that_is_no_mirror_names_the_operator() -> None:
    """Only a deletion undoes it and the provisioner may delete only the catalogue's mirrors:
    the refusal sends the operator to delete it, not to a provision that cannot; a planted
    source (an update undoes it) still names provision."""
    from seedance.core.errors import StartRefused

    wanted = _config(SPECS["SEEDANCE_JOBS"])
    mirrored = dataclasses.replace(
        wanted, subjects=None, mirror=js_api.StreamSource(name="SEEDANCE_COSTS")
    )
    with capture_logs(), pytest.raises(StartRefused) as refused:
        check_drift(wanted, mirrored)
    assert "the operator (`admin`) must delete it" in str(refused.value)
    assert "nats stream rm SEEDANCE_JOBS" in str(refused.value)
    sourced = dataclasses.replace(wanted, sources=[js_api.StreamSource(name="SEEDANCE_COSTS")])
    with capture_logs(), pytest.raises(StartRefused) as refused:
        check_drift(wanted, sourced)
    assert "run `seedance admin provision`" in str(refused.value)
    assert "must delete" not in str(refused.value)
