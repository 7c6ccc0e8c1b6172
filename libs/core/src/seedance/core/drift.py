"""A stream's configuration on the server against the catalogue's: what differs, which of it is
a planted copy, and the operator's convergence (`converge`, what `seedance admin provision`
runs).

Services create what is missing and never change an existing stream or bucket: their users hold
no ``STREAM.UPDATE`` (nats-server does not check the updater's read permissions for a stream's
``sources``/``mirror``, so an update grant let any service copy a stream it may not read into
one it may: docs/security.md). A service that finds a drifted stream reports it with
`check_drift`; only the provisioner's or an operator's credentials change one, here. This
module owns the comparison and provision's changes (the creations at the end of a run, and
the put-back after a failed step, are `seedance.core.put_back`'s); it must not create streams
for services (`Bus` does) nor know any service.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from seedance.core.errors import StartRefused
from seedance.core.logs import get_logger
from seedance.core.put_back import NO_ANSWER, Updated, create_missing, put_back
from seedance.events.subjects import STREAMS, BucketSpec, ObjectStoreSpec, StreamSpec

__all__ = [
    "HISTORICAL_SOURCES",
    "Change",
    "Drift",
    "bucket_config",
    "check_drift",
    "converge",
    "drift",
    "object_store_config",
    "stream_config",
]

log = get_logger(__name__)

PROVISION_HINT = "run `seedance admin provision` as the provisioner (or an operator)"
#: The one drift provision as the provisioner cannot undo: a stream the catalogue does not make
#: a mirror that carries one (the server refuses to update a mirror away, and the provisioner
#: may delete only the catalogue's mirrors). Its messages are the mirror's copy of another
#: stream (a mirror takes no publishes), so deleting it loses nothing that is not elsewhere.
OPERATOR_DELETE_HINT = (
    "the operator (`admin`) must delete it (`nats stream rm <stream>`: it holds only a copy "
    "of its mirror's origin), then run `seedance admin provision` again"
)

#: What to do with a stream whose update the server refused (`converge`).
REFUSED_HINT = (
    "fix what the server names (raise max_file_store for a reservation) or have the operator "
    "back the stream up and delete it (`nats stream backup`, `nats stream rm`), then run "
    "`seedance admin provision` again"
)
#: What to do with a stream holding more than a new bound (`converge`): ``held`` ``unit``
#: (bytes, messages) over ``field`` (max_bytes, max_msgs); ``purge``, how (`_PURGE`).
OVER_BOUND_HINT = (
    "it holds {held} {unit}, more than its new {field} {bound}: not applied (a full stream "
    "refusing new messages would refuse every write, one evicting its oldest would drop them); "
    "the operator purges what may go ({purge}) or raises its bound "
    "(seedance.events.stream_limits, with max_file_store), then runs `seedance admin provision` "
    "again"
)
_PURGE = "`nats stream purge {stream} --keep <n>`, after `nats stream backup {stream} <dir>`"
#: Over its message bound, a stream holds a flood (a tenant's requests: review C1), purged by
#: subject in the stream and in every stream that copies it: a copy keeps its subject, and
#: purging the origin alone lets the tenant fill it again while the first flood's copies stay
#: (two floods' copies overran SEEDANCE_JOBS: docs/security.md, "What a tenant can still do").
_PURGE_WITH_COPIES = (
    "in {stream} and its copies in {copies}, by subject: {commands}, each after `nats stream "
    "backup` and once its readers have read past it; a copy keeps its subject, so purged in "
    '{stream} alone it stays: docs/security.md, "What a tenant can still do"'
)
#: StreamConfig fields a comparison leaves out, each for its reason; every other field is
#: compared (`drift`), so a field a later nats-py adds is compared until it is listed here.
_UNCOMPARED = {
    "name": "the key the configs are matched by",
    "metadata": "the server writes its own `_nats.*` keys (version, API level)",
    "template_owner": "deprecated stream templates; the server fills it",
    "first_seq": "a creation-time starting sequence, not kept as a limit",
    "placement": "the cluster and tags an operator places a stream on",
}
#: What the server reports for a field left unset (or 0 for a limit): a wanted config that does
#: not set it compares as this.
_SERVER_DEFAULTS: dict[str, Any] = {
    "retention": "limits", "storage": "file", "discard": "old", "compression": "none",
    "max_consumers": -1, "max_msgs": -1, "max_bytes": -1, "max_msg_size": -1,
    "max_msgs_per_subject": -1, "max_age": 0.0, "num_replicas": 1,
    "subject_delete_marker_ttl": 0.0,
}  # fmt: skip
_UNLIMITED_AT_ZERO = (
    "max_consumers", "max_msgs", "max_bytes", "max_msg_size", "max_msgs_per_subject",
)  # fmt: skip
#: Fields whose difference is a planted copy (never mere drift): a republish sends every stored
#: message to subjects of its choosing (tenants' job specs to ``_INBOX.leak.>``); a stream-wide
#: subject transform renames what is stored (one node's report filed as another's).
_PLANTING = ("republish", "subject_transform")
#: Flags whose being on where the catalogue has them off opens a stream to its own writers
#: (drift, not a plant: a released catalogue had them on): what each lets a writer do.
_EXPOSING = {
    "allow_rollup_hdrs": "a writer of one subject purges the whole stream (Nats-Rollup: all)",
}
#: The fields compared, in the order a drift names them: those an older comparison read first
#: (logs and provision's output keep their order), then the rest as StreamConfig lists them.
_FIRST = (
    "subjects", "sources", "mirror", "description", "max_age", "max_bytes", "duplicate_window",
    "max_msgs_per_subject", "allow_direct", "num_replicas",
)  # fmt: skip
_COMPARED = _FIRST + tuple(
    f.name
    for f in dataclasses.fields(js_api.StreamConfig)
    if f.name not in _FIRST and f.name not in _UNCOMPARED
)

#: Sources a released catalogue declared that the current one does not (stream → (origin,
#: filter)): drift, not a plant, so that an upgraded fleet starts on what its older build
#: created (provision removes them). Every ``sources`` in the history of
#: ``seedance/events/subjects.py`` (``git log -p -- libs/events/src/seedance/events/subjects.py``):
#: SEEDANCE_LEDGER_IN sourced tenants' jobs from 72244b73 until 570e0d8b.
HISTORICAL_SOURCES: dict[str, frozenset[tuple[str, str]]] = {
    "SEEDANCE_LEDGER_IN": frozenset({("SEEDANCE_JOBS", "seedance.jobs.>")}),
}

#: The duplicate window nats-py gives a bucket and the server a store (neither sets one):
#: two minutes, or the max age if shorter.
_DEFAULT_WINDOW_S = 120.0


def _server_window(max_age_s: float) -> float:
    return min(_DEFAULT_WINDOW_S, max_age_s) if max_age_s else _DEFAULT_WINDOW_S


def _kind(stream: str) -> str:
    """``bucket``, ``store`` or ``stream``: nats-py names a bucket's stream ``KV_<name>`` and a
    store's ``OBJ_<name>``; the catalogue's own streams are ``SEEDANCE_*``."""
    if stream.startswith("KV_"):
        return "bucket"
    if stream.startswith("OBJ_"):
        return "store"
    return "stream"


def stream_config(spec: StreamSpec, replicas: int) -> js_api.StreamConfig:
    """The catalogue's stream ``spec`` as a JetStream config (what `Bus.ensure_streams` creates)."""
    return js_api.StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects) or None,
        sources=[
            js_api.StreamSource(name=src.stream, filter_subject=src.filter_subject)
            for src in spec.sources
        ]
        or None,
        mirror=(
            js_api.StreamSource(name=spec.mirror.stream, filter_subject=spec.mirror.filter_subject)
            if spec.mirror
            else None
        ),
        description=spec.description or None,
        retention=js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        max_msgs=spec.max_msgs,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_msg_size=spec.max_msg_size,
        discard=js_api.DiscardPolicy.NEW if spec.discard_new else js_api.DiscardPolicy.OLD,
        duplicate_window=spec.duplicate_window_s,
        num_replicas=replicas,
    )


def bucket_config(spec: BucketSpec, replicas: int) -> js_api.StreamConfig:
    """KV bucket ``spec``'s stream, whole, as `ensure_bucket` and `provision` create it: nats-py's
    own bucket, but without rollups.

    Why no rollups (nats-py turns them on for every bucket): the server honours a
    ``Nats-Rollup: all`` header on a data publish to any subject the publisher may write, and
    purges the whole stream. A writer granted only its own keys (the slicer its leases and
    usage keys) wiped every other key of a shared bucket: the router's planner lease (two
    leaders), the bridge's policy. No Seedance code purges a key (``KeyValue.purge`` is the
    only rollup of a bucket; ``delete`` writes a marker), so a key's writer owns that key and
    nothing more (docs/security.md)."""
    ttl = spec.ttl_s or 0.0
    return js_api.StreamConfig(
        name=f"KV_{spec.name}",
        subjects=[f"$KV.{spec.name}.>"],
        description=spec.description or None,
        retention=js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        discard=js_api.DiscardPolicy.NEW,
        max_age=ttl,
        duplicate_window=_server_window(ttl),
        max_msgs_per_subject=spec.history,
        allow_direct=spec.direct,
        allow_rollup_hdrs=False,
        allow_msg_ttl=True,
        deny_delete=True,
        num_replicas=replicas,
    )


def object_store_config(spec: ObjectStoreSpec, replicas: int) -> js_api.StreamConfig:
    """Object store ``spec``'s stream, whole, as `ensure_object_store` creates it."""
    return js_api.StreamConfig(
        name=f"OBJ_{spec.name}",
        subjects=[f"$O.{spec.name}.C.>", f"$O.{spec.name}.M.>"],
        description=spec.description or None,
        retention=js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        discard=js_api.DiscardPolicy.NEW,
        max_age=spec.ttl_s,
        max_bytes=spec.max_bytes,
        duplicate_window=_server_window(spec.ttl_s),
        allow_rollup_hdrs=True,  # nats-py's meta put rolls up; a store has one writer
        allow_direct=True,
        num_replicas=replicas,
    )


def _source_key(src: js_api.StreamSource) -> tuple[Any, ...]:
    transforms = tuple((t.src, t.dest) for t in src.subject_transforms or ())
    external = src.external.api if src.external else None
    return (src.name, src.filter_subject or None, transforms, external)


def _value(config: js_api.StreamConfig, name: str) -> Any:
    """Field ``name`` of ``config`` as the server would report it, comparable across a config
    we build and one the server returns."""
    value = getattr(config, name)
    value = getattr(value, "value", value)  # an enum, as its wire name
    if name in _UNLIMITED_AT_ZERO and value == 0:
        value = None
    if value is None and name in _SERVER_DEFAULTS:
        value = _SERVER_DEFAULTS[name]
    if name == "subjects":
        return tuple(sorted(value or ()))
    if name == "sources":
        return tuple(sorted(_source_key(s) for s in value or ()))
    if name == "mirror":
        return _source_key(value) if value else None
    if name == "description":
        return value or ""
    if name in ("max_age", "duplicate_window", "subject_delete_marker_ttl"):
        return round(float(value or 0.0), 3)  # seconds, through nanoseconds
    if name in ("republish", "subject_transform", "consumer_limits"):
        as_dict = value.as_dict() if value is not None else {}
        return tuple(sorted((k, str(v)) for k, v in as_dict.items() if v is not None)) or None
    if isinstance(value, bool) or value is None:
        return bool(value)  # a flag left unset is off
    return value


@dataclass(frozen=True)
class Drift:
    """How stream ``stream`` differs from the catalogue: ``fields`` (every compared field that
    differs), ``planted``: what the catalogue does not declare that copies data in or out (a
    source or mirror of another stream or with a subject transform, a subject of its own, a
    republish, a stream-wide subject transform), described; ``exposed``: the flags on that the
    catalogue has off and what each lets a writer do (`_EXPOSING`)."""

    stream: str
    fields: tuple[str, ...]
    planted: tuple[str, ...]
    mirror_changed: bool
    exposed: tuple[str, ...] = ()


def drift(wanted: js_api.StreamConfig, actual: js_api.StreamConfig) -> Drift | None:
    """How ``actual`` (the server's) differs from ``wanted`` (the catalogue's); None: none."""
    fields = tuple(f for f in _COMPARED if _value(wanted, f) != _value(actual, f))
    if not fields:
        return None
    planted = [f"{f} {_value(actual, f)}" for f in _PLANTING if f in fields]
    planted += [
        f"subject {s}" for s in _value(actual, "subjects") if s not in (wanted.subjects or ())
    ]
    declared = {_source_key(s) for s in wanted.sources or ()}
    if wanted.mirror:
        declared.add(_source_key(wanted.mirror))
    declared_streams = {key[0] for key in declared}
    historical = HISTORICAL_SOURCES.get(wanted.name or "", frozenset())
    for kind, src in [("source", s) for s in actual.sources or ()] + (
        [("mirror", actual.mirror)] if actual.mirror else []
    ):
        key = _source_key(src)
        # Another filter on a declared origin is an old catalogue's choice (drift, not a plant);
        # another origin, a transform (it renames subjects: a forged report) or an external
        # one is a copy the catalogue never made. A released catalogue's own source is drift.
        foreign = key[0] not in declared_streams and (key[0], key[1]) not in historical
        if foreign or key[2] or key[3]:
            planted.append(f"{kind} {src.name} (filter {src.filter_subject}, transforms {key[2]})")
    exposed = tuple(
        f"{f}: {what}"
        for f, what in _EXPOSING.items()
        if f in fields and _value(actual, f) and not _value(wanted, f)
    )
    return Drift(
        stream=wanted.name or "",
        fields=fields,
        planted=tuple(planted),
        mirror_changed="mirror" in fields,
        exposed=exposed,
    )


def check_drift(wanted: js_api.StreamConfig, actual: js_api.StreamConfig) -> None:
    """What a service does with an existing stream: nothing when it matches; a warning
    ``stream_config_drift`` (the stream, the fields) when it differs, and the service goes on
    (an old catalogue's limits or filter never stop a fleet: finding 6, a mirror that cannot be
    updated crash-looped every service), at error level when a flag is on that opens the stream
    to its own writers (``exposed``: a bucket made with rollups, before the catalogue turned
    them off); `StartRefused` naming the stream when it carries a planted copy.

    Why refuse rather than go on at error level: a planted source or mirror feeds the stream's
    readers data the catalogue never routed there (a forged plan report before the router's
    planner, tenants' job specs in the router's mirror), and a service that goes on acts on it
    and serves it. Since no service user can change a stream, only an operator (or a grant of
    an older release) could have planted it, so refusing costs an attacker's denial of service
    nothing it could not already do, and the one fix is the command the error names.
    """
    found = drift(wanted, actual)
    if found is None:
        return
    if found.planted:
        fix = (
            OPERATOR_DELETE_HINT.replace("<stream>", found.stream)
            if _operator_must_delete(wanted, found)
            else f"{PROVISION_HINT} to remove it"
        )
        log.error(
            "stream_config_drift",
            stream=found.stream,
            fields=list(found.fields),
            planted=list(found.planted),
            fix=fix,
        )
        raise StartRefused(
            f"stream {found.stream} carries what the catalogue does not declare "
            f"({'; '.join(found.planted)}): a planted copy; {fix}"
        )
    if found.exposed:
        # Loud, but the service starts: the stream's data is what the catalogue routed there;
        # what is open is its writers' reach, closed by the one command the line names.
        log.error(
            "stream_config_drift",
            stream=found.stream,
            fields=list(found.fields),
            exposed=list(found.exposed),
            fix=PROVISION_HINT,
        )
        return
    log.warning(
        "stream_config_drift", stream=found.stream, fields=list(found.fields), fix=PROVISION_HINT
    )


def _operator_must_delete(wanted: js_api.StreamConfig, found: Drift) -> bool:
    """Whether only a stream's deletion undoes ``found`` and the provisioner may not delete it:
    a mirror on a stream the catalogue does not make a mirror (a bucket's or store's too)."""
    return found.mirror_changed and wanted.mirror is None


@dataclass(frozen=True)
class Change:
    """What `converge` did to one stream: ``created``, ``updated`` or ``recreated`` (a mirror,
    rebuilt from its origin), and the fields that differed; or ``left``: a drift it may not
    undo, with ``fix``, who must and how (the catalogue is then not converged: `left`)."""

    stream: str
    action: str
    fields: tuple[str, ...] = ()
    fix: str = ""

    @property
    def left(self) -> bool:
        """Whether the stream was left as it was, for someone else to fix (``fix``)."""
        return self.action == "left"

    def __str__(self) -> str:
        what = f" ({', '.join(self.fields)})" if self.fields else ""
        why = f": {self.fix}" if self.fix else ""
        return f"{self.action}: stream {self.stream}{what}{why}"


async def converge(
    js: JetStreamContext,
    streams: list[js_api.StreamConfig],
    *,
    deletable: Collection[str] | None = None,
) -> list[Change]:
    """Make each of ``streams`` (wanted configs) so on the server: create the missing streams (a
    missing bucket or store is left to the caller: `seedance.core.kv.provision` creates it
    through nats-py, as its service does), update the drifted ones (a planted source goes with
    the update: the wanted ``sources`` replace the server's), and delete and re-create a stream
    whose mirror differs (the server refuses to update a mirror; a mirror is rebuilt from its
    origin) where this user may delete it: ``deletable`` names the streams it may (the
    provisioner's grant: the catalogue's mirrors), None every one (the operator). A bucket or
    store keeps the fields the catalogue does not compare (`_UNCOMPARED`). What changed, in
    order.

    A stream it may not delete is ``left`` (with the fix: the operator deletes it) and the
    others are converged all the same: asked anyway, the server drops the request as a
    permissions violation and the reply never comes, so one planted mirror once timed out the
    whole run, every later item (a missing bucket) not created.

    Existing streams first, then the missing ones in the catalogue's order: streams may not
    overlap, and an older stream that held subjects a new one takes (SEEDANCE_JOBS the
    requests and observed events, SEEDANCE_SLICING the MIG plans) must give them up before
    the new one can be created. Where a later step fails, `seedance.core.put_back` gives them
    back and raises its error, or `StreamlessSubjects` naming any subject it then finds with no
    stream or with more than one."""
    changes: list[Change] = []
    missing: list[js_api.StreamConfig] = []
    updated: Updated = {}
    try:
        for wanted in streams:
            step = await _converge_one(js, wanted, deletable)
            if step.change is not None:
                changes.append(step.change)
            if step.missing is not None:
                missing.append(step.missing)
            if step.updated is not None:
                updated[wanted.name or ""] = step.updated
            if step.failed is not None:
                raise step.failed
    except Exception as exc:
        # A later stream's info or update that fails (a time-out, a mirror's re-create refused)
        # after an older stream gave up its subjects would leave them no stream: put it back
        # (with the failed update's own stream, always, where it got no answer: `_Step`),
        # then raise (`StreamlessSubjects` where a subject is left with none, or with two).
        await put_back(js, updated, [], exc)
    created = await create_missing(js, missing, updated)
    return changes + [Change(new.name or "", "created") for new in created]


@dataclass(frozen=True)
class _Step:
    """What `_converge_one` did to one stream: ``change`` (None: nothing, or it is missing),
    ``missing`` (its wanted config, for `create_missing`), ``updated`` (its config before and
    the one it was given, for `put_back`: a catalogue stream whose subjects this run changed,
    or may have); ``failed``: the error of an update that got no answer, for `converge` to
    raise once it has put that stream back."""

    change: Change | None = None
    missing: js_api.StreamConfig | None = None
    updated: tuple[js_api.StreamConfig, js_api.StreamConfig] | None = None
    failed: Exception | None = None


async def _converge_one(
    js: JetStreamContext, wanted: js_api.StreamConfig, deletable: Collection[str] | None
) -> _Step:
    """`converge`'s step for one stream (`_Step`)."""
    name = wanted.name or ""
    stream = _kind(name) == "stream"
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        return _Step(missing=wanted if stream else None)
    actual = info.config
    found = drift(wanted, actual)
    if found is None:
        return _Step()
    fix = _over_new_bound(name, wanted, info, found.fields)
    if fix is not None:
        return _Step(Change(name, "left", found.fields, fix))
    # A bucket's or store's stream is never deleted here (its keys or objects may be
    # nowhere else), nor a stream this user may not delete: the operator's, by hand.
    if found.mirror_changed and (not stream or (deletable is not None and name not in deletable)):
        fix = OPERATOR_DELETE_HINT.replace("<stream>", name)
        return _Step(Change(name, "left", found.fields, f"carries a mirror; {fix}"))
    if found.mirror_changed:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
        await js.add_stream(wanted)
        return _Step(Change(name, "recreated", found.fields))
    try:
        await js.update_stream(wanted if stream else _merged(actual, wanted))
    except APIError as exc:
        # A change the server will not make in place (a retention or storage an operator
        # set by hand, a reservation past max_file_store: err_code 10047): the others are
        # converged all the same, and this one names the server's reason.
        refused = f"{exc.err_code}: {exc.description}"
        fix = f"the server refused the update ({refused}); {REFUSED_HINT}"
        log.error("stream_update_refused", stream=name, fields=list(found.fields), fix=fix)
        return _Step(Change(name, "left", found.fields, fix))
    except NO_ANSWER as exc:
        # No answer (a time-out, a dropped connection): the server may have made the change,
        # its subjects given up, or make it later (it answers infos from another queue, so a
        # read-back can precede it: review 2): always put back, which queues behind it and
        # changes nothing where it is never made; `put_back` then checks the subjects' holders.
        log.warning("stream_call_failed", stream=name, error=repr(exc), held="not read")
        return _Step(updated=(actual, wanted) if stream else None, failed=exc)
    return _Step(
        Change(name, "updated", found.fields), updated=(actual, wanted) if stream else None
    )


def _over_new_bound(
    name: str, wanted: js_api.StreamConfig, info: js_api.StreamInfo, fields: Collection[str]
) -> str | None:
    """The fix to name where ``info``'s stream already holds more than a new bound of
    ``wanted`` (bytes, or messages: `SEEDANCE_JOB_REQUESTS`' max_msgs, review C1), else None.
    Applied, a refuse-when-full stream would refuse every write and an evict-oldest one would
    drop its oldest history without a word (review R3, R4): the operator chooses."""
    held, msgs = info.state.bytes, info.state.messages
    if "max_bytes" in fields and 0 < (wanted.max_bytes or -1) < held:
        log.error("stream_over_new_bound", stream=name, bytes=held, max_bytes=wanted.max_bytes)
        purge = _PURGE.format(stream=name)
        return OVER_BOUND_HINT.format(
            held=held, unit="bytes", field="max_bytes", bound=wanted.max_bytes, purge=purge
        )
    if "max_msgs" in fields and 0 < (wanted.max_msgs or -1) < msgs:
        log.error("stream_over_new_bound", stream=name, messages=msgs, max_msgs=wanted.max_msgs)
        copies = _copies_of(name)
        commands = "; ".join(
            f"`nats stream purge {each} --subject <subject>`" for each in (name, *copies)
        )
        purge = (
            _PURGE_WITH_COPIES.format(stream=name, copies=", ".join(copies), commands=commands)
            if copies
            else _PURGE.format(stream=name)
        )
        return OVER_BOUND_HINT.format(
            held=msgs, unit="messages", field="max_msgs", bound=wanted.max_msgs, purge=purge
        )
    return None


def _copies_of(origin: str) -> tuple[str, ...]:
    """The catalogue streams that source or mirror ``origin``: those holding its copies."""
    return tuple(
        spec.name
        for spec in STREAMS
        if any(src.stream == origin for src in (*spec.sources, spec.mirror) if src is not None)
    )


def _merged(actual: js_api.StreamConfig, wanted: js_api.StreamConfig) -> js_api.StreamConfig:
    """A bucket's or store's stream as it is, with every compared field set as wanted."""
    merged = dataclasses.replace(actual)
    for f in _COMPARED:
        setattr(merged, f, getattr(wanted, f))
    return merged
