"""Triton's ModelStreamInfer through the gateway: the stream proxied to one replica, and each
request on it answered by its first response.

Owns: the proxy loop of one stream (requests up, responses down, layouts converted per request)
and the ledger of the stream's requests still awaiting their first response (`StreamLedger`).
For an LLM served over Triton's decoupled streaming the first response to a request is its
first token, the time to first token the replica planner sizes for, so each request's outcome
is its first response (or error); later responses of the same request are not new outcomes.

Matching a response to its request: by the response's id (Triton copies the request's `id`
into every response to it, and into an error response where the request carried one); a
response without an id answers the oldest unanswered request sent without one (by order). So a
decoupled model's later responses to an id-less request are taken as the first of the next
id-less request when that one was already sent: clients that interleave requests on a stream
tell their responses apart by id, and so does this ledger. An id names one request at a time:
a request whose id an earlier request on the stream still holds (no response to it flagged
`triton_final_response` yet) is refused, since the earlier one's later responses would be taken
as the new one's first (Triton itself allows the reuse; a response cannot say which it answers).

A later request goes to the stream's replica only where that replica may be sent its model (of
the stream's owner, fixed by the call's tenant header): a stream never carries a model to a
replica the gateway would not choose for it, nor counts it there.

Must not: choose the replica or report anything itself (the gateway passes its `routed` /
`done` reporters in), fail a stream over (a stream is stateful), or read a response's tensors.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from tritonclient.grpc import service_pb2

from seedance.router.gateway.outcomes import StatusClass, status_class
from seedance.router.gateway.replicas import Replica
from seedance.router.gateway.settings import ModelRoute
from seedance.router.gateway.tensors import LayoutError, convert_request_layouts

__all__ = ["StreamFailure", "StreamLedger", "StreamRequest", "proxy_stream"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamRequest:
    """One request sent on a stream and not yet answered."""

    model: str
    request_id: str
    # The gateway's monotonic clock when it received the request.
    arrival_s: float


class StreamLedger:
    """A stream's requests awaiting their first response, oldest first, and the ids still held
    by a request that may answer again."""

    def __init__(self) -> None:
        self._pending: list[StreamRequest] = []
        # Non-empty ids of requests sent and not yet answered with `triton_final_response`.
        # Without that flag (an old Triton, or a decoupled model's final flag sent with no
        # response and the client not asking for it) an id stays held for the stream's life.
        self._held: set[str] = set()
        # Why a request the gateway refused ended the stream (INVALID_ARGUMENT's details): the
        # client's error.
        self.refused: str | None = None

    def __len__(self) -> int:
        return len(self._pending)

    def sent(self, request: StreamRequest) -> None:
        self._pending.append(request)
        if request.request_id:
            self._held.add(request.request_id)

    def reuse_refusal(self, request_id: str) -> str | None:
        """Why a request with `request_id` must be refused, or None: its id is still held by an
        earlier request on the stream."""
        if request_id not in self._held:
            return None
        return (
            f"request id {request_id!r} is still in use on this stream (no response to its "
            "earlier request was flagged triton_final_response yet): responses are matched to "
            "requests by id, so give each request still answering its own id"
        )

    def answer(
        self, response: service_pb2.ModelStreamInferResponse
    ) -> tuple[StreamRequest, StatusClass] | None:
        """The request `response` is the first answer to, and its status class; None when it
        answers none still pending (a later response of an answered request).

        An error inside a stream carries a message and no status code (Triton sends only the
        text), so the gateway cannot tell a malformed request from a failed model: it is a
        `server_error`, a miss, never a `client_error`."""
        request_id = response.infer_response.id
        final = response.infer_response.parameters.get("triton_final_response")
        if request_id and final is not None and final.bool_param:
            self._held.discard(request_id)
        for i, pending in enumerate(self._pending):
            if pending.request_id == request_id:
                del self._pending[i]
                return pending, "server_error" if response.error_message else "ok"
        return None

    def unanswered(self) -> list[StreamRequest]:
        """The requests still pending; forgets them."""
        pending, self._pending = self._pending, []
        return pending


class StreamFailure(Exception):
    """The stream ended with this gRPC status for the client."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _upstream_failure(replica: str, error: grpc.aio.AioRpcError) -> StreamFailure:
    code = error.code()
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return StreamFailure(
            code,
            f"replica {replica!r} does not serve ModelStreamInfer (its backend has no "
            "streaming); use ModelInfer, or route the model to a backend that streams",
        )
    return StreamFailure(code, f"replica {replica!r}: {error.details() or code.name}")


async def _upstream(
    ledger: StreamLedger,
    first_message: service_pb2.ModelInferRequest,
    requests: AsyncIterator[service_pb2.ModelInferRequest],
    *,
    replica: Replica,
    owner: str,
    routes: dict[str, ModelRoute],
    monotonic_s: Callable[[], float],
    routed: Callable[[StreamRequest], None],
    done: Callable[[StreamRequest, StatusClass, float], None],
    refuse: Callable[[str], None],
) -> AsyncGenerator[service_pb2.ModelInferRequest]:
    """The requests as sent upstream: the first (already in the ledger), then each later one
    checked, converted, reported `routed` and entered in the ledger. One the gateway refuses
    (`_refusal`) is the client's error: reported `client_error`, it ends the stream (`refuse`).
    Not by raising: gRPC's consumer of a request iterator swallows its error and leaves the call
    open, so the client would wait for its deadline."""
    yield first_message
    async for message in requests:
        request = StreamRequest(
            model=message.model_name, request_id=message.id, arrival_s=monotonic_s()
        )
        refusal = _refusal(ledger, message, replica=replica, owner=owner, routes=routes)
        if refusal is not None:
            done(request, "client_error", monotonic_s() - request.arrival_s)
            refuse(refusal)
            return
        routed(request)
        ledger.sent(request)
        yield message


def _refusal(
    ledger: StreamLedger,
    message: service_pb2.ModelInferRequest,
    *,
    replica: Replica,
    owner: str,
    routes: dict[str, ModelRoute],
) -> str | None:
    """Why a later request on the stream is refused (INVALID_ARGUMENT's details), or None once
    it is converted in place: a model the stream's replica may not be sent (of the stream's
    owner), an id an earlier request still holds, a layout the gateway cannot convert."""
    model = message.model_name
    if not replica.serves(model, owner):
        whose = f"tenant {owner}'s" if owner else "the shared pool's"
        return (
            f"model {model!r} is not served by this stream's replica {replica.name!r} "
            f"({whose}): a stream stays on the replica chosen for its first request; "
            "open another stream for this model"
        )
    reused = ledger.reuse_refusal(message.id)
    if reused is not None:
        return reused
    route = routes.get(model)
    if route is not None and route.input_layouts:
        try:
            convert_request_layouts(message, route.input_layouts)
        except LayoutError as error:
            return str(error)
    return None


async def proxy_stream(
    first: StreamRequest,
    first_message: service_pb2.ModelInferRequest,
    requests: AsyncIterator[service_pb2.ModelInferRequest],
    *,
    replica: Replica,
    owner: str,
    routes: dict[str, ModelRoute],
    timeout_s: float | None,
    monotonic_s: Callable[[], float],
    routed: Callable[[StreamRequest], None],
    done: Callable[[StreamRequest, StatusClass, float], None],
) -> AsyncGenerator[service_pb2.ModelStreamInferResponse]:
    """Proxy one stream to `replica` (chosen for `owner`'s `first`): `first` (already routed
    and converted) and every later request (checked and converted, then `routed`); each
    request's first response or error is `done` with its status class and its time from
    arrival. When the stream ends, the requests still unanswered are `done` with how it ended:
    `cancelled` (the client went away), the upstream status's class, `client_error` (a request
    the gateway refused ended it: the client's own request), or `server_error` (the replica
    closed the stream without answering them). Raises `StreamFailure` with the status the
    client gets."""
    ledger = StreamLedger()
    ledger.sent(first)
    end: StatusClass = "cancelled"

    def refuse(details: str) -> None:
        ledger.refused = details
        call.cancel()  # assigned before gRPC reads the first request

    # Ended here, before the client hears how the stream ended: its replica's outstanding count
    # and its requests' outcomes are settled by then.
    replica.begin(first.model)
    try:
        upstream = _upstream(
            ledger, first_message, requests, replica=replica, owner=owner,
            routes=routes, monotonic_s=monotonic_s, routed=routed, done=done, refuse=refuse,
        )  # fmt: skip
        call = replica.stub.ModelStreamInfer(upstream, timeout=timeout_s)
        async for response in call:
            answered = ledger.answer(response)
            if answered is not None:
                request, status = answered
                done(request, status, monotonic_s() - request.arrival_s)
            yield response
        end = "server_error"  # closed by the replica with requests it never answered
    except grpc.aio.AioRpcError as error:
        if ledger.refused is not None:
            raise _refused(ledger.refused) from None
        end = status_class(error.code())
        raise _upstream_failure(replica.name, error) from None
    except asyncio.CancelledError:
        # The upstream call cancelled by `refuse`, not this handler by gRPC (the client gone).
        task = asyncio.current_task()
        if ledger.refused is None or (task is not None and task.cancelling()):
            raise
        raise _refused(ledger.refused) from None
    finally:
        replica.end(first.model, latency_s=None)
        now_s = monotonic_s()
        for request in ledger.unanswered():
            status = "client_error" if ledger.refused is not None else end
            done(request, status, now_s - request.arrival_s)


def _refused(details: str) -> StreamFailure:
    return StreamFailure(grpc.StatusCode.INVALID_ARGUMENT, details)
