"""The job streams' layout holds what docs/security.md argues ("What a tenant can still do"):
the tenants' requests and the observers' events in streams of their own, the slicer's input
sourcing both, taking every copy, and bounded above what both may hold plus an older
SEEDANCE_JOBS' content, so that no tenant can make it refuse or evict an observer's event."""

from __future__ import annotations

from seedance.events.subjects import CONSUMERS, STREAMS, StreamSource, jobs, observed

_SPECS = {s.name: s for s in STREAMS}
#: What SEEDANCE_JOBS may still hold from before the split (its former bound).
_PRE_SPLIT_BYTES = 512 * 1024**2


def test_requests_and_observed_events_land_in_streams_of_their_own() -> None:
    assert _SPECS[jobs.STREAM].subjects == (jobs.ALL,)
    assert _SPECS[observed.STREAM].subjects == (observed.ALL,)
    assert _SPECS[jobs.STREAM].discard_new  # full, it refuses: it never evicts a request
    assert not _SPECS[observed.STREAM].discard_new  # no tenant writes it


def test_the_slicers_input_sources_both_and_takes_every_copy() -> None:
    merged = _SPECS[jobs.IN_STREAM]
    assert merged.subjects == ()  # nothing publishes into it
    assert set(merged.sources) == {
        StreamSource(jobs.STREAM, jobs.ALL),
        StreamSource(observed.STREAM, observed.ALL),
    }
    assert not merged.discard_new
    assert CONSUMERS["slicer-jobs"].stream == jobs.IN_STREAM


def test_the_slicers_input_is_bounded_above_what_its_origins_can_hold() -> None:
    merged, req, obs = (_SPECS[n] for n in (jobs.IN_STREAM, jobs.STREAM, observed.STREAM))
    assert merged.max_bytes >= req.max_bytes + obs.max_bytes + _PRE_SPLIT_BYTES
    # the same retention: what it received in one window, its origins still hold
    assert merged.max_age_s == req.max_age_s == obs.max_age_s


def test_the_origins_come_before_the_stream_that_sources_them() -> None:
    """A fresh deployment creates the merged stream with its origins already there (services
    and provision create in the catalogue's order)."""
    names = [s.name for s in STREAMS]
    assert max(names.index(jobs.STREAM), names.index(observed.STREAM)) < names.index(jobs.IN_STREAM)
