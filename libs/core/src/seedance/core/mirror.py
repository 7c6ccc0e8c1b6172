"""Whether a mirror stream has copied what its origin holds, and a reader's wait until it has.

A reader of a mirror that counts "nothing more pending on my consumer" as "caught up" is caught
up with the mirror, not with the origin: a mirror created (or created again) while the origin
holds history copies it in the background, and a reader bound meanwhile ends its replay early.
nats-server (2.10 to 2.15) reports a mirror's progress in its stream info only (``mirror``):

* ``active``: nanoseconds since the mirror last heard from its origin (a delivery, an idle
  heartbeat), ``-1`` until it first has (the origin missing, its consumer not set up yet);
* ``lag``: the origin's messages on the mirror's filter still pending after the last one
  delivered (0 before any delivery);
* ``error``: why its last consumer setup failed (cleared by the next that succeeds).

No origin-side sequence is reported, and a filtered mirror's last sequence stops at its last
copied message while the origin goes on with others, so the sequences cannot say more. One gap
the server leaves: between its consumer's setup (``active`` set) and the first delivery, a
mirror reports lag 0 for an instant (milliseconds) whatever the origin holds; `await_mirror`
looks twice, ``poll_s`` apart. Only the mirror's own copy is waited for: an origin that is
itself still copying its sources (the ledger's input) is caught up with as far as it got.

Owns reading those fields (`mirror_behind`, pure) and waiting on them (`await_mirror`); must
not create, change or delete a stream (a service's user may not: docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable

from nats.js.api import StreamInfo

from seedance.core.bus import Bus
from seedance.core.logs import get_logger
from seedance.events.subjects import STREAMS

__all__ = ["MIRROR_LINE_EVERY_S", "MIRROR_POLL_S", "await_mirror", "mirror_behind"]

log = get_logger(__name__)

#: How often a reader waiting on a mirror asks for its info: the server's own heartbeat to a
#: mirror is 1 s, so its info moves no faster than this while it is idle.
MIRROR_POLL_S = 0.5
#: One ``stream_mirror_behind`` line when the wait starts, then one a minute while it lasts.
MIRROR_LINE_EVERY_S = 60.0


def mirror_behind(info: StreamInfo) -> str | None:
    """Why the mirror ``info`` describes has not copied its origin's messages yet, or None when
    it has (lag 0 since it last heard from its origin, no setup error). A stream that is no
    mirror is its own origin: None."""
    m = info.mirror
    if m is None:
        return None
    if m.error:
        description = m.error.get("description", m.error)
        return f"its copy of {m.name} failed: {description} (the server retries it)"
    if m.active is None or m.active < 0:
        return f"it has not heard from its origin {m.name} yet"
    if m.lag:
        return f"it has {m.lag} message(s) of {m.name} still to copy"
    return None


async def await_mirror(
    bus: Bus,
    stream: str,
    *,
    on_behind: Callable[[str | None], None] | None = None,
    poll_s: float = MIRROR_POLL_S,
) -> StreamInfo:
    """The info of ``stream`` once `mirror_behind` found nothing at two looks ``poll_s`` apart
    (one look for a stream that is no mirror). A missing stream is waited for as at start
    (`Bus.ensure_streams`: the operator's provision creates it), then looked at again.

    Two looks narrow the server's gap (the module's note) to a first delivery slower than
    ``poll_s``: a mirror whose consumer was just set up reports lag 0 before its first delivery,
    which comes within milliseconds and sets the lag to what is pending; the second look sees
    that lag, or a mirror that has copied it.

    Waits as long as the mirror is behind: a reader that went on would act on a part of the
    origin as if it were the whole. Logged once at the start (``stream_mirror_behind``, with the
    reason), once a minute after, and at the end (``stream_mirror_caught_up``); ``on_behind``
    hears each reason read, then None (a readiness or a test follows it)."""
    clock = bus.clock
    since = clock.monotonic()
    last_line: float | None = None
    clear = 0  # consecutive looks that found nothing behind
    while True:
        info = await bus.stream_info(stream)
        if info is None:
            if on_behind is not None:
                on_behind("it does not exist")
            clear = 0
            declared = [s for s in STREAMS if s.name == stream]
            if declared:
                await bus.ensure_streams(declared)
                continue
            await clock.sleep(poll_s)
            continue
        reason = mirror_behind(info)
        if on_behind is not None:
            on_behind(reason)
        if reason is None:
            clear += 1
            if info.mirror is None or clear >= 2:
                if last_line is not None:
                    log.info(
                        "stream_mirror_caught_up",
                        stream=stream,
                        waited_s=clock.monotonic() - since,
                    )
                return info
        else:
            clear = 0
            now = clock.monotonic()
            if last_line is None or now - last_line >= MIRROR_LINE_EVERY_S:
                log.warning(
                    "stream_mirror_behind", stream=stream, reason=reason, waited_s=now - since
                )
                last_line = now
        await clock.sleep(poll_s)
