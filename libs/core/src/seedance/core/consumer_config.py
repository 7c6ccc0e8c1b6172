"""The JetStream consumer a catalogue `ConsumerSpec` makes: where it starts, its config, and
the create request's subject (`Bus.ensure_consumer` sends it). Must not send anything but the
info of the consumer it starts."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from seedance.events.subjects import ConsumerSpec

__all__ = ["consumer_config", "consumer_start"]


async def consumer_start(
    js: JetStreamContext, spec: ConsumerSpec
) -> tuple[js_api.DeliverPolicy, int | None]:
    """Where a created (or updated) consumer starts: its ``start_seq``, else the stream's
    next message for a ``deliver_new`` one (an existing one keeps the start it was made
    with: the server refuses to change it), else the stream's first."""
    if spec.start_seq:
        return js_api.DeliverPolicy.BY_START_SEQUENCE, spec.start_seq
    if not spec.deliver_new:
        return js_api.DeliverPolicy.ALL, None
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        return js_api.DeliverPolicy.NEW, None
    had = info.config
    return had.deliver_policy or js_api.DeliverPolicy.ALL, had.opt_start_seq


def consumer_config(
    spec: ConsumerSpec, deliver: js_api.DeliverPolicy, start_seq: int | None
) -> tuple[js_api.ConsumerConfig, str]:
    """``spec``'s consumer config starting at (``deliver``, ``start_seq``), and the subject of
    its create request."""
    config = js_api.ConsumerConfig(
        durable_name=spec.durable if spec.acked else None,
        name=spec.durable,
        ack_policy=js_api.AckPolicy.EXPLICIT if spec.acked else js_api.AckPolicy.NONE,
        deliver_policy=deliver,
        opt_start_seq=start_seq,
        ack_wait=spec.ack_wait_s if spec.acked else None,
        max_deliver=spec.max_deliver if spec.acked else None,
        max_ack_pending=spec.max_ack_pending if spec.acked else None,
        backoff=list(spec.backoff_s) or None,
        inactive_threshold=spec.inactive_s or None,
    )
    if len(spec.filter_subjects) == 1:
        config.filter_subject = spec.filter_subjects[0]
    elif spec.filter_subjects:
        config.filter_subjects = list(spec.filter_subjects)
    # Since 2.10 a create on an existing durable with a changed config is an update.
    # nats-py's create subject: the filter in it where there is one (a permission holds it).
    create = f"$JS.API.CONSUMER.CREATE.{spec.stream}.{spec.durable}"
    create += f".{config.filter_subject}" if config.filter_subject else ""
    return config, create
