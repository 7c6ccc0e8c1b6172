"""The user-facing client: publish job events, follow a tenant's cost stream, compile models.

Works with a tenant's own credentials: it never creates streams, and it follows costs and the
slicer's answers through push consumers whose filter travels in the API subject
(``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), which is what lets the server's
permissions confine a tenant to its own subjects. A tenant user's inbox prefix follows from its
name (``tenant-<t>``: ``seedance.events.subjects.inbox_prefix(t)``) unless given, and so does
the provisioner's (``seedance.events.provision_permissions.PROVISIONER_INBOX``).

A job event is validated with the event types themselves before it is published (the bounds
are declared once, on the schema), so a request the SDK sends is one the slicer decodes. With
``wait_s`` a call waits for the slicer's answer on the tenant's own ``seedance.slicing.<t>.*``
subjects: a placement or the reason it waits (submit), the release (finish, fail, cancel), or a
rejection, raised as ``JobRejectedError`` with its reason. A refused permission is raised as
``PermissionRefused`` naming the subject, never as a time-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncGenerator, Awaitable, Iterator
from datetime import datetime
from typing import Any, Self, TypeVar, Unpack

import msgspec
import nats.errors
import nats.js.errors

from seedance.core.barrier import flushed
from seedance.core.bus import Bus, BusSettings
from seedance.core.clock import WALL_CLOCK, Clock
from seedance.core.drift import Change
from seedance.core.errors import BusUnavailable, SeedanceError
from seedance.core.kv import ensure_object_store, provision
from seedance.events import DecodeError, decode
from seedance.events.allocation import AllocationAnswer, AllocationQuery
from seedance.events.cost import CostEvent, current
from seedance.events.graph import CompileRequest, CompileResult, GraphEvent, PrecisionPolicy
from seedance.events.jobs import JobEvent, JobStarted, JobSubmitted
from seedance.events.provision_permissions import PROVISIONER, PROVISIONER_INBOX
from seedance.events.slicing import (
    JobRejected,
    JobReleased,
    Placement,
    SlicingEvent,
    Unschedulable,
)
from seedance.events.subjects import (
    api,
    costs,
    graph,
    jobs,
    models,
    slicing,
)
from seedance.events.subjects import inbox_prefix as inbox_prefix_of
from seedance.events.tokens import check_tenant, check_token
from seedance.sdk.allocation import NoLedger, ask, read_reply
from seedance.sdk.job_events import KIND_OF, JobRequest, job_event, job_submitted
from seedance.sdk.job_status import JobStatus, fold_statuses
from seedance.sdk.model_chunks import artifact_filter, chunked_request, read_artifact, upload_model
from seedance.sdk.refusals import TENANT_GRANTS, PermissionRefused, Violations
from seedance.sdk.watch import ConsumersInUse, Watch, watching

__all__ = [
    "DEFAULT_WAIT_S",
    "GRAPH_MODELS_STORE",
    "ConsumersInUse",
    "JobOutcome",
    "JobRejectedError",
    "NoDecision",
    "PermissionRefused",
    "SeedanceClient",
    "job_event",
    "job_submitted",
    "tenant_of_user",
]

_T = TypeVar("_T")

#: The graph compiler's object store (its default ``object_store`` setting).
GRAPH_MODELS_STORE = "seedance-graph-models"
#: How long the CLI waits for the slicer's answer by default: it answers within a batch.
DEFAULT_WAIT_S = 10.0
#: A tenant's NATS user is ``tenant-<tenant>`` (deploy/auth/users.yaml renders it so).
_TENANT_USER_PREFIX = "tenant-"
#: The slicing stream: where the slicer's answers are read back.
_SLICING_STREAM = "SEEDANCE_SLICING"


def tenant_of_user(user: str | None) -> str | None:
    """The tenant a NATS user name belongs to (``tenant-acme``: ``acme``), or None."""
    if user and user.startswith(_TENANT_USER_PREFIX):
        return check_tenant(user.removeprefix(_TENANT_USER_PREFIX))
    return None


def _tenant_of_inbox(prefix: str | None) -> str | None:
    """The tenant whose own inbox prefix this is (credentials files give no user name)."""
    candidate = (prefix or "").removeprefix("_INBOX_")
    try:
        return candidate if prefix == inbox_prefix_of(candidate) else None
    except ValueError:  # not a tenant id
        return None


class JobRejectedError(SeedanceError):
    """The slicer rejected the job event (``rejection.reason``: duplicate_job, unknown_job,
    job_ended, invalid_request, unknown_tenant, too_many_waiting); nothing it asked for
    happened."""

    def __init__(self, rejection: JobRejected) -> None:
        super().__init__(f"rejected ({rejection.reason}): {rejection.detail}")
        self.rejection = rejection


class NoDecision(SeedanceError, TimeoutError):
    """No answer from the slicer within the bound (is it running?)."""


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a job call published and, when it waited, what the slicer answered: a
    `Placement` (the first, for a gang) or an `Unschedulable` (why it waits) for a submit, a
    `JobReleased` for an end; None when it did not wait (or a start, which is not answered)."""

    event: JobEvent
    decision: Placement | Unschedulable | JobReleased | None = None


class SeedanceClient:
    """``async with SeedanceClient.connect(url) as client: await client.submit_job(...)``."""

    def __init__(
        self, bus: Bus, violations: Violations | None = None, *, tenant: str | None = None
    ) -> None:
        self._bus = bus
        self._violations = violations or Violations()
        #: The tenant whose user this is (None: an operator's, or not known): its readers of
        #: its own streams take its own consumer names (``subjects.tenant_consumers``).
        self._tenant = tenant
        #: The client's time (events' ``at`` and ids): the bus's clock, the wall clock unless
        #: ``connect`` was given another.
        self._clock = bus.clock

    @classmethod
    async def connect(
        cls,
        url: str = "nats://127.0.0.1:4222",
        *,
        creds: str | None = None,
        user: str | None = None,
        password: str | None = None,
        inbox_prefix: str | None = None,
        clock: Clock = WALL_CLOCK,
        connect_timeout_s: float = 10.0,
        reconnect_for_s: float | None = None,
    ) -> SeedanceClient:
        """Connect; raises ``ServerTooOld`` for a nats-server older than 2.10, and
        ``BusUnavailable`` (saying what to check) when no server answers at ``url`` within
        ``connect_timeout_s`` or the server refuses the credentials (at once).

        A lost connection is retried for ``reconnect_for_s`` (None: for ever), then closed:
        a cost stream or a wait for a result then raises ``BusUnavailable`` rather than wait
        on (``connection_lost`` tells a caller whose call failed whether that was why).

        A tenant's user may subscribe only to its own inbox prefix
        (``seedance.events.subjects.inbox_prefix(tenant)``): it is taken from a ``tenant-<t>``
        user name when ``inbox_prefix`` is not given (pass it for credentials files).
        """
        tenant = tenant_of_user(user)
        if inbox_prefix is None and user == PROVISIONER:
            inbox_prefix = PROVISIONER_INBOX  # it may not subscribe to the services' _INBOX.>
        settings = BusSettings(
            url=url,
            creds=creds,
            user=user,
            password=password,
            inbox_prefix=inbox_prefix or (inbox_prefix_of(tenant) if tenant else None),
            name="seedance-sdk",
            connect_timeout_s=connect_timeout_s,
            reconnect_for_s=reconnect_for_s,
        )
        violations = Violations(settings.inbox_prefix or "_INBOX")
        # Connecting asks JetStream for the account (a request, answered on the inbox): a
        # refused inbox subscription is reported here, not as a time-out.
        connecting = Bus.connect(settings, error_cb=violations.heard, clock=clock)
        bus = await violations.guard(connecting, discard=Bus.close)  # closed on a late Ctrl-C
        return cls(bus, violations, tenant=tenant or _tenant_of_inbox(settings.inbox_prefix))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._bus.close()

    @property
    def connection_lost(self) -> bool:
        """The connection is down now (reconnecting, or given up after ``reconnect_for_s``)."""
        return self._bus.connection_lost

    def lost(self) -> BusUnavailable:
        """The error saying the connection to the server (named by its URL) was lost."""
        return self._bus.lost()

    async def provision(self) -> list[Change]:
        """Converge every catalogue stream, KV bucket and object store to the catalogue (needs
        the provisioner's or an operator's credentials; services create nothing): missing
        streams, buckets and stores created, drifted ones updated (a planted source removed), a
        mirror whose origin or filter differs re-created from its origin. What it changed
        (`seedance.core.kv.provision`).
        """
        return await provision(self._bus)

    # --- jobs -------------------------------------------------------------------------------

    async def submit_job(
        self,
        tenant: str,
        job_id: str,
        *,
        at: datetime | None = None,
        wait_s: float | None = None,
        **request: Unpack[JobRequest],
    ) -> JobOutcome:
        """Publish ``job.submitted.v1``; raises ``ValueError`` naming a bad field and value.

        ``request`` is what `job_submitted` takes (GPUs, shares, memory, gang, priority, kind,
        labels), with its defaults. With ``wait_s``: waits that long for the slicer's answer
        (a placement, or why the job waits) and raises ``JobRejectedError`` for a rejection,
        ``NoDecision`` for silence (an identical re-submit of a live job is not answered: it
        changes nothing). ``at`` is a claim, kept for the record: the slicer takes the
        server's receive time (never earlier than its latest decision) whatever it says.
        """
        event = job_submitted(tenant, job_id, at=at, clock=self._clock, **request)
        return await self.send_job_event(event, wait_s=wait_s)

    async def job_started(
        self, tenant: str, job_id: str, *, at: datetime | None = None, wait_s: float | None = None
    ) -> JobOutcome:
        """Publish ``job.started.v1``; with ``wait_s``, a rejection (unknown or ended job)
        within that time is raised; silence is success (a known job's start is not answered)."""
        return await self._lifecycle("started", tenant, job_id, at, wait_s)

    async def finish_job(
        self, tenant: str, job_id: str, *, at: datetime | None = None, wait_s: float | None = None
    ) -> JobOutcome:
        """Publish ``job.finished.v1``; with ``wait_s``, wait for its ``JobReleased``."""
        return await self._lifecycle("finished", tenant, job_id, at, wait_s)

    # The four lifecycle verbs are deliberately parallel public methods (one per event, each
    # with its own docstring and reply) over one `_lifecycle`.
    async def fail_job(
        self,
        tenant: str,
        job_id: str,
        reason: str = "",
        *,
        at: datetime | None = None,
        wait_s: float | None = None,
    ) -> JobOutcome:
        """Publish ``job.failed.v1`` with its ``reason``; with ``wait_s``, its ``JobReleased``."""
        return await self._lifecycle("failed", tenant, job_id, at, wait_s, reason=reason)

    async def cancel_job(
        self,
        tenant: str,
        job_id: str,
        reason: str = "",
        *,
        at: datetime | None = None,
        wait_s: float | None = None,
    ) -> JobOutcome:
        """Publish ``job.cancelled.v1`` with its ``reason``; with ``wait_s``, wait for its
        ``JobReleased`` (a job cancelled before it was placed is released unplaced)."""
        return await self._lifecycle("cancelled", tenant, job_id, at, wait_s, reason=reason)

    async def _lifecycle(
        self,
        kind: str,
        tenant: str,
        job_id: str,
        at: datetime | None,
        wait_s: float | None,
        **extra: str,
    ) -> JobOutcome:
        return await self.send_job_event(
            job_event(kind, tenant, job_id, at=at, clock=self._clock, **extra), wait_s=wait_s
        )

    async def send_job_event(self, event: JobEvent, *, wait_s: float | None = None) -> JobOutcome:
        """Publish a job event built by `job_submitted` or `job_event` (see `submit_job`)."""
        return await self._send(event, KIND_OF[type(event)], wait_s)

    async def _send(self, event: Any, kind: str, wait_s: float | None) -> JobOutcome:
        subject = jobs.subject(event.tenant, kind)
        if wait_s is None:
            await self._guarded(self._bus.publish(subject, event), "publishing to", subject)
            return JobOutcome(event=event)
        answers = slicing.tenant_wildcard(event.tenant)
        # The watch exists before the event is published, so its answer cannot be missed.
        async with self._watch(_SLICING_STREAM, answers, False, tenant=event.tenant) as w:
            await self._guarded(self._bus.publish(subject, event), "publishing to", subject)
            try:
                async with asyncio.timeout(wait_s):
                    return await self._guarded(self._answer(w, event))
            except TimeoutError:
                if isinstance(event, JobStarted):
                    return JobOutcome(event=event)  # not rejected: a known job's start
                raise NoDecision(
                    f"no answer from the slicer on job {event.job_id!r} of tenant "
                    f"{event.tenant!r} within {wait_s:g} s: is the slicer running? (an "
                    "identical re-submit of a live job changes nothing and is not answered)"
                ) from None

    async def _answer(self, w: Watch, event: Any) -> JobOutcome:
        while True:
            try:
                ev = decode(await w.next_data(), SlicingEvent)
            except DecodeError:
                continue  # another version's event: not this call's answer
            if getattr(ev, "cause_id", None) != event.id:
                continue
            if isinstance(ev, JobRejected):
                raise JobRejectedError(ev)
            if isinstance(ev, Placement | Unschedulable) and isinstance(event, JobSubmitted):
                return JobOutcome(event=event, decision=ev)
            if isinstance(ev, JobReleased):
                return JobOutcome(event=event, decision=ev)

    async def _guarded(self, op: Awaitable[_T], action: str = "", subject: str = "") -> _T:
        """``op``, unless the server refuses a permission meanwhile: then PermissionRefused
        naming the subject (a refused publish would otherwise look like a time-out).

        nats-py hands the server's refusal over in lower case, so the subject the refusal
        names is that of ``action`` on ``subject`` when given (what this call was doing)."""
        try:
            return await self._violations.guard(op)
        except PermissionRefused as heard_exc:
            heard = heard_exc
        # A second refusal of this call (another scope: inbox, request) is heard here, not later
        with contextlib.suppress(nats.errors.Error):  # a connection down holds no refusal
            await flushed(self._bus.nc)
        if subject:
            raise PermissionRefused(
                f"the server refused {action} {subject!r} to this user ({heard.server_text}); "
                + TENANT_GRANTS,
                subject,
            ) from None
        raise heard

    # --- costs ------------------------------------------------------------------------------

    async def cost_history(self, tenant: str, *, timeout_s: float = 60.0) -> list[Any]:
        """Every cost event the tenant's stream holds now (entries, reports, alerts, pauses)."""
        check_tenant(tenant)
        return await self._cost_history(costs.tenant_wildcard(tenant), timeout_s, tenant)

    async def fleet_cost_history(self, *, timeout_s: float = 60.0) -> list[Any]:
        """Every cost event of the fleet: all tenants' and the idle lines of every node
        (``seedance.ledger.idle.<node>``). Needs operator credentials: a tenant's user is
        refused (:class:`PermissionRefused`)."""
        return await self._cost_history(None, timeout_s)

    async def _cost_history(
        self, filter_subject: str | None, timeout_s: float, tenant: str | None = None
    ) -> list[Any]:
        async with asyncio.timeout(timeout_s):
            held = await self._history("SEEDANCE_COSTS", filter_subject, tenant)
        return [current(decode(data, CostEvent)) for data in held]

    async def _history(
        self, stream: str, filter_subject: str | None, tenant: str | None = None
    ) -> list[bytes]:
        """Every message ``stream`` holds under ``filter_subject`` (``tenant``'s) now, in stream
        order (the caller bounds the time)."""
        out: list[bytes] = []
        async with self._watch(stream, filter_subject, True, tenant=tenant) as w:
            if await w.is_empty():
                return out
            while True:
                msg = await w.next_msg()
                out.append(bytes(msg.data))
                if msg.metadata.num_pending == 0:
                    return out

    async def allocation(
        self,
        window: str,
        *,
        tenant: str | None = None,
        aggregate: str = "tenant",
        include_idle: bool = False,
        share_idle: bool = False,
        rightsize: bool = False,
        timeout_s: float = 30.0,
    ) -> AllocationAnswer:
        """The cost-ledger's allocation (OpenCost ``/allocation``) of ``tenant``, or of the
        fleet for ``None`` (operator credentials), in ``window`` (``7d``, ``24h``, or
        ``start,end`` RFC 3339), grouped by ``aggregate`` (tenant, job, node, gpu_model).

        ``include_idle`` (fleet only) adds idle as rows of its own; ``share_idle`` charges
        each node-window's idle to the jobs beside it (a tenant gets its own jobs' shares);
        ``rightsize`` adds the ledger's right-sizing recommendations for the jobs in the window
        (``AllocationAnswer.rightsizing``, priced with the ledger's price book). The answer
        names the ``SEEDANCE_COSTS`` sequence it is as of (docs/cost-ledger.md).

        Raises:
            PermissionRefused: another tenant's or the fleet's, with a tenant's credentials.
            AllocationRefused: a bad parameter, named (a ``ValueError``).
            NoLedger: no cost-ledger answers; TimeoutError: none within ``timeout_s``.
        """
        subject = api.allocation(tenant)
        query = AllocationQuery(
            window=window, aggregate=aggregate, include_idle=include_idle,
            share_idle=share_idle, rightsize=rightsize,
        )  # fmt: skip
        asked = ask(self._bus.nc, subject, msgspec.json.encode(query), tenant, timeout_s)
        try:
            msg = await self._guarded(asked, "asking", subject)
        except nats.errors.NoRespondersError:
            raise NoLedger(
                f"no cost-ledger answers on {subject!r}: is one running (and its NATS user "
                "rendered with the allocation API's permissions)?"
            ) from None
        except nats.errors.TimeoutError:
            raise TimeoutError(f"no allocation answer on {subject!r} in {timeout_s:g} s") from None
        return read_reply(msg.data)

    # --- what became of jobs ----------------------------------------------------------------

    async def job_statuses(
        self, tenant: str, *, job_id: str | None = None, timeout_s: float = 60.0
    ) -> list[JobStatus]:
        """What became of each of ``tenant``'s jobs (only ``job_id`` when given; an empty list
        when the bus knows nothing of it): placement, waiting reason, rejection or release,
        and the cost so far.

        Read from what the server already lets a tenant read, with no service to ask: its own
        slicer decisions (``seedance.slicing.<t>.*``, in stream order) and its own cost stream
        (``seedance.costs.<t>.*``), each through a consumer of this call's own whose filter is
        in the API subject. Another tenant's are refused (`PermissionRefused`). Raises
        ``TimeoutError`` when the two streams are not read within ``timeout_s``.

        Why this way: a tenant may publish only its five job subjects (so no request reaches a
        slicer, which answers none anyway), may not get stream messages directly (``STREAM.
        MSG.GET``, ``DIRECT.GET``), and nats-py's ordered consumer first asks for stream names
        and creates its consumer without the filter in the subject, both refused. The whole
        history is read (no job token in the subjects); ``make bench-cli-status`` measures it.
        """
        check_tenant(tenant)
        if job_id is not None:
            check_token("job_id", job_id)
        async with asyncio.timeout(timeout_s):
            decisions = await self._history(
                _SLICING_STREAM, slicing.tenant_wildcard(tenant), tenant
            )
            cost_events = await self._history(
                "SEEDANCE_COSTS", costs.tenant_wildcard(tenant), tenant
            )
        return fold_statuses(
            tenant,
            _decoded(decisions, SlicingEvent),
            (current(ev) for ev in _decoded(cost_events, CostEvent)),
            job_id=job_id,
        )

    async def costs(
        self, tenant: str, *, from_start: bool = True
    ) -> AsyncGenerator[CostEvent, None]:
        """Yield the tenant's cost events (entries, job reports, alerts, pauses) as they come.

        ``from_start`` replays what the stream holds first; otherwise only new events.
        """
        check_tenant(tenant)
        async with self._watch(
            "SEEDANCE_COSTS", costs.tenant_wildcard(tenant), from_start, tenant=tenant
        ) as w:
            while True:
                yield current(decode(await w.next_data(), CostEvent))

    def _watch(
        self,
        stream: str,
        filter_subject: str | None,
        from_start: bool,
        *,
        tenant: str | None = None,
    ) -> contextlib.AbstractAsyncContextManager[Watch]:
        """A push consumer on ``stream`` (`seedance.sdk.watch.watching`): under one of the
        tenant's own names when this client is ``tenant``'s user reading its own streams."""
        own = tenant if tenant is not None and tenant == self._tenant else None
        return watching(
            self._bus, self._guarded, stream, filter_subject, from_start, own_tenant=own
        )

    # --- graph compiler ---------------------------------------------------------------------

    async def compile_model(
        self,
        tenant: str,
        name: str,
        model_bytes: bytes,
        policy: PrecisionPolicy | None = None,
        *,
        target: str = "cpu",
        request_id: str | None = None,
        timeout_s: float = 1800.0,
    ) -> CompileResult:
        """Upload ``model_bytes``, ask the graph compiler to compile it, and wait for the result.

        The model goes in chunks on the tenant's own ``seedance.models.<t>.upload.<request>.<n>``
        (a tenant's user has no object store; `seedance.sdk.model_chunks`). The result says
        ``ok`` with the artifact's place (``artifact_chunks`` on the tenant's artifact subjects,
        or ``artifact_url``) and its report, or ``ok=False`` with ``error_kind``/``error``
        naming why. ``fetch_artifact`` reads the artifact. Raises ``PermissionRefused`` naming
        the subject (another tenant's, or a user without the grant), ``TimeoutError`` when no
        result comes within ``timeout_s`` (is a graph compiler running?).
        """
        check_tenant(tenant)
        check_token("model name", name)
        request_id = request_id or uuid.uuid4().hex
        check_token("request_id", request_id)
        chunks = await upload_model(self._bus, self._guarded, tenant, request_id, model_bytes)
        request = chunked_request(
            tenant,
            request_id,
            model_name=name,
            chunks=chunks,
            sha256=hashlib.sha256(model_bytes).hexdigest(),
            policy=policy or PrecisionPolicy(),
            at=self._clock.now(),
            target=target,
        )
        return await self._request_compile(request, timeout_s)

    async def _request_compile(self, request: CompileRequest, timeout_s: float) -> CompileResult:
        subject = graph.subject(request.tenant, "result")
        asked = graph.subject(request.tenant, "request")
        # The consumer exists before the request is published, so the result cannot be missed.
        async with (
            self._watch("SEEDANCE_GRAPH", subject, False, tenant=request.tenant) as w,
            asyncio.timeout(timeout_s),
        ):
            await self._guarded(self._bus.publish(asked, request), "publishing to", asked)
            while True:
                ev = decode(await self._guarded(w.next_data()), GraphEvent)
                if isinstance(ev, CompileResult) and ev.request_id == request.request_id:
                    return ev

    async def fetch_artifact(self, result: CompileResult, *, timeout_s: float = 300.0) -> bytes:
        """The compiled model of an ``ok`` result, checked against its sha256."""
        if not result.ok:
            raise ValueError(f"compile failed ({result.error_kind}): {result.error}")
        if result.artifact_chunks:
            chunks = artifact_filter(result.tenant, result.request_id)
            async with (
                self._watch(models.STREAM, chunks, True, tenant=result.tenant) as w,
                asyncio.timeout(timeout_s),
            ):
                data = await read_artifact(w, result.request_id, result.artifact_chunks)
        elif result.artifact_object:
            store = await ensure_object_store(self._bus, GRAPH_MODELS_STORE)
            buf = io.BytesIO()
            await store.get(result.artifact_object, writeinto=buf)
            data = buf.getvalue()
        elif result.artifact_url:
            data = await asyncio.to_thread(_read_url, result.artifact_url)
        else:
            raise ValueError("the result names no artifact")
        if result.artifact_sha256 and hashlib.sha256(data).hexdigest() != result.artifact_sha256:
            raise ValueError("artifact does not match its sha256")
        return data


def _decoded(held: list[bytes], family: Any) -> Iterator[Any]:
    """The events of ``family`` in ``held``; one of a later version, which this SDK cannot
    read, is skipped rather than failing the whole read."""
    for data in held:
        try:
            yield decode(data, family)
        except DecodeError:
            continue


def _read_url(url: str) -> bytes:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        with open(urllib.request.url2pathname(parsed.path), "rb") as f:
            return f.read()
    with urllib.request.urlopen(url, timeout=60) as r:
        return bytes(r.read())
