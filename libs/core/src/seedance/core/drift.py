"""A stream's configuration on the server against the catalogue's: what differs, which of it is
a planted copy, and the operator's convergence (`converge`, what `seedance admin provision`
runs).

Services create what is missing and never change an existing stream or bucket: their users hold
no ``STREAM.UPDATE`` (nats-server does not check the updater's read permissions for a stream's
``sources``/``mirror``, so an update grant let any service copy a stream it may not read into
one it may: docs/security.md). A service that finds a drifted stream reports it with
`check_drift`; only an operator's credentials change one, here. This module owns the
comparison and the operator's changes; it must not create streams for services (`Bus` does)
nor know any service.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from seedance.core.errors import StartRefused
from seedance.core.logs import get_logger
from seedance.events.subjects import BucketSpec, ObjectStoreSpec, StreamSpec

__all__ = [
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

PROVISION_HINT = "run `seedance admin provision` with an operator's credentials"

#: What the catalogue decides of each kind of stream, and so what a comparison reads; the rest
#: is nats-py's or the server's choice (a bucket's duplicate window, a store's per-subject cap).
_STREAM_FIELDS = (
    "subjects", "sources", "mirror", "description", "max_age", "max_bytes", "duplicate_window",
    "num_replicas",
)  # fmt: skip
_BUCKET_FIELDS = (
    "subjects", "sources", "mirror", "description", "max_age", "max_msgs_per_subject",
    "allow_direct", "num_replicas",
)  # fmt: skip
_STORE_FIELDS = (
    "subjects", "sources", "mirror", "description", "max_age", "max_bytes", "num_replicas",
)  # fmt: skip


def _decided(stream: str) -> tuple[str, ...]:
    """The fields the catalogue decides of ``stream`` (nats-py names a bucket's ``KV_<name>``
    and a store's ``OBJ_<name>``; the catalogue's own streams are ``SEEDANCE_*``)."""
    if stream.startswith("KV_"):
        return _BUCKET_FIELDS
    if stream.startswith("OBJ_"):
        return _STORE_FIELDS
    return _STREAM_FIELDS


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
        duplicate_window=spec.duplicate_window_s,
        num_replicas=replicas,
    )


def bucket_config(spec: BucketSpec, replicas: int) -> js_api.StreamConfig:
    """The parts of KV bucket ``spec``'s stream the catalogue decides (nats-py makes the rest)."""
    return js_api.StreamConfig(
        name=f"KV_{spec.name}",
        subjects=[f"$KV.{spec.name}.>"],
        description=spec.description or None,
        max_age=spec.ttl_s,
        max_msgs_per_subject=spec.history,
        allow_direct=spec.direct,
        num_replicas=replicas,
    )


def object_store_config(spec: ObjectStoreSpec, replicas: int) -> js_api.StreamConfig:
    """The parts of object store ``spec``'s stream the catalogue decides."""
    return js_api.StreamConfig(
        name=f"OBJ_{spec.name}",
        subjects=[f"$O.{spec.name}.C.>", f"$O.{spec.name}.M.>"],
        description=spec.description or None,
        max_age=spec.ttl_s,
        max_bytes=spec.max_bytes,
        num_replicas=replicas,
    )


def _source_key(src: js_api.StreamSource) -> tuple[Any, ...]:
    transforms = tuple((t.src, t.dest) for t in src.subject_transforms or ())
    external = src.external.api if src.external else None
    return (src.name, src.filter_subject or None, transforms, external)


def _value(config: js_api.StreamConfig, name: str) -> Any:
    value = getattr(config, name)
    if name == "subjects":
        return tuple(sorted(value or ()))
    if name == "sources":
        return tuple(sorted(_source_key(s) for s in value or ()))
    if name == "mirror":
        return _source_key(value) if value else None
    if name == "description":
        return value or ""
    if name in ("max_age", "duplicate_window"):  # seconds, through nanoseconds
        return round(float(value or 0.0), 3)
    if name == "allow_direct":
        return bool(value)
    return value


@dataclass(frozen=True)
class Drift:
    """How stream ``stream`` differs from the catalogue: ``fields`` (those it decides), and
    ``planted``: what the catalogue does not declare that copies data in (a source or mirror of
    another stream or with a subject transform, a subject of its own), described."""

    stream: str
    fields: tuple[str, ...]
    planted: tuple[str, ...]
    mirror_changed: bool


def drift(wanted: js_api.StreamConfig, actual: js_api.StreamConfig) -> Drift | None:
    """How ``actual`` (the server's) differs from ``wanted`` (the catalogue's); None: none."""
    fields = tuple(f for f in _decided(wanted.name or "") if _value(wanted, f) != _value(actual, f))
    if not fields:
        return None
    planted = [
        f"subject {s}" for s in _value(actual, "subjects") if s not in (wanted.subjects or ())
    ]
    declared = {_source_key(s) for s in wanted.sources or ()}
    if wanted.mirror:
        declared.add(_source_key(wanted.mirror))
    declared_streams = {key[0] for key in declared}
    for kind, src in [("source", s) for s in actual.sources or ()] + (
        [("mirror", actual.mirror)] if actual.mirror else []
    ):
        key = _source_key(src)
        # Another filter on a declared origin is an old catalogue's choice (drift, not a plant);
        # another origin, a transform (it renames subjects: a forged report) or an external
        # one is a copy the catalogue never made.
        if key[0] not in declared_streams or key[2] or key[3]:
            planted.append(f"{kind} {src.name} (filter {src.filter_subject}, transforms {key[2]})")
    return Drift(
        stream=wanted.name or "",
        fields=fields,
        planted=tuple(planted),
        mirror_changed="mirror" in fields,
    )


def check_drift(wanted: js_api.StreamConfig, actual: js_api.StreamConfig) -> None:
    """What a service does with an existing stream: nothing when it matches; a warning
    ``stream_config_drift`` (the stream, the fields) when it differs, and the service goes on
    (an old catalogue's limits or filter never stop a fleet: finding 6, a mirror that cannot be
    updated crash-looped every service); `StartRefused` naming the stream when it carries a
    planted copy.

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
        log.error(
            "stream_config_drift",
            stream=found.stream,
            fields=list(found.fields),
            planted=list(found.planted),
            fix=PROVISION_HINT,
        )
        raise StartRefused(
            f"stream {found.stream} carries what the catalogue does not declare "
            f"({'; '.join(found.planted)}): a planted copy; {PROVISION_HINT} to remove it"
        )
    log.warning(
        "stream_config_drift", stream=found.stream, fields=list(found.fields), fix=PROVISION_HINT
    )


@dataclass(frozen=True)
class Change:
    """What `converge` did to one stream: ``created``, ``updated`` or ``recreated`` (a mirror,
    rebuilt from its origin), and the fields that differed."""

    stream: str
    action: str
    fields: tuple[str, ...] = ()

    def __str__(self) -> str:
        what = f" ({', '.join(self.fields)})" if self.fields else ""
        return f"{self.action}: stream {self.stream}{what}"


async def converge(js: JetStreamContext, streams: list[js_api.StreamConfig]) -> list[Change]:
    """Make each of ``streams`` (wanted configs) so on the server, with an operator's
    credentials: create the missing streams (a bucket or store is left for its service to
    create), update the drifted ones (a
    planted source goes with the update: the wanted ``sources`` replace the server's), and
    delete and re-create a stream whose mirror differs (the server refuses to update a mirror;
    a mirror is rebuilt from its origin). A bucket or store keeps the fields the catalogue does
    not decide. What changed, in order."""
    changes: list[Change] = []
    for wanted in streams:
        name = wanted.name or ""
        stream = _decided(name) is _STREAM_FIELDS
        try:
            actual = (await js.stream_info(name)).config
        except NotFoundError:
            if stream:
                await js.add_stream(wanted)
                changes.append(Change(name, "created"))
            continue
        found = drift(wanted, actual)
        if found is None:
            continue
        if found.mirror_changed and not stream:
            # A bucket's keys or a store's objects are nowhere else: never deleted here.
            changes.append(Change(name, "left (has a mirror: remove it by hand)", found.fields))
            continue
        if found.mirror_changed:
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(name)
            await js.add_stream(wanted)
            changes.append(Change(name, "recreated", found.fields))
            continue
        await js.update_stream(wanted if stream else _merged(actual, wanted))
        changes.append(Change(name, "updated", found.fields))
    return changes


def _merged(actual: js_api.StreamConfig, wanted: js_api.StreamConfig) -> js_api.StreamConfig:
    """A bucket's or store's stream as it is, with what the catalogue decides set as wanted."""
    merged = dataclasses.replace(actual)
    for f in _decided(wanted.name or ""):
        setattr(merged, f, getattr(wanted, f))
    return merged
