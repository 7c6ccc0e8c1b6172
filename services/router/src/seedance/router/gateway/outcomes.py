"""What an upstream gRPC status means for the gateway: retry elsewhere or not, and its label.

Owns: the one decision of which failures are safe to retry on another replica, and the closed
set of status classes used as metric labels. Pure.

Must not: retry anything that may already have run with a visible effect, or that another
replica would reject the same way.
"""

from __future__ import annotations

from typing import Literal

import grpc

__all__ = ["StatusClass", "is_retryable", "status_class"]

StatusClass = Literal["ok", "client_error", "unavailable", "deadline", "cancelled", "server_error"]

# UNAVAILABLE is what gRPC reports for connection refused/reset, a server shutting down, and
# a replica that is not ready: the request did not reach a model, or the replica died under it.
# Inference on a stateless model is a pure function of its inputs, so running it again elsewhere
# is safe (sequence/stateful requests are excluded by the gateway, see `server.py`).
# Not retried: DEADLINE_EXCEEDED (the client's time is spent), INVALID_ARGUMENT / NOT_FOUND /
# FAILED_PRECONDITION (every replica would answer the same), INTERNAL / UNKNOWN (the model may
# have run and failed; a second try doubles the cost of a poison request), CANCELLED.
_RETRYABLE: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})

_CLIENT_ERRORS: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def is_retryable(code: grpc.StatusCode) -> bool:
    """True when a request that failed with `code` may be sent to another replica."""
    return code in _RETRYABLE


def status_class(code: grpc.StatusCode) -> StatusClass:
    """The metric label for a final or upstream status."""
    if code == grpc.StatusCode.OK:
        return "ok"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "deadline"
    if code == grpc.StatusCode.CANCELLED:
        return "cancelled"
    if code in _CLIENT_ERRORS:
        return "client_error"
    return "server_error"
