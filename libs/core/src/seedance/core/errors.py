"""The two kinds of failure a message handler can have, decided once.

* ``InvalidMessage`` (never retryable): the message will never be handled (it does not decode,
  it fails validation, it names an unknown tenant). It is terminated and dead-lettered with the
  reason.
* ``RetryableError``: the effect could not be made durable now (a dependency is down, an event
  it needs has not arrived yet). It is nak'ed with a backoff delay.

Any other exception is a bug; it is treated as retryable until the consumer's ``max_deliver`` is
reached, and then dead-lettered, so that a bug never loses a message and never blocks a stream.
"""

from __future__ import annotations

__all__ = [
    "BusUnavailable",
    "ConsumerRefused",
    "InvalidMessage",
    "NoStream",
    "RetryableError",
    "SeedanceError",
    "ServerTooOld",
    "SettingsError",
    "StartRefused",
    "StreamRefused",
    "StreamlessSubjects",
]


class SeedanceError(Exception):
    """Root of Seedance's own errors."""


class InvalidMessage(SeedanceError):
    """A message that will never be handled. ``kind`` is a short, closed-set label."""

    def __init__(self, reason: str, *, kind: str = "invalid") -> None:
        super().__init__(reason)
        self.kind = kind


class RetryableError(SeedanceError):
    """Try again later; ``delay_s`` overrides the retry policy's delay when given."""

    def __init__(self, reason: str, *, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


class ServerTooOld(SeedanceError):
    """The nats-server is older than Seedance supports."""


class SettingsError(ValueError):
    """A setting the process cannot start with (a ``SEEDANCE_*`` or ``OTEL_*`` variable); the
    message names the variable and the value. Raised before anything connects; a ``main()``
    ends with its message as one line."""


class NoStream(SeedanceError):
    """Nothing stores the subject published to: the streams have not been provisioned."""


class StreamlessSubjects(SeedanceError):
    """`seedance admin provision` failed part-way (``error``, the server's refusal or a call
    that got no answer) and its check after the put-back found job subjects not held by exactly
    one stream: ``subjects`` have no stream the server confirms, so a publish to them finds none
    (`NoStream`) until a run goes through; ``shared`` (subject: its streams) are held by more
    than one (a call the server carried out late raced the put-back), so an event there is
    stored in each until a run goes through."""

    def __init__(
        self, subjects: list[str], error: Exception, shared: dict[str, list[str]] | None = None
    ) -> None:
        shared = shared or {}
        left = []
        if subjects:
            left.append(
                f"{', '.join(subjects)} with no stream the server confirms (publishes there "
                "may find none)"
            )
        if shared:
            each = ", ".join(f"{s} held by {' and '.join(n)}" for s, n in shared.items())
            left.append(f"{each} (an event there is stored in each)")
        super().__init__(
            f"provision failed ({error!r}) and left {'; '.join(left)}: fix what failed and run "
            "`seedance admin provision` again"
        )
        self.subjects = subjects
        self.shared = shared
        self.error = error


class StreamRefused(SeedanceError):
    """The stream refused the message for good: it is full (``max_bytes`` reached on a stream
    that refuses new messages, JetStream err_code 10077) or the message is over its
    ``max_msg_size`` (10054). Re-sending it is refused the same way until room is made."""

    #: JetStream's error codes for the two refusals.
    FULL = 10077
    TOO_LARGE = 10054

    def __init__(self, subject: str, stream_err_code: int, description: str, size: int) -> None:
        if stream_err_code == self.FULL:
            what = (
                f"stream full: the stream storing {subject!r} holds its max_bytes and takes "
                "no new message until retention or an operator frees room "
                f"(server: {description})"
            )
        else:
            what = (
                f"message too large: {size} bytes on {subject!r} is over its stream's "
                f"max_msg_size (server: {description})"
            )
        super().__init__(what)
        self.subject = subject
        self.err_code = stream_err_code


class BusUnavailable(SeedanceError):
    """The first connection to NATS failed within its bound; the message says what to check.

    ``refused`` is True when the server answered and refused the credentials (authorization
    violation), False when nothing usable answered at the URL in time.
    """

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


class StartRefused(SeedanceError):
    """The service will not start here as things stand, for a reason an operator must act on
    (the message says what); ``serve`` ends the process with one ``service_refused`` line and
    ``EXIT_START_REFUSED``, not a traceback."""


class ConsumerRefused(StartRefused):
    """The server refused user ``who`` the creation of a catalogue consumer (``stream``,
    ``durable``; the request ``subject``): it lacks the grant. A service that may run without
    that consumer says why it needs it."""

    def __init__(self, who: str, stream: str, durable: str, subject: str) -> None:
        super().__init__(
            f"NATS refused {who} consumer {durable} of stream {stream} ({subject}): check "
            "this user's permissions (deploy/auth/users.yaml) and that the NATS config (its "
            "accounts' imports, its users) is this release's: roll it out before the services "
            "(docs/deploy.md, 'Upgrade order')"
        )
        self.stream = stream
        self.durable = durable
