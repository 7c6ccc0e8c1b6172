"""The JetStream API subjects that one grant takes: a stream's inspection, a named durable's
verbs (granted or denied), an object store's reads and writes.

Owns the spelling of ``$JS.API`` subjects for the permissions (`seedance.events.permissions`
decides who gets which); must not know declarations, tenants or the catalogue.
"""

from __future__ import annotations

__all__ = ["JS_API", "durable_api", "durable_denied", "object_store_api", "stream_api"]

JS_API = "$JS.API"


def stream_api(stream: str) -> list[str]:
    """Inspect a stream (bucket, store); never CREATE, UPDATE (nor DELETE) it. nats-server checks
    the read permissions of neither a creator nor an updater: whoever creates a missing stream
    chooses its whole configuration (a ``republish`` to a subject it reads, a ``mirror`` or
    ``sources`` of a stream it may not read; review 1 and review 3). Only an operator's
    `seedance admin provision` creates or changes one (`seedance.core.drift`); a service that
    finds one missing waits for it (`seedance.core.bus.Bus.ensure_streams`)."""
    return [f"{JS_API}.STREAM.INFO.{stream}"]


def durable_api(stream: str, durable: str) -> list[str]:
    return [
        f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{JS_API}.CONSUMER.INFO.{stream}.{durable}",
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        # ack, nak, in-progress and term all go to the message's reply subject
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def durable_denied(stream: str, durable: str) -> list[str]:
    """Every verb on consumer ``durable`` of ``stream``: denied by name to a user granted any
    consumer of that stream (a tenant's reads, a service's per-replica readers)."""
    named, verbs = f"{stream}.{durable}", ("DURABLE.CREATE", "DELETE", "INFO", "MSG.NEXT")
    return [
        f"{JS_API}.CONSUMER.CREATE.{named}",
        f"{JS_API}.CONSUMER.CREATE.{named}.>",
        *(f"{JS_API}.CONSUMER.{v}.{named}" for v in verbs),
        *(f"$JS.{kind}.{named}.>" for kind in ("FC", "ACK")),
    ]


def object_store_api(stores: tuple[str, ...]) -> list[str]:
    """What reading and writing the object stores ``stores`` takes."""
    api: list[str] = []
    for store in stores:
        obj = f"OBJ_{store}"
        api += stream_api(obj)
        api += [
            f"{JS_API}.STREAM.MSG.GET.{obj}",
            # nats-py's put of an existing name purges the old object's chunks (its filter in
            # the body): the store's writer owns its objects, never its configuration
            f"{JS_API}.STREAM.PURGE.{obj}",
            f"{JS_API}.DIRECT.GET.{obj}.>",
            # a get reads the object's chunks through an ordered consumer
            f"{JS_API}.CONSUMER.CREATE.{obj}",
            f"{JS_API}.CONSUMER.CREATE.{obj}.>",
            f"{JS_API}.CONSUMER.DELETE.{obj}.>",
            # ... whose flow-control requests (every few chunks of an object over ~1 MiB) it
            # answers: refused, a get of a larger model stalled for ever (the demo's compile,
            # issue 27: the tests' small models never met one).
            f"$JS.FC.{obj}.>",
            f"$O.{store}.>",
        ]
    if stores:
        # nats-py's object store list/watch subscribes without naming the stream and looks it
        # up by subject first (refused, the router's start-up read of its models timed out and
        # it restarted for ever under the shipped permissions: `make compose-check` found it).
        # The answer is stream names only, no data.
        api.append(f"{JS_API}.STREAM.NAMES")
    return api
