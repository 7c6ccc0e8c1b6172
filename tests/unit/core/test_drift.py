"""The catalogue's stream configs against a server's: which fields differ and what is planted."""

from __future__ import annotations

import dataclasses

from nats.js import api as js_api

from seedance.core.drift import bucket_config, drift, stream_config
from seedance.events.subjects import BUCKETS, STREAMS, StreamSpec, routing

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
