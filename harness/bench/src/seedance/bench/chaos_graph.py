"""The tenant compile surface's attack class of `make chaos-tenants` (docs/security.md).

The ``graph`` stage: a fresh nats-server under the generated users (tenants ``acme`` and the
hostile ``mallory``), provisioned, and the graph-compiler as a process under its own user
``graph-compiler`` (``max_model_mib`` 1, so an oversize upload is two chunks). The class
``compile-cross-tenant``: acme compiles a small model alone (the baseline artifact), then
again while mallory

- reads acme's uploads, artifacts, results, the compiler's results bucket and its dead letters
  by every verb the review tried (message and direct gets, stream and consumer info, list,
  purge and delete, consumers filtered on acme's subjects under mallory's name or none, core
  subscriptions), and writes acme's upload, artifact, request and result subjects, the
  compiler's dead letters and results bucket: each must be refused by the server (a
  permissions violation, or an error reply); a reply that is not an error is an effect;
- asks the compiler, on its own request subject, for acme's request id (its own upload of
  that id does not exist; the same request saying ``tenant: acme``), and sends malformed
  uploads: an empty first chunk, a short one, more chunks than the cap, a sha256 mismatch, a
  model over the cap, and the stall flood (many empty chunks by core publish, the request
  for them twice). Each bad request must be answered (``ok=False`` on mallory's result
  subject) and dead-lettered; the one naming acme dead-lettered (tenant mismatch).

Effects: any of mallory's reads or writes not refused; acme's compile failing or its
artifact's sha256 differing from the baseline's; a bad request not answered or not
dead-lettered; the compiler exiting (the stage's exits).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from seedance.bench.chaos_classes import (
    AttackClass,
    ClassOutcome,
    StageRun,
    register,
    register_stage,
)
from seedance.bench.chaos_hostile import HOSTILE
from seedance.core import Bus, BusSettings
from seedance.events import decode, encode
from seedance.events.dlq import DeadLetter
from seedance.events.graph import CompileRequest, CompileResult, PrecisionPolicy, chunk_bytes
from seedance.events.permissions import tenant_user_name
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.subjects import dlq, graph, inbox_prefix, models
from seedance.sdk.client import SeedanceClient
from seedance.sdk.model_chunks import chunked_request
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer, generated_auth, provision
from seedance.testing.waits import eventually, wait_consumer_settled
from seedance.testing.workloads import read_stream

__all__ = ["GraphStage", "compile_cross_tenant", "small_model"]

VICTIM = "acme"
MAX_MODEL_MIB = 1.0
#: Empty chunks of the stall flood (the review's 100k, small: the class runs in CI).
FLOOD_CHUNKS = 2000
FP32 = PrecisionPolicy(priority_order=["fp32"])
#: How long a probe may go without the server's refusal or a reply (a bound, not a figure).
PROBE_TIMEOUT_S = 10.0
COMPILE_TIMEOUT_S = 120.0
MODELS, GRAPH, DLQ = models.STREAM, "SEEDANCE_GRAPH", "SEEDANCE_DLQ"
RESULTS_KV = "seedance-graph-results"


@dataclass
class GraphStage:
    url: str
    passwords: dict[str, str]
    admin: Bus
    acme: SeedanceClient


@contextlib.asynccontextmanager
async def graph_stage(logdir: Path, args: argparse.Namespace) -> AsyncIterator[StageRun]:
    config, passwords = generated_auth([VICTIM, HOSTILE], source=__name__)
    server = NatsServer(config=config)
    run = StageRun(parts=None)
    try:
        # what a deployment runs first: no service user may create a stream (docs/security.md)
        provision(server.url, PROVISIONER, passwords[PROVISIONER])
        procs = ServiceProcesses(server.url, logdir, credentials=passwords)
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=passwords["admin"], name="chaos")
        )
        try:
            user = tenant_user_name(VICTIM)
            acme = await SeedanceClient.connect(server.url, user=user, password=passwords[user])
            try:
                procs.start("graph-compiler", max_model_mib=str(MAX_MODEL_MIB))
                run.parts = GraphStage(server.url, passwords, admin, acme)
                yield run
            finally:
                for key, proc in procs.procs.items():
                    if proc.poll() is not None:
                        run.exits.append(f"{key} exited {proc.returncode} during the graph stage")
                codes = procs.stop_all()
                run.exits += [f"{k} exited {c}" for k, c in codes.items() if c != 0]
                await acme.close()
        finally:
            await admin.close()
    finally:
        server.stop()


register_stage("graph", graph_stage)


def small_model() -> bytes:
    """A small MLP (about 20 KiB, fixed weights: the same bytes every run) with a dead branch
    of 24 MatMuls on the hidden layer. The compiler times the unchanged model against its
    candidate and ships the faster; the candidate prunes the branch (ONNX Runtime runs it),
    so it wins by far on any load and the artifact is the same bytes on every compile (without
    the branch the two ran within noise of each other, and the artifact's sha256 flipped
    between compiles of one model)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2"),
    ]
    prev = "h"
    for i in range(24):
        nodes.append(helper.make_node("MatMul", [prev, "D"], [f"d{i}"], name=f"dead{i}"))
        prev = f"d{i}"
    inits = [
        numpy_helper.from_array((rng.standard_normal((32, 128)) / 6).astype(np.float32), "W1"),
        numpy_helper.from_array((rng.standard_normal((128, 8)) / 8).astype(np.float32), "W2"),
        numpy_helper.from_array((rng.standard_normal((128, 128)) / 12).astype(np.float32), "D"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 8])
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


# --- mallory's reads and writes of acme's subjects ----------------------------------------------


class _Mallory:
    """mallory's raw connection, under its own inbox prefix, keeping the server's errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Any = None

    async def connect(self, url: str, password: str) -> None:
        async def on_error(e: Exception) -> None:
            self.errors.append(str(e).lower())

        self.nc = await nats.connect(
            url,
            user=tenant_user_name(HOSTILE),
            password=password,
            inbox_prefix=inbox_prefix(HOSTILE).encode(),
            error_cb=on_error,
            allow_reconnect=False,
            name="chaos-graph-mallory",
        )

    def violated(self, subject: str) -> bool:
        s = f'"{subject.lower()}"'
        return any("permissions violation" in e and s in e for e in self.errors)


def _reads(rid: str) -> list[tuple[str, str, bytes]]:
    """(what, subject, body) of each read of acme's: every verb of the review's p1."""
    up, art = models.chunk(VICTIM, "upload", rid, 0), models.chunk(VICTIM, "artifact", rid, 0)
    result = graph.subject(VICTIM, "result")
    kv_key = f"$KV.{RESULTS_KV}.{VICTIM}.{rid}"
    mine = f"{HOSTILE}_0"

    def create(stream: str, filt: str | None, subject_filter: str | None = None) -> bytes:
        cfg: dict[str, Any] = {"name": mine, "deliver_subject": "_INBOX_x", "ack_policy": "none"}
        if filt is not None:
            cfg["filter_subject"] = filt
        return json.dumps({"stream_name": stream, "config": cfg}).encode()

    own_art = models.chunk(HOSTILE, "artifact", rid, 0).removesuffix(f".{rid}.0") + ".*.*"
    out = []
    for stream, subject in ((MODELS, up), (MODELS, art), (GRAPH, result), (DLQ, ">")):
        by_subj = json.dumps({"last_by_subj": subject}).encode()
        out += [
            (f"msg get {subject}", f"$JS.API.STREAM.MSG.GET.{stream}", by_subj),
            (f"direct get {subject}", f"$JS.API.DIRECT.GET.{stream}.{subject}", b""),
            (
                f"consumer on {subject}",
                f"$JS.API.CONSUMER.CREATE.{stream}",
                create(stream, subject),
            ),
            (
                f"own-named consumer on {subject}",
                f"$JS.API.CONSUMER.CREATE.{stream}.{mine}.{subject}",
                create(stream, subject),
            ),
        ]
    for stream in (MODELS, GRAPH, DLQ):
        seq = json.dumps({"seq": 1}).encode()
        out += [
            (f"msg get by seq {stream}", f"$JS.API.STREAM.MSG.GET.{stream}", seq),
            (f"direct get by seq {stream}", f"$JS.API.DIRECT.GET.{stream}", seq),
            (f"stream info {stream}", f"$JS.API.STREAM.INFO.{stream}", b"{}"),
            (f"stream purge {stream}", f"$JS.API.STREAM.PURGE.{stream}", b""),
            (f"stream delete {stream}", f"$JS.API.STREAM.DELETE.{stream}", b""),
            (f"msg delete {stream}", f"$JS.API.STREAM.MSG.DELETE.{stream}", seq),
            (f"consumer list {stream}", f"$JS.API.CONSUMER.LIST.{stream}", b"{}"),
            (f"consumer names {stream}", f"$JS.API.CONSUMER.NAMES.{stream}", b"{}"),
            (f"durable create {stream}", f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{mine}", b""),
            (
                f"{VICTIM}'s consumer info {stream}",
                f"$JS.API.CONSUMER.INFO.{stream}.{VICTIM}_0",
                b"",
            ),
            (
                f"{VICTIM}'s consumer delete {stream}",
                f"$JS.API.CONSUMER.DELETE.{stream}.{VICTIM}_0",
                b"",
            ),
        ]
    out += [
        ("stream names", "$JS.API.STREAM.NAMES", b"{}"),
        ("stream list", "$JS.API.STREAM.LIST", b"{}"),
        ("results bucket get", f"$JS.API.DIRECT.GET.KV_{RESULTS_KV}.{kv_key}", b""),
        # its own filter in the subject, acme's in the body: the server's own check
        (
            "own subject filter, acme's in the body",
            f"$JS.API.CONSUMER.CREATE.{MODELS}.{mine}.{own_art}",
            create(MODELS, art),
        ),
        (
            "own subject filter, no filter in the body",
            f"$JS.API.CONSUMER.CREATE.{MODELS}.{mine}.{own_art}",
            create(MODELS, None),
        ),
    ]
    return out


def _writes(rid: str) -> list[tuple[str, str, bytes]]:
    subjects = [
        models.chunk(VICTIM, "upload", rid, 0),
        models.chunk(VICTIM, "upload", rid, 1),
        models.chunk(VICTIM, "artifact", rid, 0),
        models.chunk(HOSTILE, "artifact", rid, 0),  # its own artifacts are the compiler's
        graph.subject(VICTIM, "request"),
        graph.subject(VICTIM, "result"),
        graph.subject(HOSTILE, "result"),
        dlq.subject("graph-compiler"),
        f"$KV.{RESULTS_KV}.{VICTIM}.{rid}",
    ]
    return [(f"publish {s}", s, b"x") for s in subjects]


_SUBSCRIPTIONS = [
    f"seedance.models.{VICTIM}.artifact.>",
    f"seedance.models.{VICTIM}.upload.>",
    graph.subject(VICTIM, "result"),
    "seedance.models.>",
    "seedance.graph.>",
    dlq.subject("graph-compiler"),
]


async def _probe(m: _Mallory, what: str, subject: str, body: bytes) -> str | None:
    """None when the server refused it (a permissions violation naming the subject, or an
    error reply); else what came back, as an effect."""
    reply = asyncio.ensure_future(m.nc.request(subject, body, timeout=PROBE_TIMEOUT_S))
    try:
        await eventually(
            lambda: m.violated(subject) or reply.done(), PROBE_TIMEOUT_S + 1, what=what
        )
    except TimeoutError:
        return f"mallory's {what} was neither refused nor answered"
    if m.violated(subject):
        return None
    try:
        data = reply.result().data
    except Exception as exc:  # a time-out or no responders: not the server's refusal
        return f"mallory's {what} was not refused by the server ({type(exc).__name__})"
    finally:
        reply.cancel()
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("error"):
        return None  # the server refused it (an error reply)
    return f"mallory's {what} succeeded: {data[:160]!r}"


async def _subscribe(m: _Mallory, subject: str) -> str | None:
    sub = await m.nc.subscribe(subject)
    try:
        await m.nc.flush()
        await eventually(lambda: m.violated(subject), PROBE_TIMEOUT_S, what=f"sub {subject}")
    except TimeoutError:
        return f"mallory's subscription to {subject} was not refused"
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return None


# --- mallory's requests to the compiler -------------------------------------------------------


def _request(tenant: str, rid: str, sha256: str, chunks: int) -> CompileRequest:
    return chunked_request(
        tenant,
        rid,
        model_name="chaos-mlp",
        chunks=chunks,
        sha256=sha256,
        policy=FP32,
        at=datetime.now(UTC),
    )


async def _bad_requests(m: _Mallory, acme_rid: str, model: bytes) -> dict[str, str]:
    """Publish mallory's bad uploads and requests; request id -> what it is (each must be
    answered and dead-lettered)."""
    js = m.nc.jetstream()
    size = chunk_bytes(m.nc.max_payload)
    most = -(-int(MAX_MODEL_MIB * 1024**2) // size)
    sha = hashlib.sha256(model).hexdigest()
    other = hashlib.sha256(model + b"!").hexdigest()
    cases: list[tuple[str, list[bytes], int, str, int]] = [
        # what, chunks uploaded, model_chunks, sha256, requests
        ("an empty first chunk", [b"", model], 2, sha, 1),
        ("a short first chunk", [model[:10], model[10:]], 2, sha, 1),
        ("more chunks than the cap", [model], 10**6, sha, 1),
        ("a sha256 mismatch", [model], 1, other, 1),
        ("a model over the cap", [b"\x01" * size] * most, most, other, 1),
    ]
    named: dict[str, str] = {}
    for what, chunks, count, digest, times in cases:
        rid = uuid.uuid4().hex
        for n, data in enumerate(chunks):
            await js.publish(models.chunk(HOSTILE, "upload", rid, n), data)
        for _ in range(times):
            await js.publish(
                graph.subject(HOSTILE, "request"), encode(_request(HOSTILE, rid, digest, count))
            )
        named[rid] = what
    # acme's request id on its own subjects: mallory has no upload under it
    await js.publish(graph.subject(HOSTILE, "request"), encode(_request(HOSTILE, acme_rid, sha, 1)))
    named[acme_rid] = "acme's request id"
    # the stall flood: empty chunks by core publish, the request for them twice (the review's
    # one per replica), within the count cap (2) and over it
    for count in (most, FLOOD_CHUNKS):
        rid = uuid.uuid4().hex
        for n in range(FLOOD_CHUNKS):
            await m.nc.publish(models.chunk(HOSTILE, "upload", rid, n), b"")
        await m.nc.flush()
        for _ in range(2):
            event = _request(HOSTILE, rid, hashlib.sha256(b"").hexdigest(), count)
            await js.publish(graph.subject(HOSTILE, "request"), encode(event))
        named[rid] = f"the stall flood ({FLOOD_CHUNKS} empty chunks, model_chunks={count}, twice)"
    return named


async def _forged_tenant(m: _Mallory, acme_rid: str, model: bytes) -> int:
    """The request naming acme (its request id, its model's digest) on mallory's subject: the
    stream sequence, whose letter must say tenant mismatch."""
    event = _request(VICTIM, acme_rid, hashlib.sha256(model).hexdigest(), 1)
    ack = await m.nc.jetstream().publish(graph.subject(HOSTILE, "request"), encode(event))
    return int(ack.seq)


async def _answers(admin: Bus, named: dict[str, str], forged_seq: int) -> tuple[int, list[str]]:
    """How many of mallory's bad requests were answered and dead-lettered; effects for the rest."""
    results = await read_stream(admin, GRAPH, subject=graph.subject(HOSTILE, "result"))
    answered = {r.request_id for r in (decode(m.data, CompileResult) for m in results) if not r.ok}
    letters = [decode(m.data, DeadLetter) for m in await read_stream(admin, DLQ)]
    lettered = {
        msgspec.json.decode(d.payload).get("request_id")
        for d in letters
        if d.error_kind == "InvalidUpload"
    }
    effects: list[str] = []
    refused = 0
    for rid, what in named.items():
        if rid not in answered:
            effects.append(f"mallory's request with {what} got no ok=False answer")
        if rid not in lettered:
            effects.append(f"mallory's request with {what} was not dead-lettered")
        refused += rid in answered and rid in lettered
    asked = graph.subject(HOSTILE, "request")
    if any(
        d.stream_seq == forged_seq and d.subject == asked and d.error_kind == "tenant_mismatch"
        for d in letters
    ):
        refused += 1
    else:
        effects.append("mallory's request saying tenant acme was not dead-lettered")
    return refused, effects


def _chosen(result: CompileResult) -> str:
    timings = result.report.timings if result.report else ()
    return ",".join(f"{t.candidate}@{t.profile}" for t in timings if t.chosen) or "untimed"


async def compile_cross_tenant(s: GraphStage, args: argparse.Namespace) -> ClassOutcome:
    out = ClassOutcome("compile-cross-tenant")
    model = small_model()
    alone = await s.acme.compile_model(
        VICTIM, "chaos-mlp", model, FP32, timeout_s=COMPILE_TIMEOUT_S
    )
    if not alone.ok:
        out.effects.append(f"acme's compile without mallory failed: {alone.error}")
        return out
    baseline = hashlib.sha256(await s.acme.fetch_artifact(alone)).hexdigest()
    acme_rid = uuid.uuid4().hex
    m = _Mallory()
    await m.connect(s.url, s.passwords[tenant_user_name(HOSTILE)])
    try:
        named = await _bad_requests(m, acme_rid, model)
        forged_seq = await _forged_tenant(m, acme_rid, model)
        honest = asyncio.create_task(
            s.acme.compile_model(
                VICTIM, "chaos-mlp", model, FP32, request_id=acme_rid, timeout_s=COMPILE_TIMEOUT_S
            )
        )
        probes = _reads(acme_rid) + _writes(acme_rid)
        found = await asyncio.gather(
            *(_probe(m, *p) for p in probes), *(_subscribe(m, sub) for sub in _SUBSCRIPTIONS)
        )
        out.sent = len(found) + sum(1 for _ in named) + 1
        out.refused = sum(1 for f in found if f is None)
        out.effects += [f for f in found if f is not None]
        try:
            result = await honest
        except Exception as exc:
            out.effects.append(f"acme's compile with mallory failed: {exc!r}")
        else:
            if not result.ok:
                out.effects.append(f"acme's compile with mallory failed: {result.error}")
            else:
                got = hashlib.sha256(await s.acme.fetch_artifact(result)).hexdigest()
                if got != baseline:
                    out.effects.append(
                        f"acme's artifact with mallory has sha256 {got}, alone {baseline} "
                        f"(chosen: {_chosen(result)}, alone {_chosen(alone)})"
                    )
    finally:
        await m.nc.close()
    await wait_consumer_settled(s.admin, GRAPH, "compiler-requests", timeout_s=120)
    answered, effects = await _answers(s.admin, named, forged_seq)
    out.refused += answered
    out.effects += effects
    return out


register(
    AttackClass(
        "compile-cross-tenant",
        "graph",
        compile_cross_tenant,
        "mallory reads and writes acme's upload, artifact, result and dead-letter subjects by "
        "every verb, names acme's request id, sends malformed uploads and the stall flood while "
        "acme compiles: every read and write refused by the server, every bad request answered "
        "and dead-lettered, acme's artifact the same as without mallory",
    )
)
