"""The bus: connect to NATS (refusing servers that are too old), provision the catalogue, publish.

Owns the NATS connection and JetStream context, the server-version guard, idempotent creation of
the catalogue's streams and consumers, and publishing events with their id as ``Nats-Msg-Id`` and
the current trace context in the headers. Consuming lives in ``seedance.core.consumer``. It must
not know any service's events beyond the ``Event`` base.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import nats
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NotFoundError

from seedance.core.errors import NoStream, ServerTooOld
from seedance.core.logs import get_logger
from seedance.core.publisher import PubAck, Publisher, PublishRefused
from seedance.core.tracing import inject_headers, tracer
from seedance.events import Event, encode
from seedance.events.subjects import CONSUMERS, STREAMS, ConsumerSpec, Header, StreamSpec

__all__ = [
    "MIN_SERVER_VERSION",
    "TRANSIENT_BUS_ERRORS",
    "Bus",
    "BusSettings",
    "check_server_version",
]

#: What a publish, KV or object-store call raises when the bus is down, slow or refusing for
#: now (nats-py's and JetStream's errors, timeouts, a dropped socket, a stream that refused a
#: message, the publisher having re-sent the "not now" answers already): worth a retry later,
#: never a bug. Catch these, not ``Exception``.
TRANSIENT_BUS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    TimeoutError,
    ConnectionError,
    PublishRefused,
)

log = get_logger(__name__)

#: 2.10 is the first server that honours plural consumer filters and lets a permission restrict
#: a consumer's filter subject (tenant isolation); 2.9 silently ignores both.
MIN_SERVER_VERSION = (2, 10, 0)


@dataclass(frozen=True)
class BusSettings:
    url: str = "nats://127.0.0.1:4222"
    creds: str | None = None
    user: str | None = None
    password: str | None = None
    name: str = "seedance"
    #: Reply and delivery subjects start with this (nats-py's default is ``_INBOX``); a tenant's
    #: user may subscribe only to its own prefix (see deploy/auth/users.yaml).
    inbox_prefix: str | None = None
    min_server_version: tuple[int, int, int] = MIN_SERVER_VERSION
    connect_timeout_s: float = 5.0


def check_server_version(version: tuple[int, int, int], minimum: tuple[int, int, int]) -> None:
    if version < minimum:
        have = ".".join(map(str, version))
        need = ".".join(map(str, minimum))
        raise ServerTooOld(
            f"nats-server {have} is too old: Seedance needs {need} or newer (older servers "
            "silently ignore consumer filter lists and cannot restrict a consumer's filter by "
            "permission, which tenant isolation needs). `make install` installs the pinned "
            "server (.venv/bin/nats-server); or point NATS_URL at a newer one."
        )


class Bus:
    """One NATS connection and its JetStream context, shared by a process's components."""

    def __init__(self, nc: NATS, settings: BusSettings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        #: Pipelined JetStream publishing (one reply subscription, acks per batch).
        self.publisher = Publisher(nc)

    @classmethod
    async def connect(
        cls,
        settings: BusSettings,
        *,
        error_cb: Callable[[Exception], Awaitable[None]] | None = None,
    ) -> Bus:
        """Connect and check the server version; raise ``ServerTooOld`` (and close) if too old.

        ``error_cb`` hears the server's asynchronous errors (a permissions violation: a client
        reports which subject was refused rather than a timeout); nats-py logs them otherwise.
        """
        kwargs: dict[str, object] = {
            "servers": [u.strip() for u in settings.url.split(",")],
            "name": settings.name,
            "connect_timeout": settings.connect_timeout_s,
            "max_reconnect_attempts": -1,
            "allow_reconnect": True,
            # Draining waits for in-flight messages of every subscription; bound it so that a
            # SIGTERM'd service exits well inside Kubernetes' 30 s grace period.
            "drain_timeout": 5,
        }
        if settings.inbox_prefix:
            kwargs["inbox_prefix"] = settings.inbox_prefix
        if error_cb is not None:
            kwargs["error_cb"] = error_cb
        if settings.creds:
            kwargs["user_credentials"] = settings.creds
        if settings.user:
            kwargs["user"] = settings.user
            kwargs["password"] = settings.password or ""
        nc = await nats.connect(**kwargs)  # type: ignore[arg-type]
        v = nc.connected_server_version
        try:
            check_server_version((v.major, v.minor, v.patch), settings.min_server_version)
            try:
                await nc.jetstream().account_info()
            except nats.js.errors.ServiceUnavailableError as exc:
                raise ServerTooOld("nats-server has JetStream disabled: start it with -js") from exc
        except BaseException:
            await nc.close()  # whatever failed, the connection is not left behind
            raise
        return cls(nc, settings)

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        await self.publisher.close()
        try:
            await self.nc.drain()
        except nats.errors.DrainTimeoutError:
            await self.nc.close()  # what did not drain in time is redelivered elsewhere

    # --- provisioning -----------------------------------------------------------------------

    async def ensure_streams(self, streams: Iterable[StreamSpec] = STREAMS) -> None:
        """Create or update each stream; safe to run from every replica at every start."""
        for spec in streams:
            config = js_api.StreamConfig(
                name=spec.name,
                subjects=list(spec.subjects) or None,
                sources=[
                    js_api.StreamSource(name=src.stream, filter_subject=src.filter_subject)
                    for src in spec.sources
                ]
                or None,
                description=spec.description or None,
                retention=js_api.RetentionPolicy.LIMITS,
                storage=js_api.StorageType.FILE,
                max_age=spec.max_age_s,
                max_bytes=spec.max_bytes,
                duplicate_window=spec.duplicate_window_s,
                num_replicas=self._replicas(),
            )
            try:
                await self.js.add_stream(config)
            except BadRequestError as exc:
                if exc.err_code != 10058:  # "stream name already in use with a different config"
                    raise
                await self.js.update_stream(config)

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        if not spec.acked:
            # A reader that keeps its own position: it starts where it says, and a consumer's
            # start cannot be changed, so the old one goes first.
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(spec.stream, spec.durable)
        config = js_api.ConsumerConfig(
            durable_name=spec.durable if spec.acked else None,
            name=spec.durable,
            ack_policy=js_api.AckPolicy.EXPLICIT if spec.acked else js_api.AckPolicy.NONE,
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE
            if spec.start_seq
            else js_api.DeliverPolicy.ALL,
            opt_start_seq=spec.start_seq or None,
            ack_wait=spec.ack_wait_s if spec.acked else None,
            max_deliver=spec.max_deliver if spec.acked else None,
            max_ack_pending=spec.max_ack_pending if spec.acked else None,
            backoff=list(spec.backoff_s) or None,
            inactive_threshold=spec.inactive_s or None,
        )
        if not spec.filter_subjects:
            pass
        elif len(spec.filter_subjects) == 1:
            config.filter_subject = spec.filter_subjects[0]
        else:
            config.filter_subjects = list(spec.filter_subjects)
        # Since 2.10 a create on an existing durable with a changed config is an update.
        await self.js.add_consumer(spec.stream, config)

    async def ensure_consumers(self, durables: Iterable[str]) -> None:
        for durable in durables:
            await self.ensure_consumer(CONSUMERS[durable])

    def _replicas(self) -> int:
        # A clustered server advertises its peers' client URLs (discovered), and a client may list
        # them itself (NATS_URL with several URLs, which nats-py then does not count as
        # discovered): R3 where the pool holds three or more servers. Counting only discovered
        # ones made a client that listed all three pick R1 and scale existing R3 streams down.
        return 3 if len(self.nc.servers) >= 3 else 1

    # --- publishing -------------------------------------------------------------------------

    async def publish(self, subject: str, event: Event, *, timeout_s: float = 5.0) -> js_api.PubAck:
        """Publish one event and wait for the stream's ack (duplicates ack as duplicates)."""
        with tracer().start_as_current_span(f"publish {subject}"):
            headers = inject_headers({Header.MSG_ID.value: event.id})
            try:
                return await self.js.publish(
                    subject, encode(event), headers=headers, timeout=timeout_s
                )
            except nats.js.errors.NoStreamResponseError as exc:
                raise NoStream(
                    f"no stream stores {subject!r}: Seedance's streams are created when its "
                    "services start (or by `seedance admin provision`); are they running?"
                ) from exc

    async def publish_many(
        self, items: Sequence[tuple[str, Event]], *, window: int = 1024, timeout_s: float = 10.0
    ) -> list[PubAck]:
        """Publish many events, pipelined, and return once every one is acknowledged.

        Awaiting each PubAck in turn costs a round trip per message (2-3k msg/s in nats-py), so
        the messages go out through ``self.publisher`` (up to ``window`` acks outstanding)
        under one span whose trace context every message carries. Order on a subject is kept,
        but for a message the publisher had to re-send (see ``seedance.core.publisher``); an
        event that fails raises here (``NoStream``, ``PublishRefused``, ``TimeoutError``), and
        its id makes the caller's retry a duplicate.
        """
        if not items:
            return []
        acks: list[PubAck] = []
        with tracer().start_as_current_span(f"publish {len(items)} events"):
            trace_headers = inject_headers({})
            for start in range(0, len(items), window):
                batch = await self.publisher.publish(
                    [
                        (subject, encode(event), {**trace_headers, Header.MSG_ID.value: event.id})
                        for subject, event in items[start : start + window]
                    ]
                )
                acks.extend(await batch.wait(timeout_s))
        return acks

    async def stream_info(self, stream: str) -> js_api.StreamInfo | None:
        try:
            return await self.js.stream_info(stream)
        except NotFoundError:
            return None
