"""The provisioner: the user `seedance admin provision` logs in as (compose's one-shot
``provision``, the Kubernetes Job ``seedance-provision``), and exactly what it may do.

Provision (``seedance.core.kv.provision``) converges every catalogue stream, KV bucket and
object store: it reads each one's configuration, creates the missing, updates the drifted, and
deletes and re-creates a stream whose mirror differs (the server refuses to update a mirror;
``seedance.core.drift.converge``). So the provisioner gets, by catalogue name and nothing by
pattern: JetStream's account info (the version check at connect); ``STREAM.INFO``, ``CREATE``
and ``UPDATE`` of each catalogue stream, bucket (``KV_<name>``) and store (``OBJ_<name>``); and
``STREAM.DELETE`` of the catalogue's mirrors only, whose messages are a copy of their origin's.
No data subject (it publishes no event), no consumer, no message get, no KV key, no object, no
other stream; its replies come under an inbox prefix of its own (``PROVISIONER_INBOX``), not
the services' ``_INBOX.>``, under which every service's fetched messages arrive.

Before, provision ran as the unrestricted operator ``admin``, whose password then sat in a Job
and a compose service that only converge configurations.

What no permission can take from it: nats-server checks the read permissions of neither a
stream's creator nor its updater (``js_grants.stream_api``), so whoever holds this password can
still give a catalogue stream a ``republish`` to its own inbox, or lower its limits. Keep it as
the operator's (docs/security.md, "The provisioner"). Catalogue data, no connections.
"""

from __future__ import annotations

from seedance.events.js_grants import JS_API
from seedance.events.permissions import Permissions, User
from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS

__all__ = [
    "PROVISIONER",
    "PROVISIONER_INBOX",
    "provisioned_streams",
    "provisioner_deletes",
    "provisioner_permissions",
    "provisioner_user",
]

#: The provisioner's NATS user name (its password: ``NATS_PASSWORD_PROVISIONER``).
PROVISIONER = "provisioner"
#: Its inbox prefix: upper case, so no tenant's (``_INBOX_<tenant>``, lower case) can be it.
PROVISIONER_INBOX = "_INBOX_PROVISIONER"


def provisioned_streams() -> tuple[str, ...]:
    """Every stream provision converges: the catalogue's, its buckets' and its stores'."""
    return (
        *(s.name for s in STREAMS),
        *(f"KV_{b.name}" for b in BUCKETS.values()),
        *(f"OBJ_{o.name}" for o in OBJECT_STORES.values()),
    )


def provisioner_deletes() -> tuple[str, ...]:
    """The streams the provisioner may delete: the catalogue's mirrors, whose messages are a
    copy of their origin's (one whose origin or filter differs is deleted and made again).
    Provision leaves any other stream that needs deleting to the operator (`converge`)."""
    return tuple(s.name for s in STREAMS if s.mirror is not None)


def provisioner_permissions() -> Permissions:
    pub = [f"{JS_API}.INFO"]
    for stream in provisioned_streams():
        pub += [f"{JS_API}.STREAM.{verb}.{stream}" for verb in ("INFO", "CREATE", "UPDATE")]
    # A mirror whose origin or filter differs is deleted and made again from its origin; no
    # other stream, bucket or store is ever deleted by provision.
    pub += [f"{JS_API}.STREAM.DELETE.{name}" for name in provisioner_deletes()]
    return Permissions(publish_allow=tuple(pub), subscribe_allow=(f"{PROVISIONER_INBOX}.>",))


def provisioner_user() -> User:
    return User(PROVISIONER, provisioner_permissions())
