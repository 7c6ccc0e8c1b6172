"""The bus: connect to NATS (refusing servers that are too old), provision the catalogue, publish.

Owns the NATS connection and JetStream context, the server-version guard, idempotent creation of
the catalogue's streams and consumers, and publishing events with their id as ``Nats-Msg-Id`` and
the current trace context in the headers. Consuming lives in ``seedance.core.consumer``. It must
not know any service's events beyond the ``Event`` base.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import nats
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry.context import Context

from seedance.core import errors
from seedance.core.barrier import flushed
from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.connect_watch import ConnectWatch, describe, who
from seedance.core.consumer_config import consumer_config, consumer_start
from seedance.core.drift import PROVISION_HINT, check_drift, stream_config
from seedance.core.errors import BusUnavailable, NoStream, ServerTooOld, StartRefused, StreamRefused
from seedance.core.logs import get_logger
from seedance.core.publisher import AckedBatch, Message, PubAck, Publisher, PublishRefused
from seedance.core.tasks import cancel_until_done_shielded
from seedance.core.tracing import inject_headers, tracer
from seedance.events import Event, encode
from seedance.events.subjects import CONSUMERS, STREAMS, ConsumerSpec, Header, StreamSpec

__all__ = [
    "MIN_SERVER_VERSION",
    "TRANSIENT_BUS_ERRORS",
    "Bus",
    "BusSettings",
    "ConnectPolicy",
    "check_server_version",
    "set_connect_policy",
]

#: What a publish, KV or object-store call raises when the bus is down, slow or refusing for
#: now (nats-py's and JetStream's errors, timeouts, a dropped socket, a stream that refused a
#: message, the publisher having re-sent the "not now" answers already): worth a retry later,
#: never a bug. Catch these, not ``Exception``. A full stream (`StreamRefused`, which was a
#: JetStream error here before it had its own name) frees room with retention or a purge.
TRANSIENT_BUS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    TimeoutError,
    ConnectionError,
    PublishRefused,
    StreamRefused,
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
    #: How long the first connection may take, all attempts together (``SEEDANCE_CONNECT_
    #: TIMEOUT_S``); then ``connect`` raises ``BusUnavailable``. Once connected, a lost
    #: connection is retried for ever (a NATS restart must not kill the services) unless
    #: ``reconnect_for_s`` is set.
    connect_timeout_s: float = 10.0
    #: How long a lost connection is retried before it is given up and closed (``gave_up``;
    #: a command line's client, which must end rather than wait on a dead server); None: for
    #: ever (services).
    reconnect_for_s: float | None = None


#: nats-py's per-attempt socket timeout, within the overall bound above.
_ATTEMPT_TIMEOUT_S = 5.0
#: nats-py's wait between reconnect attempts (its default), shortened under ``reconnect_for_s``.
_RECONNECT_WAIT_S = 2.0
#: A service refused the creation of a missing stream looks for it again this often (the
#: operator's provision creates it), and says what it waits for at most once a minute.
_PROVISION_POLL_S = 1.0
_WAITING_LINE_EVERY_S = 60.0
#: What a stream lookup may answer while JetStream passes through a bad moment (a fresh R3
#: cluster electing its meta leader answers 503; a slow one lets the request time out): a
#: provision wait goes on through these. nats-py raises either timeout kind.
_PASSING_JS_ERRORS: tuple[type[BaseException], ...] = (
    nats.js.errors.ServiceUnavailableError,
    nats.errors.TimeoutError,
    TimeoutError,
)

#: What a JetStream request meets where no one in the user's account answers it now.
_NOT_ANSWERING: tuple[type[BaseException], ...] = (
    *_PASSING_JS_ERRORS,
    nats.errors.NoRespondersError,
)

_T = TypeVar("_T")


#: Decides the identity a connection presents: given the settings and the service connecting
#: (``ServiceRuntime``'s name; None for a client), the settings to connect with, or an error.
ConnectPolicy = Callable[[BusSettings, str | None], BusSettings]
_policy: ConnectPolicy | None = None


def set_connect_policy(policy: ConnectPolicy | None) -> ConnectPolicy | None:
    """Install ``policy`` for every later ``Bus.connect`` of this process; return the previous.

    Deployments install none: each process connects as its settings say (``NATS_USER``...).
    The test session installs ``seedance.testing.identities``' policy, so that a service
    started in-process connects as its own generated user (and no other), and test code that
    names no user connects as the operator, on a server running the shipped authorization.
    """
    global _policy
    previous, _policy = _policy, policy
    return previous


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


def _nats_options(
    settings: BusSettings, watch: ConnectWatch, on_error: Callable[[Exception], Awaitable[None]]
) -> dict[str, object]:
    """nats-py's connect options for ``settings``, its callbacks ``watch``'s."""
    kwargs: dict[str, object] = {
        "servers": [u.strip() for u in settings.url.split(",")],
        "name": settings.name,
        "connect_timeout": min(_ATTEMPT_TIMEOUT_S, settings.connect_timeout_s),
        "error_cb": on_error,
        "disconnected_cb": watch.disconnected,
        "reconnected_cb": watch.reconnected,
        "closed_cb": watch.closed,
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        # Draining waits for in-flight messages of every subscription; bound it so that a
        # SIGTERM'd service exits well inside Kubernetes' 30 s grace period.
        "drain_timeout": 5,
    }
    if settings.reconnect_for_s is not None:
        # nats-py waits reconnect_time_wait (2 s) between attempts at a server: with a
        # bound as short as a command line's, the give-up could come before the attempt
        # after a short outage. Four attempts at least within the bound.
        kwargs["reconnect_time_wait"] = min(_RECONNECT_WAIT_S, settings.reconnect_for_s / 4)
    if settings.inbox_prefix:
        kwargs["inbox_prefix"] = settings.inbox_prefix
    if settings.creds:
        kwargs["user_credentials"] = settings.creds
    if settings.user:
        kwargs["user"] = settings.user
        kwargs["password"] = settings.password or ""
    return kwargs


class Bus:
    """One NATS connection and its JetStream context, shared by a process's components."""

    def __init__(self, nc: NATS, settings: BusSettings, clock: Clock = WALL_CLOCK) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        #: The time this connection's parts read (log throttling, publish retries, readers).
        self.clock = clock
        #: Pipelined JetStream publishing (one reply subscription, acks per batch).
        self.publisher = Publisher(nc, clock=clock)
        self._watch: ConnectWatch | None = None
        self._never_lost = asyncio.Event()  # a bus built without `connect` watches nothing
        self._awaited: set[str] = set()
        #: Set by `close` when nothing could be drained (the connection was reconnecting):
        #: what was in flight is redelivered elsewhere. A service's stop reports it (exit 69).
        self.undrained: BaseException | None = None

    @property
    def awaiting(self) -> frozenset[str]:
        """The streams (a bucket's ``KV_``, a store's ``OBJ_``) this connection waits for the
        operator's provision to create (`create_or_await`); empty once all exist. A service
        is not ready while any is awaited: router, slicer and graph-compiler bind their
        buckets and stores after the runtime started."""
        return frozenset(self._awaited)

    @classmethod
    async def connect(
        cls,
        settings: BusSettings,
        *,
        service: str | None = None,
        error_cb: Callable[[Exception], Awaitable[None]] | None = None,
        clock: Clock = WALL_CLOCK,
    ) -> Bus:
        """Connect and check the server version; raise ``ServerTooOld`` (and close) if too old.

        The first connection ends within ``settings.connect_timeout_s``, or at once on an
        authorization violation, with ``BusUnavailable`` saying what to check. ``error_cb``
        also hears the server's asynchronous errors (a permissions violation: a client reports
        which subject was refused rather than a timeout). ``service`` names the service whose
        connection this is (None for a client), for the connect policy (``set_connect_policy``).
        """
        settings = _policy(settings, service) if _policy is not None else settings
        watch = ConnectWatch(settings, clock)

        async def on_error(exc: Exception) -> None:
            await watch.error(exc)
            if error_cb is not None:
                await error_cb(exc)

        kwargs = _nats_options(settings, watch, on_error)
        nc = NATS()
        watch.close_connection = nc.close
        # nats-py types its options one by one (connect_timeout as an int, though it takes a
        # float); the options are gathered as a dict above because most are conditional.
        attempt = asyncio.ensure_future(nc.connect(**kwargs))  # type: ignore[arg-type]
        refused = asyncio.ensure_future(watch.refused.wait())
        try:
            done, _ = await asyncio.wait(
                {attempt, refused},
                timeout=settings.connect_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if attempt not in done:
                raise watch.failure()
            attempt.result()  # a failure nats-py raised itself (reconnects are on: rare)
        except BaseException:
            # Timed out, refused, or cancelled (SIGTERM while connecting): stop the attempts.
            attempt.cancel()
            with contextlib.suppress(BaseException):
                await attempt
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        finally:
            refused.cancel()
        watch.connected = True
        v = nc.connected_server_version
        try:
            check_server_version((v.major, v.minor, v.patch), settings.min_server_version)
            try:
                await nc.jetstream().account_info()
            except nats.js.errors.ServiceUnavailableError as exc:
                raise ServerTooOld("nats-server has JetStream disabled: start it with -js") from exc
        except BaseException:
            watch.closing = True  # our own close: not a lost connection to log or give up
            await nc.close()  # whatever failed, the connection is not left behind
            raise
        bus = cls(nc, settings, clock)
        bus._watch = watch
        return bus

    async def subscribe(
        self, subject: str, cb: Callable[[Msg], Awaitable[None]], *, queue: str = ""
    ) -> Subscription:
        """A core subscription that the server holds when this returns: a message published
        after it, from any connection, is delivered to ``cb`` (`flushed`: a plain flush after
        the subscribe does not promise that with nats-py)."""
        sub = await self.nc.subscribe(subject, queue=queue, cb=cb)
        await flushed(self.nc)
        return sub

    @property
    def gave_up(self) -> asyncio.Event:
        """Set once the connection is lost for good (`BusSettings.reconnect_for_s` passed
        without a reconnection): a reader waiting for messages ends on it."""
        return self._never_lost if self._watch is None else self._watch.gave_up

    @property
    def connection_lost(self) -> bool:
        """The connection is down now: reconnecting, or given up."""
        return self.nc.is_reconnecting or self.gave_up.is_set()

    def lost(self) -> BusUnavailable:
        """The error that says this connection was lost (naming the URL)."""
        return (self._watch or ConnectWatch(self.settings, self.clock)).lost()

    async def close(self) -> None:
        """Drain and close. While reconnecting nothing can be drained: closed all the same
        (an open connection's reconnect loop would outlive the process's end), and
        ``undrained`` says so, for a service to report (the command line need not)."""
        if self.nc.is_closed:
            return
        if self._watch is not None:
            self._watch.closing = True
            self._watch.stop_giving_up()  # our own close: the give-up is not news any more
        await self.publisher.close()
        if self.nc.is_reconnecting:  # nothing to drain; nats-py refuses to drain now
            await self.nc.close()
            self.undrained = nats.errors.ConnectionReconnectingError()
            return
        try:
            await self.nc.drain()
        except nats.errors.DrainTimeoutError:
            await self.nc.close()  # what did not drain in time is redelivered elsewhere

    # --- provisioning -----------------------------------------------------------------------

    async def ensure_streams(
        self, streams: Iterable[StreamSpec] = STREAMS, *, unready_while_awaited: bool = True
    ) -> None:
        """Check each stream; create a missing one where this user may (the operator; any user of
        a server without authorization), else wait for the operator's provision to
        (`create_or_await`). Safe from every replica at every start. An existing one is never
        changed (a service's user may not: `seedance.core.drift`): one that differs from the
        catalogue is reported (``stream_config_drift``), and one carrying a planted copy refuses
        the start (`StartRefused`, naming the stream)."""
        for spec in streams:
            config = stream_config(spec, self._replicas())
            with contextlib.suppress(NotFoundError):
                check_drift(config, (await self.js.stream_info(spec.name)).config)
                continue
            try:
                created = await self.create_or_await(
                    spec.name,
                    functools.partial(self.js.add_stream, config),
                    unready_while_awaited=unready_while_awaited,
                )
            except BadRequestError as exc:
                if exc.err_code != 10058:  # "stream name already in use with a different config"
                    raise
                created = None  # created meanwhile (provision, another replica): check it
            if created is None:
                check_drift(config, (await self.js.stream_info(spec.name)).config)

    async def create_or_await(
        self,
        stream: str,
        create: Callable[[], Awaitable[_T]],
        *,
        unready_while_awaited: bool = True,
    ) -> _T | None:
        """``create()``'s result (it creates the missing catalogue stream, KV bucket or object
        store whose stream is ``stream``); or, where the server refuses this user that create,
        None once the stream exists.

        A deployment's service users hold no ``STREAM.CREATE``: whoever creates a missing stream
        chooses its whole configuration, and nats-server checks no creator's read permissions
        (docs/security.md). Only the operator's `seedance admin provision` creates, so a service
        that starts first waits for it here, polling, with one ``stream_not_provisioned`` line
        a minute naming the stream and the fix (``ServiceRuntime`` is not ready meanwhile)
        rather than crash-looping. The refusal comes by the error callback, at once, not as a
        reply; a bus built without ``connect`` hears none and just creates. The stream is in
        ``awaiting`` meanwhile, unless ``unready_while_awaited`` is False: a wait at run time
        for what only a side job needs (the router's planner leader and its mirror) must not
        take the replica out of service.
        """
        refused, made = await self.unless_refused(f"$JS.API.STREAM.CREATE.{stream}", create)
        if refused and self._watch is not None:
            await self._await_stream(stream, self._watch, unready_while_awaited)
        return made

    async def unless_refused(
        self, subject: str, create: Callable[[], Awaitable[_T]]
    ) -> tuple[bool, _T | None]:
        """``(False, create()'s result)``, or ``(True, None)`` as soon as the server refuses
        this user ``subject``, the request ``create`` sends (by the error callback: no reply)."""
        if self._watch is None:
            return False, await create()
        entry = (subject, asyncio.Event())
        self._watch.denials.append(entry)
        attempt = asyncio.ensure_future(create())
        refused = asyncio.ensure_future(entry[1].wait())
        try:
            await asyncio.wait({attempt, refused}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._watch.denials.remove(entry)
            # Not ``cancel(); await`` under a suppressed CancelledError: the caller's cancel (a
            # SIGTERM) landing there is handed on to the task awaited and swallowed with it.
            await cancel_until_done_shielded((refused, attempt))
        return (True, None) if attempt.cancelled() else (False, attempt.result())

    async def _await_stream(self, stream: str, watch: ConnectWatch, unready: bool) -> None:
        """Poll until ``stream`` exists. What may pass (a JetStream meta-leader election, a
        request timing out) keeps the wait going, counted in the minute's line; a refusal of
        the lookup itself (this user may not read the stream's info) ends it with
        `StartRefused` naming the stream and the user; any other error ends it as itself."""
        info = (f"$JS.API.STREAM.INFO.{stream}", asyncio.Event())
        watch.denials.append(info)
        if unready:
            self._awaited.add(stream)
        try:
            await self._poll_stream(stream, info[1])
        finally:
            self._awaited.discard(stream)
            watch.denials.remove(info)

    async def _poll_stream(self, stream: str, info_refused: asyncio.Event) -> None:
        since, last_line, errors, last_error = self.clock.monotonic(), None, 0, ""
        while True:
            try:
                await self.js.stream_info(stream)
            except NotFoundError:
                pass
            except _PASSING_JS_ERRORS as exc:
                if info_refused.is_set():  # the refusal comes by the error callback, first
                    raise StartRefused(
                        f"NATS refused {who(self.settings)} the lookup of stream {stream} "
                        f"($JS.API.STREAM.INFO.{stream}): check this user's permissions "
                        "(deploy/auth/users.yaml) and that it is in the account Seedance's "
                        "streams live in."
                    ) from exc
                errors, last_error = errors + 1, describe(exc)
            else:
                log.info(
                    "stream_provisioned", stream=stream, waited_s=self.clock.monotonic() - since
                )
                return
            now = self.clock.monotonic()
            if last_line is None or now - last_line >= _WAITING_LINE_EVERY_S:
                log.warning(
                    "stream_not_provisioned",
                    stream=stream,
                    user=self.settings.user,
                    waited_s=now - since,
                    lookup_errors=errors,
                    last_lookup_error=last_error or None,
                    fix=f"{PROVISION_HINT} (this user may not create it; compose and the "
                    "Kubernetes Job `seedance-provision` run it before the services)",
                )
                last_line, errors, last_error = now, 0, ""
            await self.clock.sleep(_PROVISION_POLL_S)

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        """Create (or update) ``spec``'s consumer; a refused create or delete (not acked) raises
        ConsumerRefused at once, a refused info (deliver_new) times out (5 s) as before."""
        if not spec.acked:
            # A reader that keeps its own position: it starts where it says, and a consumer's
            # start cannot be changed, so the old one goes first.
            delete = f"$JS.API.CONSUMER.DELETE.{spec.stream}.{spec.durable}"
            with contextlib.suppress(NotFoundError):
                await self._consumer_call(spec, delete, self.js.delete_consumer, deleting=True)
        config, create = consumer_config(spec, *await consumer_start(self.js, spec))
        await self._consumer_call(spec, create, lambda s, _d: self.js.add_consumer(s, config))

    async def _consumer_call(
        self,
        spec: ConsumerSpec,
        subject: str,
        call: Callable[[str, str], Awaitable[object]],
        *,
        deleting: bool = False,
    ) -> None:
        """``call(stream, durable)``, the request on ``subject``; ConsumerRefused where this user
        may not send it, or where no one answers the delete of an old consumer (503 without a
        code, no responders) while the stream's info does: its account does not import the
        request (a NATS config older than the release). Else no one answering is JetStream
        not ready (a restart, a leader election): raised as it is, for the caller's retry."""
        try:
            refused, _ = await self.unless_refused(subject, lambda: call(spec.stream, spec.durable))
        except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError) as exc:
            if getattr(exc, "code", None) is not None or not deleting:
                raise
            if not await self._answers(spec.stream):
                raise
            refused = True
        if refused:
            raise errors.ConsumerRefused(who(self.settings), spec.stream, spec.durable, subject)

    async def _answers(self, stream: str) -> bool:
        """Whether JetStream answers this user's info of ``stream`` (found or not) now."""
        try:
            await self.js.stream_info(stream)
        except NotFoundError:
            return True
        except _NOT_ANSWERING:
            return False
        return True

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
            data = encode(event)
            try:
                return await self.js.publish(subject, data, headers=headers, timeout=timeout_s)
            except nats.js.errors.APIError as exc:
                code = exc.err_code or 0
                if code in (StreamRefused.FULL, StreamRefused.TOO_LARGE):
                    raise StreamRefused(subject, code, str(exc.description), len(data)) from exc
                raise
            except nats.js.errors.NoStreamResponseError as exc:
                raise NoStream(
                    f"no stream stores {subject!r}: Seedance's streams are created by "
                    "`seedance admin provision` (run first by compose and Kubernetes); has it run?"
                ) from exc

    async def publish_many(
        self,
        items: Sequence[tuple[str, Event]],
        *,
        window: int = 1024,
        timeout_s: float = 10.0,
        causes: Sequence[Context | None] | None = None,
    ) -> list[PubAck]:
        """Publish many events, pipelined, and return once every one is acknowledged.

        Awaiting each PubAck in turn costs a round trip per message (2-3k msg/s in nats-py), so
        the messages go out through ``self.publisher`` (up to ``window`` acks outstanding)
        under one span whose trace context every message carries, except where ``causes``
        (one per item) names the trace context of the message that caused it (a batch
        handler's ``Delivery.trace_context``): that item carries its cause's trace, so one job
        stays one trace across a batching service. Order on a subject is kept,
        but for a message the publisher had to re-send (see ``seedance.core.publisher``); an
        event that fails raises here (``NoStream``, ``PublishRefused``, ``TimeoutError``), and
        its id makes the caller's retry a duplicate.
        """
        if not items:
            return []
        acks: list[PubAck] = []
        with tracer().start_as_current_span(f"publish {len(items)} events"):
            messages = _messages(items, causes)
            for start in range(0, len(items), window):
                batch = await self.publisher.publish(messages[start : start + window])
                acks.extend(await batch.wait(timeout_s))
        return acks

    async def send_many(
        self, items: Sequence[tuple[str, Event]], *, causes: Sequence[Context | None] | None = None
    ) -> AckedBatch:
        """Send events as ``publish_many`` does, all at once, without waiting for their acks:
        the returned batch's ``wait`` gives them (and re-sends what stays unanswered while it
        waits). The caller bounds how many it leaves unacknowledged. Sent without awaiting
        anything, the messages leave in the same socket write as whatever the caller sends
        before its next wait (a consumer's acks and its next pull)."""
        with tracer().start_as_current_span(f"publish {len(items)} events"):
            return await self.publisher.publish(_messages(items, causes))

    async def stream_info(self, stream: str) -> js_api.StreamInfo | None:
        try:
            return await self.js.stream_info(stream)
        except NotFoundError:
            return None


def _messages(
    items: Sequence[tuple[str, Event]], causes: Sequence[Context | None] | None
) -> list[Message]:
    """Each event encoded with its id as ``Nats-Msg-Id`` and its cause's trace context (or the
    current one's)."""
    if causes is not None and len(causes) != len(items):
        raise ValueError(f"{len(causes)} causes for {len(items)} events")
    trace_headers = inject_headers({})
    return [
        (
            subject,
            encode(event),
            {
                **(inject_headers({}, cause) if cause is not None else trace_headers),
                Header.MSG_ID.value: event.id,
            },
        )
        for (subject, event), cause in zip(items, causes or [None] * len(items), strict=True)
    ]
