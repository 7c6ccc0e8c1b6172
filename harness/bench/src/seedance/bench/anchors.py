"""The bare-client anchors the bus benches quote their figures against, measured in the same run.

A throughput or latency measured on a shared machine means little alone: the same bench ran 3x
slower on one machine of this kind than on another, and the bare nats-py client moved with it.
So each bench measures, on the same server and the same messages, what plain nats-py does with
no Seedance code in the way, and prints its figure as a ratio to that:

- ``bare_fetch_ack_rate``: a pull consumer that fetches a batch and acks each message, nothing
  else (the client's ceiling for a consumer that handles nothing);
- ``relay_latencies``: a two-hop relay over JetStream, publish → hop → hop → reader, where each
  hop is a separate Python process (like the slicer and the ledger) that fetches one message,
  publishes it onward and acks it. It is the floor of the job → cost path: the same hops and
  publishes with no decoding, deciding or billing.

Owns only the anchors; the benches own their own figures. Must not import any service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

import nats
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.client import JetStreamContext

__all__ = ["bare_fetch_ack_rate", "relay_latencies"]

RELAY_STREAM = "BENCH_RELAY"
_HOPS = (("relay.in", "relay.mid", "hop1"), ("relay.mid", "relay.out", "hop2"))


async def bare_fetch_ack_rate(
    js: JetStreamContext, stream: str, subject: str, n: int, durable: str, batch: int = 100
) -> float:
    """Messages per second of a bare fetch(``batch``) + ack loop over the first ``n`` of a stream.

    Timed from the first fetch to the last ack; the consumer is deleted afterwards.
    """
    sub = await js.pull_subscribe(
        subject,
        durable=durable,
        stream=stream,
        config=js_api.ConsumerConfig(max_ack_pending=-1, deliver_policy=js_api.DeliverPolicy.ALL),
    )
    got = 0
    t0 = time.perf_counter()
    try:
        while got < n:
            try:
                msgs = await sub.fetch(min(batch, n - got), timeout=1.0)
            except TimeoutError:
                continue
            for m in msgs:
                await m.ack()
            got += len(msgs)
        return n / (time.perf_counter() - t0)
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(Exception):  # the consumer may already be gone with its sub
            await js.delete_consumer(stream, durable)


async def _hop(url: str, src: str, dst: str, durable: str) -> None:
    """One relay hop: fetch one message at a time, publish it onward (acked), then ack it."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(src, durable=durable, stream=RELAY_STREAM)
    print("ready", flush=True)
    while True:
        try:
            msgs = await sub.fetch(1, timeout=5.0)
        except TimeoutError:
            continue
        for m in msgs:
            await js.publish(dst, m.data)
            await m.ack()


async def relay_latencies(url: str, n: int, warmup: int = 5) -> list[float]:
    """Milliseconds from publishing a message to reading it after two hops, one at a time."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=RELAY_STREAM, subjects=["relay.>"])
    hops = []
    try:
        for src, dst, durable in _HOPS:
            await js.add_consumer(
                RELAY_STREAM, js_api.ConsumerConfig(durable_name=durable, filter_subject=src)
            )
            # A hop's errors go to the bench's own stderr.
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "seedance.bench.anchors", url, src, dst, durable,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            hops.append(proc)
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            if line.strip() != "ready":
                raise RuntimeError(f"relay hop {durable} did not start (said {line!r})")
        arrived: asyncio.Queue[float] = asyncio.Queue()

        async def on_out(_msg: Msg) -> None:
            arrived.put_nowait(time.perf_counter())

        await nc.subscribe("relay.out", cb=on_out)
        out: list[float] = []
        for i in range(n + warmup):
            t0 = time.perf_counter()
            await js.publish("relay.in", b"x" * 200)  # about a job event's size
            t1 = await asyncio.wait_for(arrived.get(), 30)
            if i >= warmup:
                out.append((t1 - t0) * 1000)
        return out
    finally:
        for proc in hops:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
        await nc.close()


def _main() -> None:
    p = argparse.ArgumentParser(description="one hop of the bare relay anchor")
    p.add_argument("url")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("durable")
    a = p.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_hop(a.url, a.src, a.dst, a.durable))


if __name__ == "__main__":
    _main()
